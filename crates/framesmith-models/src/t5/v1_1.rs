//! The T5-XXL v1.1 encoder FLUX.1 takes its text tokens from (`T5EncoderModel` of Hugging Face transformers, the
//! `t5xxl_*.safetensors` files). It is the umT5 encoder ([`UmT5Encoder`]) with one relative-position table,
//! stored in the first layer and shared by every layer; this module gives its sizes and maps the Hugging Face
//! (ComfyUI) key names, FP8 scales included, onto the encoder's names.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::{official_t5_keys, T5Config, UmT5Encoder};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// google/t5-v1_1-xxl's encoder, as FLUX.1 loads it.
pub fn t5_v1_1_xxl() -> T5Config {
    T5Config {
        vocab: 32_128,
        dim: 4096,
        dim_attn: 4096,
        dim_ffn: 10_240,
        num_heads: 64,
        num_layers: 24,
        num_buckets: 32,
        shared_pos: true,
        max_dist: 128,
        eps: 1e-6,
    }
}

/// The Hugging Face `T5Config` fields the encoder uses.
#[derive(Debug, Deserialize)]
struct HfT5Config {
    vocab_size: usize,
    d_model: usize,
    d_kv: usize,
    d_ff: usize,
    num_layers: usize,
    num_heads: usize,
    #[serde(default = "default_buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "default_max_distance")]
    relative_attention_max_distance: usize,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    #[serde(default)]
    feed_forward_proj: Option<String>,
}

/// `T5Config`'s defaults for the fields a config file may leave out.
fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_eps() -> f64 {
    1e-6
}

/// Reads a Hugging Face `T5Config` (JSON) of a v1.1 (gated-GELU) encoder.
pub fn t5_config_from_hf_json(json: &str) -> anyhow::Result<T5Config> {
    let hf: HfT5Config = serde_json::from_str(json)?;
    // `T5Config` defaults to "relu" (T5 v1.0), which FLUX's encoder is not.
    let ff = hf.feed_forward_proj.as_deref().unwrap_or("relu");
    anyhow::ensure!(
        ff == "gated-gelu",
        "T5 feed_forward_proj `{ff}` is not supported (FLUX's T5 v1.1 uses gated-gelu)"
    );
    Ok(T5Config {
        vocab: hf.vocab_size,
        dim: hf.d_model,
        dim_attn: hf.num_heads * hf.d_kv,
        dim_ffn: hf.d_ff,
        num_heads: hf.num_heads,
        num_layers: hf.num_layers,
        num_buckets: hf.relative_attention_num_buckets,
        shared_pos: true,
        max_dist: hf.relative_attention_max_distance,
        eps: hf.layer_norm_epsilon,
    })
}

/// The sizes of a Hugging Face T5 v1.1 encoder read from its tensors' shapes (`shape_of` gives a tensor's shape by
/// its Hugging Face name, `encoder.`-prefixed): vocabulary and width from the embedding, attention width from `q`,
/// heads and buckets from the first layer's position table, feed-forward width from `wi_0`, and the layer count.
/// The saturation distance and norm epsilon are not stored in a file: T5's defaults (128, 1e-6). A missing or
/// inconsistent tensor is named in the error.
pub fn t5_config_from_hf_shapes(
    shape_of: impl Fn(&str) -> Option<Vec<usize>>,
) -> Result<T5Config, String> {
    let dims2 = |name: &str| -> Result<(usize, usize), String> {
        match shape_of(name).as_deref() {
            Some(&[rows, cols]) => Ok((rows, cols)),
            Some(other) => Err(format!(
                "`{name}` has shape {other:?}, expected two dimensions"
            )),
            None => Err(format!("no tensor `{name}`")),
        }
    };
    let block = |i: usize, name: &str| format!("encoder.block.{i}.{name}");
    let (vocab, dim) = dims2("shared.weight").or_else(|_| dims2("encoder.embed_tokens.weight"))?;
    let (dim_attn, _) = dims2(&block(0, "layer.0.SelfAttention.q.weight"))?;
    let (dim_ffn, _) = dims2(&block(0, "layer.1.DenseReluDense.wi_0.weight"))?;
    let (num_buckets, num_heads) = dims2(&block(
        0,
        "layer.0.SelfAttention.relative_attention_bias.weight",
    ))?;
    let num_layers = (0..)
        .take_while(|&i| shape_of(&block(i, "layer.0.SelfAttention.q.weight")).is_some())
        .count();
    if num_heads == 0 || dim_attn % num_heads != 0 {
        return Err(format!(
            "attention width {dim_attn} is not a multiple of the {num_heads} heads of the position table"
        ));
    }
    Ok(T5Config {
        vocab,
        dim,
        dim_attn,
        dim_ffn,
        num_heads,
        num_layers,
        num_buckets,
        shared_pos: true,
        max_dist: 128,
        eps: 1e-6,
    })
}

/// Hugging Face T5 v1.1 keys → the encoder's names; the first layer's relative-position table becomes the
/// shared one (`pos_embedding.embedding.weight`).
pub fn t5_encoder_keys(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    official_t5_keys(tensors)
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("blocks.0.pos_embedding.") {
            Some(rest) => (format!("pos_embedding.{rest}"), v),
            None => (k, v),
        })
        .collect()
}

/// Builds the encoder from Hugging Face T5 v1.1 tensors.
pub fn t5_from_tensors(
    tensors: HashMap<String, Tensor>,
    cfg: &T5Config,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<UmT5Encoder> {
    let vb = Vb::from_tensors(t5_encoder_keys(tensors), dtype, device);
    UmT5Encoder::new(cfg, &vb)
}

/// Loads FLUX's T5 encoder from a safetensors file (Hugging Face / ComfyUI names, dense or scaled FP8).
pub fn load_t5(
    path: &Path,
    cfg: &T5Config,
    dtype: DType,
    device: &Device,
) -> Result<UmT5Encoder, WeightsFileError> {
    let tensors = read_whole_file(path)?;
    if !tensors.contains_key("encoder.block.0.layer.0.SelfAttention.q.weight") {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: "this file holds no T5 encoder (no `encoder.block.0.layer.0.SelfAttention.q.weight`)".into(),
        });
    }
    t5_from_tensors(tensors, cfg, dtype, device).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: "T5-XXL encoder",
        detail: format!("{e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::testkit::{assert_close, Case};

    #[test]
    fn matches_the_hf_t5_encoder() -> anyhow::Result<()> {
        let case = Case::load("t5_encoder")?;
        let cfg = t5_config_from_hf_json(&case.config["init"].to_string())?;
        let encoder = t5_from_tensors(case.weights.clone(), &cfg, DType::F32, &Device::Cpu)?;
        let ids = case.input("input_ids")?;
        let mask = case.input("attention_mask")?;
        let hidden = encoder.encode(ids, mask)?;
        assert_close("hidden", &hidden, case.expected("hidden")?, 1e-4, 1e-4)?;
        let hidden = encoder.encode(ids, &mask.ones_like()?)?;
        assert_close(
            "hidden_nomask",
            &hidden,
            case.expected("hidden_nomask")?,
            1e-4,
            1e-4,
        )?;
        Ok(())
    }

    #[test]
    fn xxl_sizes() {
        let cfg = t5_v1_1_xxl();
        assert_eq!((cfg.dim_attn / cfg.num_heads, cfg.vocab), (64, 32_128));
    }
}
