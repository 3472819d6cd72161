//! A tiny LTX-2.3 for CPU tests: the video stream of the official single-file layout (`model.diffusion_model.`,
//! the config in the `config` metadata entry as the release embeds it) at small sizes with seeded random weights,
//! and a video dataset cached in the `_ltx2` format of musubi-tuner's LTX-2 branch (written by the data crate's
//! writers); a whole tiny checkpoint as the release is one (the transformer beside the text fixture's connector
//! and the VAE fixture's video VAE, one `config` entry for all three) with the text fixture's Gemma 3; and an
//! audio-video one (the transformer's audio stream, an audio connector, the audio fixture's audio VAE and vocoder).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use framesmith_data::family::ltx2::cache::{
    ltx2_audio_cache_name, ltx2_latent_cache_name, ltx2_text_cache_name, write_ltx2_audio_cache,
    write_ltx2_latent_cache, write_ltx2_text_cache, Ltx2AudioCache, Ltx2TextCache,
};
use framesmith_data::frames::FrameWindow;
use framesmith_models::ltx2::config::metadata_config;
use framesmith_models::ltx2::weights::{audio_stream_shapes, video_stream_shapes};
use framesmith_models::ltx2::Ltx2Config;
use framesmith_nn::init::randn;

use crate::family::testkit::run::cached_video_dataset_toml;

/// The tiny transformer's sizes: LTX-2.3's switches (gated attention, cross-attention AdaLN) with 2 blocks of
/// width 16 (2 heads of 8), 4 latent channels and a text context of the model width.
pub fn tiny_config() -> Ltx2Config {
    let mut cfg = Ltx2Config::ltx23_22b();
    cfg.num_attention_heads = 2;
    cfg.attention_head_dim = 8;
    cfg.in_channels = 4;
    cfg.out_channels = 4;
    cfg.num_layers = 2;
    cfg.cross_attention_dim = 16;
    cfg.audio_num_attention_heads = 2;
    cfg.audio_attention_head_dim = 4;
    // Audio latents of 2 channels × 2 mel bins a frame.
    cfg.audio_in_channels = 4;
    cfg.audio_out_channels = 4;
    cfg.audio_cross_attention_dim = 8;
    cfg
}

/// The tiny transformer written into `dir` as one safetensors file in the official layout (seeded: the same
/// weights every time); norm scales are ones.
pub fn tiny_dit(dir: &Path) -> anyhow::Result<PathBuf> {
    tiny_dit_with(dir, false)
}

/// [`tiny_dit`] with the audio stream and the audio-video cross-attentions too when `audio` (as the releases
/// hold them).
pub fn tiny_dit_with(dir: &Path, audio: bool) -> anyhow::Result<PathBuf> {
    let tensors = dit_tensors(&tiny_config(), audio)?;
    let metadata = HashMap::from([("config".to_string(), metadata_config(&tiny_config()))]);
    std::fs::create_dir_all(dir)?;
    let path = dir.join("ltx-2.3-tiny.safetensors");
    write_f32(&path, tensors, metadata)?;
    Ok(path)
}

/// The LTX-2 text fixture's LTX-2.3 case (its Gemma 3 file and its checkpoint's text parts).
pub fn text_case_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../framesmith-models/tests/fixtures/ltx2_text/ltx23")
}

/// The text fixture's Gemma 3 of `path`, any size, in `dtype` on `device` (not the 12B size `load_gemma`
/// requires).
pub fn tiny_gemma(
    path: &Path,
    dtype: DType,
    device: &Device,
    _also: u64,
) -> anyhow::Result<framesmith_models::gemma3::Gemma3Text> {
    let options = framesmith_models::gemma3::LoadOptions {
        dtype,
        any_size: true,
        ..framesmith_models::gemma3::LoadOptions::new(device)
    };
    Ok(framesmith_models::gemma3::load_text_model(path, &options)?.1)
}

/// A tiny whole LTX-2.3 checkpoint in `dir`, as the releases are one file: a transformer whose text width is the
/// text fixture's connector's (3 heads of 8), that connector and feature extractor, and the VAE fixture's video
/// VAE (4 latent channels), under their released names with one `config` entry holding all three sections.
pub fn tiny_checkpoint(dir: &Path) -> anyhow::Result<PathBuf> {
    checkpoint_with(dir, false)
}

/// The transformer config of [`tiny_checkpoint_av`]: [`tiny_checkpoint`]'s with the audio fixture's audio latents
/// (1 channel × 16 mel bins a frame).
pub fn tiny_checkpoint_config(audio: bool) -> Ltx2Config {
    let mut cfg = tiny_config();
    cfg.num_attention_heads = 3;
    cfg.cross_attention_dim = 24;
    if audio {
        // As many audio heads as video heads (ltx-core's requirement), of 4.
        cfg.audio_num_attention_heads = 3;
        cfg.audio_cross_attention_dim = 12;
        cfg.audio_in_channels = 16;
        cfg.audio_out_channels = 16;
    }
    cfg
}

/// [`tiny_checkpoint`] as the audio-video releases are: with the transformer's audio stream and the audio-video
/// cross-attentions, an audio projection and connector of its audio width (3 heads of 4, seeded), and the audio
/// fixture's LTX-2.3 audio VAE and vocoder (`audio_vae.*`, `vocoder.*`, their `config` sections).
pub fn tiny_checkpoint_av(dir: &Path) -> anyhow::Result<PathBuf> {
    checkpoint_with(dir, true)
}

fn checkpoint_with(dir: &Path, audio: bool) -> anyhow::Result<PathBuf> {
    let cfg = tiny_checkpoint_config(audio);
    let mut tensors = dit_tensors(&cfg, audio)?;
    let fixtures =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../framesmith-models/tests/fixtures");
    let text_file = text_case_dir().join("ltx_text.safetensors");
    let vae_file = fixtures.join("ltx2/vae_ltx23/weights.safetensors");
    let audio_file = fixtures.join("ltx2/audio_ltx23/weights.safetensors");
    let mut config: serde_json::Value = serde_json::from_str(&metadata_config(&cfg))?;
    let mut sources = vec![(&text_file, "transformer"), (&vae_file, "vae")];
    if audio {
        sources.push((&audio_file, "audio_vae"));
        sources.push((&audio_file, "vocoder"));
    }
    for (file, section) in sources {
        let loaded = candle_core::safetensors::load(file, &Device::Cpu)?;
        // A video-only checkpoint holds no audio connector.
        for (name, t) in loaded {
            if audio || !name.contains("audio_embeddings_connector") {
                tensors.insert(name, t.to_dtype(DType::F32)?);
            }
        }
        let bytes = std::fs::read(file)?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)?;
        let text = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("config").cloned())
            .ok_or_else(|| anyhow::anyhow!("no config in {}", file.display()))?;
        let theirs: serde_json::Value = serde_json::from_str(&text)?;
        let (Some(mine), Some(their)) = (
            config.as_object_mut(),
            theirs.get(section).and_then(|v| v.as_object()),
        ) else {
            anyhow::bail!("no {section} section in {}", file.display());
        };
        let entry = mine.entry(section).or_insert_with(|| serde_json::json!({}));
        if let Some(entry) = entry.as_object_mut() {
            for (k, v) in their {
                // The transformer's own keys win over the text file's copy of them.
                entry.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    if audio {
        if let Some(t) = config
            .get_mut("transformer")
            .and_then(|t| t.as_object_mut())
        {
            t.insert("audio_connector_num_attention_heads".into(), 3.into());
            t.insert("audio_connector_attention_head_dim".into(), 4.into());
        }
        audio_text_side(&mut tensors, &config)?;
    }
    let metadata = HashMap::from([("config".to_string(), config.to_string())]);
    std::fs::create_dir_all(dir)?;
    let name = if audio {
        "ltx-2.3-tiny-av-dev.safetensors"
    } else {
        "ltx-2.3-tiny-dev.safetensors"
    };
    let path = dir.join(name);
    write_f32(&path, tensors, metadata)?;
    Ok(path)
}

/// Seeded weights of the audio projection and connector `config`'s transformer section describes, into `tensors`
/// (norm scales ones; the projection for the text fixture's Gemma states, 64 values a token).
fn audio_text_side(
    tensors: &mut HashMap<String, Tensor>,
    config: &serde_json::Value,
) -> anyhow::Result<()> {
    let text = framesmith_models::ltx2::text::Ltx2TextConfig::from_transformer_json(
        &config["transformer"],
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let rng = &mut StdRng::seed_from_u64(23);
    for (name, shape, _) in text.tensor_shapes_av(64, 1) {
        if !name.contains("audio_") {
            continue;
        }
        let t = if name.contains("_norm.") {
            Tensor::ones(shape.as_slice(), DType::F32, &Device::Cpu)?
        } else {
            randn(rng, shape.as_slice(), 0.0, 0.2, &Device::Cpu)?
        };
        tensors.insert(name, t);
    }
    Ok(())
}

/// The transformer `cfg`'s tensors under the released prefix, seeded; norm scales are ones.
fn dit_tensors(cfg: &Ltx2Config, audio: bool) -> anyhow::Result<HashMap<String, Tensor>> {
    let rng = &mut StdRng::seed_from_u64(5);
    let mut tensors = HashMap::new();
    let mut shapes = video_stream_shapes(cfg);
    if audio {
        shapes.extend(audio_stream_shapes(cfg));
    }
    for (name, shape) in shapes {
        let shape = shape.as_slice();
        let t = if name.contains("_norm.") {
            Tensor::ones(shape, DType::F32, &Device::Cpu)?
        } else {
            randn(rng, shape, 0.0, 0.2, &Device::Cpu)?
        };
        tensors.insert(format!("model.diffusion_model.{name}"), t);
    }
    Ok(tensors)
}

/// Writes `tensors` (f32) and `metadata` as the safetensors file `path`.
fn write_f32(
    path: &Path,
    tensors: HashMap<String, Tensor>,
    metadata: HashMap<String, String>,
) -> anyhow::Result<()> {
    let mut raw = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let data: Vec<u8> = t
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        raw.push((name, t.dims().to_vec(), data));
    }
    let views = raw
        .iter()
        .map(|(name, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)?;
            Ok((name.as_str(), view))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, Some(metadata), path)?;
    Ok(())
}

/// The items of [`dataset`]: stem and caption tokens.
const ITEMS: [(&str, usize); 3] = [("a", 3), ("b", 5), ("c", 4)];

/// A musubi-tuner video dataset in `dir` (no videos: only its `_ltx2` caches in `cache/`, three clips of 17
/// frames at 96×64 — latents [4, 3, 2, 3] — and connector outputs of 3 to 5 tokens), batch size `batch_size`;
/// returns its TOML.
pub fn dataset(dir: &Path, batch_size: usize) -> anyhow::Result<PathBuf> {
    dataset_with(dir, batch_size, false)
}

/// Audio latent frames of each clip of [`dataset_with`] (before the padding its caches carry).
pub const AUDIO_FRAMES: usize = 9;

/// [`dataset`] with, when `audio`, each clip's `_ltx2_audio` cache beside its latents (audio latents [2, 11, 2]
/// of which [`AUDIO_FRAMES`] hold audio, as musubi-tuner pads them) and the audio connector's output in its text
/// cache.
pub fn dataset_with(dir: &Path, batch_size: usize, audio: bool) -> anyhow::Result<PathBuf> {
    dataset_for(dir, batch_size, (audio, &tiny_config()))
}

/// The audio latents' `(channels, mel bins)` of the datasets for `cfg`: the tiny transformer's 4 a frame as 2 × 2,
/// else one channel of all mel bins (the audio fixture's VAE makes 1 × 16).
pub fn audio_layout(cfg: &Ltx2Config) -> (usize, usize) {
    match cfg.audio_in_channels {
        4 => (2, 2),
        n => (1, n),
    }
}

/// [`dataset_with`] for the transformer `cfg` (its latent channels and text widths).
pub fn dataset_for(
    dir: &Path,
    batch_size: usize,
    (audio, cfg): (bool, &Ltx2Config),
) -> anyhow::Result<PathBuf> {
    let cache = dir.join("cache");
    let rng = &mut StdRng::seed_from_u64(17);
    let dev = Device::Cpu;
    let window = FrameWindow {
        start: 0,
        frames: 17,
    };
    for (stem, words) in ITEMS {
        let latents = randn(rng, (cfg.in_channels, 3, 2, 3), 0.0, 1.0, &dev)?;
        let name = ltx2_latent_cache_name(stem, Some(window), (96, 64));
        write_ltx2_latent_cache(
            &cache.join(&name),
            &latents.to_dtype(DType::BF16)?,
            (96, 64),
            Some(17),
        )?;
        if audio {
            let (c, mel) = audio_layout(cfg);
            let latents = randn(rng, (c, AUDIO_FRAMES + 2, mel), 0.0, 1.0, &dev)?;
            let file = ltx2_audio_cache_name(&name).ok_or_else(|| anyhow::anyhow!("{name}"))?;
            let audio_cache = Ltx2AudioCache {
                latents: latents.to_dtype(DType::BF16)?,
                length: Some(AUDIO_FRAMES),
            };
            write_ltx2_audio_cache(&cache.join(file), &audio_cache)?;
        }
        let audio_text = if audio {
            Some(randn(
                rng,
                (words, cfg.audio_cross_attention_dim),
                0.0,
                1.0,
                &dev,
            )?)
        } else {
            None
        };
        let text = Ltx2TextCache {
            video_prompt_embeds: randn(rng, (words, cfg.cross_attention_dim), 0.0, 1.0, &dev)?,
            audio_prompt_embeds: audio_text,
            prompt_attention_mask: Some(Tensor::ones(words, DType::I64, &dev)?),
            caption: format!("clip {stem}"),
            encoding: None,
        };
        write_ltx2_text_cache(&cache.join(ltx2_text_cache_name(stem)), &text)?;
    }
    cached_video_dataset_toml(dir, (96, 64, 17), batch_size)
}
