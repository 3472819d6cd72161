//! Says what an LTX-2 file is, from its safetensors header only, and builds the transformer's video stream from
//! it: the official single files (`ltx-2-19b-*.safetensors`, `ltx-2.3-22b-*.safetensors`: the transformer under
//! `model.diffusion_model.` beside the text connectors, the video and audio VAEs and the vocoder, the config in
//! the `config` metadata entry; ComfyUI loads these same files, and a transformer-only file keeps the keys with or
//! without the prefix), their FP8 versions (float8_e4m3fn weights with a per-tensor `weight_scale`, or none), and
//! diffusers' `LTX2VideoTransformer3DModel` (its own names, sizes from `config.json`). Which release a file is
//! comes from its config, else from its keys (LTX-2.3's head gates and prompt AdaLN, LTX-2's caption projection).
//! Gemma 3 12B files, the text encoder of both releases, are named here too.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};

use super::config::{Ltx2Config, Ltx2Version};
use super::layout::{DiffusersSource, Layout};
use super::transformer::Ltx2Transformer;
use crate::checkpoint::{entries, read_shards, Tally};
use crate::wan::weights::{read_header, write_size_lines, MappedTensors, ModelFormatError};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::vb::{TensorSource, Vb};

/// Width of Gemma 3 12B's hidden state (the connectors' input, per layer).
const GEMMA3_12B_WIDTH: usize = 3840;
/// Gemma 3's vocabulary.
const GEMMA3_VOCAB: usize = 262_208;

/// Why a path is not an LTX-2 transformer Framesmith can use.
#[derive(Debug, thiserror::Error)]
pub enum Ltx2FormatError {
    /// The file could not be read as safetensors.
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// Not an LTX-2 file: other readers may name it.
    #[error("this is not an LTX-2 transformer: {}", path.display())]
    NotLtx2 { path: PathBuf },

    /// An LTX-2 transformer whose sizes cannot be known (no embedded config and not a released size).
    #[error("this LTX-2 transformer carries no config and its sizes are not a release's; use the official \
             ltx-2-19b-* or ltx-2.3-22b-* file: {}", path.display())]
    NoConfig { path: PathBuf },

    /// A transformer whose tensors do not make the model.
    #[error("cannot build the LTX-2 transformer from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// Whether `err` only says the path is something else (so a caller trying other families goes on).
pub fn is_unrecognised(err: &Ltx2FormatError) -> bool {
    matches!(
        err,
        Ltx2FormatError::NotLtx2 { .. } | Ltx2FormatError::File(_)
    )
}

/// What an LTX-2 file is.
#[derive(Debug, Clone)]
pub struct Ltx2File {
    pub path: PathBuf,
    pub version: Ltx2Version,
    /// The transformer's sizes and switches (embedded, or the release's when only the keys tell it).
    pub config: Ltx2Config,
    /// Whether the config came from the file (`false`: the release's, from the keys).
    pub embedded_config: bool,
    pub layout: Layout,
    /// The release's `model_version` metadata (`2.3.0`), when present.
    pub model_version: Option<String>,
    /// What else the file holds (`video VAE`, `audio VAE`, `vocoder`, `text connectors`).
    pub parts: Vec<&'static str>,
    /// Whether the block weights are stored as float8_e4m3fn, and with per-tensor `weight_scale`s.
    pub fp8: Option<bool>,
    tally: Tally,
    file_bytes: u64,
}

/// What a safetensors file holds besides the transformer, by its top-level prefixes.
fn parts(names: &[&str]) -> Vec<&'static str> {
    let has = |p: &str| names.iter().any(|n| n.starts_with(p));
    let mut out = Vec::new();
    if has("model.diffusion_model.video_embeddings_connector.") || has("text_embedding_projection.")
    {
        out.push("text connectors");
    }
    for (prefix, part) in [
        ("vae.", "video VAE"),
        ("audio_vae.", "audio VAE"),
        ("vocoder.", "vocoder"),
    ] {
        if has(prefix) {
            out.push(part);
        }
    }
    out
}

/// The layout of the transformer's keys, if the names are LTX-2's.
fn layout_of(names: &[&str]) -> Option<Layout> {
    let has = |n: &str| names.contains(&n);
    for prefix in ["model.diffusion_model.", "diffusion_model.", ""] {
        let key = |k: &str| format!("{prefix}{k}");
        // The audio stream tells LTX-2 from LTX-Video 0.9, whose ltx-core names are otherwise the same.
        if has(&key("patchify_proj.weight"))
            && has(&key("audio_patchify_proj.weight"))
            && has(&key("adaln_single.linear.weight"))
            && has(&key("transformer_blocks.0.attn1.q_norm.weight"))
        {
            return Some(Layout::LtxCore {
                prefix: prefix.to_string(),
            });
        }
    }
    (has("proj_in.weight")
        && has("audio_proj_in.weight")
        && has("time_embed.linear.weight")
        && has("transformer_blocks.0.attn1.norm_q.weight"))
    .then_some(Layout::Diffusers)
}

/// The release the keys show: LTX-2.3's head gates or prompt AdaLN, else LTX-2.
fn version_from_keys(names: &[&str], layout: &Layout) -> Ltx2Version {
    let gate = layout.stored("transformer_blocks.0.attn1.to_gate_logits.weight");
    let prompt = layout.stored("prompt_adaln_single.linear.weight");
    if names.iter().any(|n| *n == gate || *n == prompt) {
        Ltx2Version::Ltx23
    } else {
        Ltx2Version::Ltx2
    }
}

/// Says what the LTX-2 file at `path` is (a file, or a diffusers `transformer/` folder).
pub fn identify(path: &Path) -> Result<Ltx2File, Ltx2FormatError> {
    let (files, metadata, diffusers_config) = super::layout::files_of(path)?;
    let (tensors, file_bytes) = read_shards(&files)?;
    let tally = Tally::of(tensors.iter().map(|(_, t)| t));
    let names: Vec<&str> = tensors.iter().map(|(_, t)| t.name.as_str()).collect();
    let not = || Ltx2FormatError::NotLtx2 {
        path: path.to_path_buf(),
    };
    let layout = layout_of(&names).ok_or_else(not)?;
    let build = |problem: String| Ltx2FormatError::Build {
        problem,
        path: path.to_path_buf(),
    };
    let embedded = match (&layout, &diffusers_config) {
        (Layout::Diffusers, Some(json)) => {
            Some(Ltx2Config::from_diffusers_json(json).map_err(|e| build(e.to_string()))?)
        }
        _ => Ltx2Config::from_metadata(&metadata)
            .transpose()
            .map_err(|e| build(format!("the embedded config does not parse: {e}")))?
            .map(|(cfg, _)| cfg),
    };
    let embedded_config = embedded.is_some();
    let version = match &embedded {
        Some(cfg) => cfg.version(),
        None => version_from_keys(&names, &layout),
    };
    let config = match embedded {
        Some(cfg) => cfg,
        None => released(version, &names, &layout).ok_or_else(|| Ltx2FormatError::NoConfig {
            path: path.to_path_buf(),
        })?,
    };
    let q = layout.stored("transformer_blocks.0.attn1.to_q.weight");
    let scale = format!("{q}_scale");
    let q_dtype = tensors
        .iter()
        .find(|(_, t)| t.name == q)
        .map(|(_, t)| t.dtype.as_str());
    let fp8 = (q_dtype == Some("F8_E4M3")).then(|| names.contains(&scale.as_str()));
    Ok(Ltx2File {
        path: path.to_path_buf(),
        version,
        config,
        embedded_config,
        layout,
        model_version: metadata.get("model_version").cloned(),
        parts: parts(&names),
        fp8,
        tally,
        file_bytes,
    })
}

/// The release's config when the keys show its size (48 blocks of width 4096).
fn released(version: Ltx2Version, names: &[&str], layout: &Layout) -> Option<Ltx2Config> {
    let last = layout.stored("transformer_blocks.47.attn1.to_q.weight");
    let past = layout.stored("transformer_blocks.48.attn1.to_q.weight");
    if !names.contains(&last.as_str()) || names.contains(&past.as_str()) {
        return None;
    }
    Some(match version {
        Ltx2Version::Ltx2 => Ltx2Config::ltx2_19b(),
        Ltx2Version::Ltx23 => Ltx2Config::ltx23_22b(),
    })
}

impl Ltx2File {
    /// The model, specifically.
    pub fn title(&self) -> String {
        let size = if self.config.inner_dim() == 4096 && self.config.num_layers == 48 {
            match self.version {
                Ltx2Version::Ltx2 => " (19B)",
                Ltx2Version::Ltx23 => " (22B)",
            }
        } else {
            ""
        };
        format!("{}{size} audio-video transformer", self.version.name())
    }
}

impl fmt::Display for Ltx2File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.path.display())?;
        writeln!(f, "  {:<11} {}", "model", self.title())?;
        writeln!(f, "  {:<11} {}", "layout", self.layout.label())?;
        let c = &self.config;
        let source = if self.embedded_config {
            "embedded config"
        } else {
            "the release's sizes (no config in the file)"
        };
        writeln!(
            f,
            "  {:<11} {} blocks, {} heads × {}, gated attention {}, cross-attention AdaLN {} ({source})",
            "sizes", c.num_layers, c.num_attention_heads, c.attention_head_dim,
            if c.apply_gated_attention { "on" } else { "off" },
            if c.cross_attention_adaln { "on" } else { "off" },
        )?;
        if let Some(v) = &self.model_version {
            writeln!(f, "  {:<11} {v}", "version")?;
        }
        if !self.parts.is_empty() {
            writeln!(f, "  {:<11} {}", "also holds", self.parts.join(", "))?;
        }
        match self.fp8 {
            Some(true) => writeln!(
                f,
                "  {:<11} float8_e4m3fn blocks with per-tensor weight_scale",
                "fp8"
            )?,
            Some(false) => writeln!(f, "  {:<11} float8_e4m3fn blocks without scales", "fp8")?,
            None => {}
        }
        write_size_lines(
            f,
            &self.tally.dtypes,
            self.tally.parameter_count,
            self.file_bytes,
        )
    }
}

/// Builds the video stream of the transformer at `path` in `dtype` on `device`, its block linears kept in FP8
/// with `fp8` set (FP8 files stay FP8; dense files are quantised), else dense.
pub fn load(
    path: &Path,
    dtype: DType,
    device: &Device,
    fp8: Option<Fp8Scale>,
) -> Result<(Ltx2File, Ltx2Transformer), Ltx2FormatError> {
    load_streamed(
        path,
        (dtype, device),
        (fp8, false),
        (&[], &OffloadOptions::default()),
    )
}

/// [`load`] with FP8 products (`fp8.1`: FP8 matmuls) and the blocks in `streamed` kept in host RAM and streamed
/// through GPU slots as `offload` says.
pub fn load_streamed(
    path: &Path,
    (dtype, device): (DType, &Device),
    (fp8, fp8_products): (Option<Fp8Scale>, bool),
    (streamed, offload): (&[usize], &OffloadOptions),
) -> Result<(Ltx2File, Ltx2Transformer), Ltx2FormatError> {
    load_streamed_av(
        path,
        (dtype, device),
        (fp8, fp8_products),
        (streamed, offload),
        false,
    )
}

/// [`load_streamed`] reading the audio stream and the audio-video cross-attentions too when `audio` (joint
/// audio-video training).
pub fn load_streamed_av(
    path: &Path,
    (dtype, device): (DType, &Device),
    (fp8, fp8_products): (Option<Fp8Scale>, bool),
    (streamed, offload): (&[usize], &OffloadOptions),
    audio: bool,
) -> Result<(Ltx2File, Ltx2Transformer), Ltx2FormatError> {
    let file = identify(path)?;
    let (files, _, _) = super::layout::files_of(path)?;
    let (tensors, _) = read_shards(&files)?;
    let listed = entries(tensors.iter().map(|(i, t)| (*i, t)), None);
    let mapped = MappedTensors::open(&files, &listed)?;
    let source: Arc<dyn TensorSource> = match &file.layout {
        Layout::Diffusers => Arc::new(DiffusersSource::new(Arc::new(mapped))),
        Layout::LtxCore { .. } => Arc::new(mapped),
    };
    let vb = Vb::from_source(source, dtype, device)
        .with_fp8(fp8)
        .with_fp8_products(fp8_products);
    let vb = match &file.layout {
        Layout::LtxCore { prefix } if !prefix.is_empty() => vb.pp(prefix.trim_end_matches('.')),
        _ => vb,
    };
    let model = Ltx2Transformer::load_streamed_av(&vb, &file.config, streamed, offload, audio)
        .map_err(|e| Ltx2FormatError::Build {
            problem: e.to_string(),
            path: path.to_path_buf(),
        })?;
    Ok((file, model))
}

/// Whether the safetensors file at `path` is Gemma 3 12B (LTX-2's text encoder, as the official Gemma folders'
/// shards or ComfyUI's single `gemma_3_12B_it*.safetensors` hold it): a token embedding of Gemma 3's vocabulary
/// and width 3840 (the shard that holds it).
pub fn is_gemma3_12b(path: &Path) -> bool {
    read_header(path).is_ok_and(|h| {
        h.tensors.iter().any(|t| {
            t.name.ends_with("embed_tokens.weight") && t.shape == [GEMMA3_VOCAB, GEMMA3_12B_WIDTH]
        })
    })
}

/// The tensors joint audio-video training reads besides [`video_stream_shapes`], by ltx-core's names with their
/// shapes: the audio stream's embeddings (`audio_adaln_single`, LTX-2.3's `audio_prompt_adaln_single`, LTX-2's
/// `audio_caption_projection`), the audio-video cross-attentions' AdaLNs, each block's audio stream,
/// cross-attentions and their tables, and the audio head.
pub fn audio_stream_shapes(cfg: &Ltx2Config) -> Vec<(String, Vec<usize>)> {
    let (dim, adim) = (cfg.inner_dim(), cfg.audio_inner_dim());
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let mut linear = |name: String, i: usize, o: usize| {
        out.push((format!("{name}.weight"), vec![o, i]));
        out.push((format!("{name}.bias"), vec![o]));
    };
    let adaln = |linear: &mut dyn FnMut(String, usize, usize), name: &str, w: usize, k: usize| {
        linear(format!("{name}.emb.timestep_embedder.linear_1"), 256, w);
        linear(format!("{name}.emb.timestep_embedder.linear_2"), w, w);
        linear(format!("{name}.linear"), w, k * w);
    };
    adaln(
        &mut linear,
        "audio_adaln_single",
        adim,
        cfg.adaln_coefficient(),
    );
    if cfg.cross_attention_adaln && cfg.use_prompt_adaln_single {
        adaln(&mut linear, "audio_prompt_adaln_single", adim, 2);
    }
    adaln(&mut linear, "av_ca_video_scale_shift_adaln_single", dim, 4);
    adaln(&mut linear, "av_ca_audio_scale_shift_adaln_single", adim, 4);
    adaln(&mut linear, "av_ca_a2v_gate_adaln_single", dim, 1);
    adaln(&mut linear, "av_ca_v2a_gate_adaln_single", adim, 1);
    if let (true, Some(channels)) = (cfg.has_caption_projection(), cfg.caption_channels) {
        linear("audio_caption_projection.linear_1".into(), channels, adim);
        linear("audio_caption_projection.linear_2".into(), adim, adim);
    }
    let heads = cfg.audio_num_attention_heads;
    let mut norms = Vec::new();
    for i in 0..cfg.num_layers {
        let b = format!("transformer_blocks.{i}");
        for (attn, query, ctx) in [
            ("audio_attn1", adim, adim),
            ("audio_attn2", adim, cfg.audio_cross_attention_dim),
            ("audio_to_video_attn", dim, adim),
            ("video_to_audio_attn", adim, dim),
        ] {
            linear(format!("{b}.{attn}.to_q"), query, adim);
            linear(format!("{b}.{attn}.to_k"), ctx, adim);
            linear(format!("{b}.{attn}.to_v"), ctx, adim);
            linear(format!("{b}.{attn}.to_out.0"), adim, query);
            if cfg.apply_gated_attention {
                linear(format!("{b}.{attn}.to_gate_logits"), query, heads);
            }
            norms.push((format!("{b}.{attn}.q_norm.weight"), vec![adim]));
            norms.push((format!("{b}.{attn}.k_norm.weight"), vec![adim]));
        }
        linear(format!("{b}.audio_ff.net.0.proj"), adim, 4 * adim);
        linear(format!("{b}.audio_ff.net.2"), 4 * adim, adim);
        norms.push((
            format!("{b}.audio_scale_shift_table"),
            vec![cfg.adaln_coefficient(), adim],
        ));
        if cfg.cross_attention_adaln {
            norms.push((format!("{b}.audio_prompt_scale_shift_table"), vec![2, adim]));
        }
        norms.push((format!("{b}.scale_shift_table_a2v_ca_video"), vec![5, dim]));
        norms.push((format!("{b}.scale_shift_table_a2v_ca_audio"), vec![5, adim]));
    }
    linear("audio_proj_out".into(), adim, cfg.audio_out_channels);
    if !cfg.audio_ff_bias {
        out.retain(|(name, _)| !(name.contains(".audio_ff.net.") && name.ends_with(".bias")));
    }
    out.extend(norms);
    out.push(("audio_scale_shift_table".into(), vec![2, adim]));
    out
}

/// The transformer's tensors a text-to-video run reads, by ltx-core's names (no `model.diffusion_model.` prefix)
/// with their shapes: the video stream (embeddings, blocks, head) and `audio_patchify_proj`, which tells an LTX-2
/// file from LTX-Video's; the rest of the audio stream and the audio-video cross-attentions are never read.
pub fn video_stream_shapes(cfg: &Ltx2Config) -> Vec<(String, Vec<usize>)> {
    let dim = cfg.inner_dim();
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let mut linear = |name: String, i: usize, o: usize| {
        out.push((format!("{name}.weight"), vec![o, i]));
        out.push((format!("{name}.bias"), vec![o]));
    };
    linear("patchify_proj".into(), cfg.in_channels, dim);
    let audio_dim = cfg.audio_num_attention_heads * cfg.audio_attention_head_dim;
    linear(
        "audio_patchify_proj".into(),
        cfg.audio_in_channels,
        audio_dim,
    );
    let adaln = |linear: &mut dyn FnMut(String, usize, usize), name: &str, k: usize| {
        linear(format!("{name}.emb.timestep_embedder.linear_1"), 256, dim);
        linear(format!("{name}.emb.timestep_embedder.linear_2"), dim, dim);
        linear(format!("{name}.linear"), dim, k * dim);
    };
    adaln(&mut linear, "adaln_single", cfg.adaln_coefficient());
    if cfg.cross_attention_adaln && cfg.use_prompt_adaln_single {
        adaln(&mut linear, "prompt_adaln_single", 2);
    }
    if let (true, Some(channels)) = (cfg.has_caption_projection(), cfg.caption_channels) {
        linear("caption_projection.linear_1".into(), channels, dim);
        linear("caption_projection.linear_2".into(), dim, dim);
    }
    for i in 0..cfg.num_layers {
        let b = format!("transformer_blocks.{i}");
        for (attn, ctx) in [("attn1", dim), ("attn2", cfg.cross_attention_dim)] {
            linear(format!("{b}.{attn}.to_q"), dim, dim);
            linear(format!("{b}.{attn}.to_k"), ctx, dim);
            linear(format!("{b}.{attn}.to_v"), ctx, dim);
            linear(format!("{b}.{attn}.to_out.0"), dim, dim);
            if cfg.apply_gated_attention {
                linear(
                    format!("{b}.{attn}.to_gate_logits"),
                    dim,
                    cfg.num_attention_heads,
                );
            }
        }
        linear(format!("{b}.ff.net.0.proj"), dim, 4 * dim);
        linear(format!("{b}.ff.net.2"), 4 * dim, dim);
    }
    linear("proj_out".into(), dim, cfg.out_channels);
    if !cfg.ff_bias {
        out.retain(|(name, _)| !(name.contains(".ff.net.") && name.ends_with(".bias")));
    }
    for i in 0..cfg.num_layers {
        let b = format!("transformer_blocks.{i}");
        out.push((format!("{b}.attn1.q_norm.weight"), vec![dim]));
        out.push((format!("{b}.attn1.k_norm.weight"), vec![dim]));
        out.push((format!("{b}.attn2.q_norm.weight"), vec![dim]));
        out.push((format!("{b}.attn2.k_norm.weight"), vec![dim]));
        out.push((
            format!("{b}.scale_shift_table"),
            vec![cfg.adaln_coefficient(), dim],
        ));
        if cfg.cross_attention_adaln {
            out.push((format!("{b}.prompt_scale_shift_table"), vec![2, dim]));
        }
    }
    out.push(("scale_shift_table".into(), vec![2, dim]));
    out
}

#[cfg(test)]
mod tests;
