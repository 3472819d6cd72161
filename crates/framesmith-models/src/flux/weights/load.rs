//! Builds the FLUX.1 models from their files — the DiT, the autoencoder, CLIP-L and T5-XXL — each checked as
//! [`super::identify_expected`] does, with its sizes read from the tensor shapes.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::{open, FluxComponent, FluxFormatError, FluxKind, FluxVariant};
use crate::checkpoint::{comfy_prefix, Names};
use crate::flux::autoencoder::{AutoEncoder, AutoEncoderConfig};
use crate::flux::clip_text::{text_model_prefix, ClipTextConfig, ClipTextModel};
use crate::flux::Flux;
use crate::t5::v1_1::t5_from_tensors;
use crate::t5::{T5Config, UmT5Encoder};
use crate::wan::weights::read_header;
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::vb::Vb;

/// Head width of the released CLIP text models (the heads are not in the tensor shapes).
const CLIP_HEAD_DIM: usize = 64;

fn incomplete(what: &str, e: impl std::fmt::Display, path: &Path) -> FluxFormatError {
    FluxFormatError::Incomplete {
        what: what.into(),
        problem: e.to_string(),
        path: path.to_path_buf(),
    }
}

/// The header's names (prefix stripped), for sizes.
fn with_names<T>(
    path: &Path,
    f: impl FnOnce(&Names) -> Option<T>,
    what: &str,
) -> Result<T, FluxFormatError> {
    let header = read_header(path)?;
    let prefix = comfy_prefix(&header.tensors, "double_blocks.");
    f(&Names::new(&header.tensors, prefix))
        .ok_or_else(|| incomplete(what, "a tensor that gives its sizes is missing", path))
}

/// Builds the FLUX.1 DiT at `path` (any layout) in `dtype` on `device`, its linears kept in FP8 with `fp8` set
/// (FP8 files stay FP8; dense files are quantised), else dense.
pub fn load_dit(
    path: &Path,
    variant: Option<FluxVariant>,
    dtype: DType,
    device: &Device,
    fp8: Option<Fp8Scale>,
) -> Result<Flux, FluxFormatError> {
    load_dit_streamed(
        path,
        variant,
        (dtype, device),
        fp8,
        false,
        (&[], &OffloadOptions::default()),
    )
}

/// [`load_dit`] with the blocks in `streamed` (indices into [`Flux::blocks`]) kept in host RAM and streamed
/// through GPU slots ([`Flux::new_streamed`]).
pub fn load_dit_streamed(
    path: &Path,
    variant: Option<FluxVariant>,
    (dtype, device): (DType, &Device),
    fp8: Option<Fp8Scale>,
    fp8_products: bool,
    (streamed, offload): (&[usize], &OffloadOptions),
) -> Result<Flux, FluxFormatError> {
    let opened = open(path, FluxComponent::Dit, variant)?;
    let FluxKind::Dit { config, .. } = opened.file.kind.clone() else {
        return Err(incomplete("FLUX.1 DiT", "it holds no DiT", path));
    };
    let title = opened.file.kind.title();
    let vb = Vb::from_source(Arc::new(opened.tensors), dtype, device)
        .with_fp8(fp8)
        .with_fp8_products(fp8_products);
    Flux::new_streamed(&config, &vb, streamed, offload).map_err(|e| incomplete(&title, e, path))
}

/// The autoencoder's sizes from its shapes, with FLUX.1's scale and shift factors.
fn autoencoder_config(names: &Names) -> Option<AutoEncoderConfig> {
    let ch = names.dim("encoder.conv_in.weight", 0)?;
    let ch_mult = (0..names.count("encoder.down."))
        .map(|i| Some(names.dim(&format!("encoder.down.{i}.block.0.conv2.weight"), 0)? / ch.max(1)))
        .collect::<Option<Vec<_>>>()?;
    Some(AutoEncoderConfig {
        in_channels: names.dim("encoder.conv_in.weight", 1)?,
        ch,
        out_ch: names.dim("decoder.conv_out.weight", 0)?,
        ch_mult,
        num_res_blocks: names.count("encoder.down.0.block."),
        z_channels: names.dim("decoder.conv_in.weight", 1)?,
        ..AutoEncoderConfig::flux1()
    })
}

/// Builds the autoencoder at `path` (`ae.safetensors`).
pub fn load_autoencoder(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<AutoEncoder, FluxFormatError> {
    let opened = open(path, FluxComponent::Autoencoder, None)?;
    let cfg = with_names(path, autoencoder_config, "FLUX.1 autoencoder")?;
    let vb = Vb::from_source(Arc::new(opened.tensors), dtype, device);
    AutoEncoder::new(&cfg, &vb).map_err(|e| incomplete("FLUX.1 autoencoder", e, path))
}

/// CLIP's sizes from its shapes; `num_heads` from `heads` (given, or read from a `config.json` beside the file),
/// else one per 64 channels as the released models. `None` when a tensor that gives a size is missing.
fn clip_config(names: &Names, heads: Option<usize>) -> Option<ClipTextConfig> {
    let emb = "text_model.embeddings.token_embedding.weight";
    let hidden = names.dim(emb, 1)?;
    Some(ClipTextConfig {
        vocab_size: names.dim(emb, 0)?,
        hidden_size: hidden,
        intermediate_size: names.dim("text_model.encoder.layers.0.mlp.fc1.weight", 0)?,
        num_hidden_layers: names.count("text_model.encoder.layers."),
        num_attention_heads: heads.unwrap_or(hidden / CLIP_HEAD_DIM),
        max_position_embeddings: names.dim("text_model.embeddings.position_embedding.weight", 0)?,
        ..ClipTextConfig::clip_l()
    })
}

/// `num_attention_heads` from the Hugging Face `config.json` beside a CLIP file (as in a `text_encoder/` folder),
/// when there is one that says it.
fn clip_heads_beside(path: &Path) -> Option<usize> {
    let bytes =
        framesmith_nn::file::read_regular(&path.parent()?.join("config.json"), 1 << 20).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let heads = json.get("num_attention_heads")?.as_u64()?;
    usize::try_from(heads).ok().filter(|&h| h > 0)
}

/// Builds the CLIP text model at `path` (`clip_l.safetensors`); `heads` overrides the head count.
pub fn load_clip_text(
    path: &Path,
    heads: Option<usize>,
    dtype: DType,
    device: &Device,
) -> Result<ClipTextModel, FluxFormatError> {
    let opened = open(path, FluxComponent::ClipL, None)?;
    let cfg = with_names(
        path,
        |n| clip_config(n, heads.or_else(|| clip_heads_beside(path))),
        "CLIP-L text encoder",
    )?;
    let (hidden, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    if heads == 0 || hidden % heads != 0 {
        return Err(incomplete(
            "CLIP-L text encoder",
            format!(
                "its width ({hidden}) does not split into {heads} attention heads, and its head count is not in \
                 the weights; put the model's config.json (with num_attention_heads) beside the file"
            ),
            path,
        ));
    }
    let vb = Vb::from_source(Arc::new(opened.tensors), dtype, device);
    ClipTextModel::new(&cfg, &text_model_prefix(&vb))
        .map_err(|e| incomplete("CLIP-L text encoder", e, path))
}

/// T5's sizes from its shapes (heads and buckets from the first layer's position table).
fn t5_config(names: &Names) -> Option<T5Config> {
    let q = "encoder.block.0.layer.0.SelfAttention.q.weight";
    let table = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    let vocab = names
        .dim("shared.weight", 0)
        .or_else(|| names.dim("encoder.embed_tokens.weight", 0))?;
    Some(T5Config {
        vocab,
        dim: names.dim(q, 1)?,
        dim_attn: names.dim(q, 0)?,
        dim_ffn: names.dim("encoder.block.0.layer.1.DenseReluDense.wi_0.weight", 0)?,
        num_heads: names.dim(table, 1)?,
        num_layers: names.count("encoder.block."),
        num_buckets: names.dim(table, 0)?,
        ..crate::t5::v1_1::t5_v1_1_xxl()
    })
}

/// Builds the T5 encoder at `path` (`t5xxl_fp16.safetensors`, `t5xxl_fp8_e4m3fn_scaled.safetensors`, …), FP8
/// weights dequantised with their scales.
pub fn load_t5_xxl(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<UmT5Encoder, FluxFormatError> {
    let opened = open(path, FluxComponent::T5, None)?;
    let cfg = with_names(path, t5_config, "T5-XXL text encoder")?;
    let tensors = opened.tensors.load_all(&Device::Cpu)?;
    t5_from_tensors(tensors, &cfg, dtype, device)
        .map_err(|e| incomplete("T5-XXL text encoder", e, path))
}
