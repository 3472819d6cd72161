//! Hugging Face `UMT5EncoderModel` / `T5EncoderModel` key names (ComfyUI's `umt5_xxl_*` and `t5xxl_*` files) onto
//! the encoder's official names, FP8 scales included, and loading an encoder from a file.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::{T5Config, UmT5Encoder};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// Renames Hugging Face `UMT5EncoderModel` keys (ComfyUI's `umt5_xxl_*.safetensors`) to the official names;
/// official names pass through unchanged. The FP8 files' scales (`scale_weight`, `weight_scale`, `comfy_quant`)
/// follow their weights, so every weight is dequantised with its own scale when read.
pub fn official_t5_keys(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .into_iter()
        .filter_map(|(k, v)| hf_to_official(&k).map(|k| (k, v)))
        .collect()
}

/// The official name of a Linear's tensor (`weight` or one of the FP8 files' companions).
const LINEAR_TENSORS: [&str; 6] = [
    "weight",
    "scale_weight",
    "weight_scale",
    "scale_input",
    "input_scale",
    "comfy_quant",
];

/// A block's Linears: Hugging Face module path under `encoder.block.{i}.`, official path under `blocks.{i}.`.
const HF_BLOCK_LINEARS: [(&str, &str); 7] = [
    ("layer.0.SelfAttention.q", "attn.q"),
    ("layer.0.SelfAttention.k", "attn.k"),
    ("layer.0.SelfAttention.v", "attn.v"),
    ("layer.0.SelfAttention.o", "attn.o"),
    ("layer.1.DenseReluDense.wi_0", "ffn.gate.0"),
    ("layer.1.DenseReluDense.wi_1", "ffn.fc1"),
    ("layer.1.DenseReluDense.wo", "ffn.fc2"),
];

/// The tensors of a Hugging Face `UMT5EncoderModel` file of this size (the layout of ComfyUI's
/// `umt5_xxl_*.safetensors`), with whether each is a Linear's weight (what FP8 files store in FP8).
pub fn hf_t5_tensor_shapes(cfg: &T5Config) -> Vec<(String, Vec<usize>, bool)> {
    let mut out = vec![("shared.weight".to_string(), vec![cfg.vocab, cfg.dim], false)];
    for i in 0..cfg.num_layers {
        let block = |name: &str| format!("encoder.block.{i}.{name}");
        for (hf, official) in HF_BLOCK_LINEARS {
            let (rows, cols) = match official {
                "attn.q" | "attn.k" | "attn.v" => (cfg.dim_attn, cfg.dim),
                "attn.o" => (cfg.dim, cfg.dim_attn),
                "ffn.fc2" => (cfg.dim, cfg.dim_ffn),
                _ => (cfg.dim_ffn, cfg.dim),
            };
            out.push((block(&format!("{hf}.weight")), vec![rows, cols], true));
        }
        out.push((block("layer.0.layer_norm.weight"), vec![cfg.dim], false));
        out.push((block("layer.1.layer_norm.weight"), vec![cfg.dim], false));
        if !cfg.shared_pos || i == 0 {
            out.push((
                block("layer.0.SelfAttention.relative_attention_bias.weight"),
                vec![cfg.num_buckets, cfg.num_heads],
                false,
            ));
        }
    }
    out.push((
        "encoder.final_layer_norm.weight".to_string(),
        vec![cfg.dim],
        false,
    ));
    out
}

fn hf_to_official(key: &str) -> Option<String> {
    let mapped = match key {
        "shared.weight" | "encoder.embed_tokens.weight" => "token_embedding.weight".to_string(),
        "shared.scale_weight" | "encoder.embed_tokens.scale_weight" => {
            "token_embedding.scale_weight".to_string()
        }
        "encoder.final_layer_norm.weight" => "norm.weight".to_string(),
        _ => {
            let Some(rest) = key.strip_prefix("encoder.block.") else {
                return Some(key.to_string());
            };
            let (block, tail) = rest.split_once('.')?;
            let name = match tail {
                // The position table, with a scale when an FP8 file quantised it too.
                _ if tail.starts_with("layer.0.SelfAttention.relative_attention_bias.") => {
                    let (_, tensor) = tail.rsplit_once('.')?;
                    if !LINEAR_TENSORS.contains(&tensor) {
                        return None;
                    }
                    format!("pos_embedding.embedding.{tensor}")
                }
                "layer.0.layer_norm.weight" => "norm1.weight".to_string(),
                "layer.1.layer_norm.weight" => "norm2.weight".to_string(),
                _ => {
                    let (module, tensor) = tail.rsplit_once('.')?;
                    if !LINEAR_TENSORS.contains(&tensor) {
                        return None;
                    }
                    let (_, official) = HF_BLOCK_LINEARS.iter().find(|(hf, _)| *hf == module)?;
                    format!("{official}.{tensor}")
                }
            };
            format!("blocks.{block}.{name}")
        }
    };
    Some(mapped)
}

/// Loads the umT5 encoder from the official `.pth` (`models_t5_umt5-xxl-enc-bf16.pth`) or a safetensors file
/// with official or Hugging Face key names, converting to `dtype`.
pub fn load_umt5(
    path: &Path,
    cfg: &T5Config,
    dtype: DType,
    device: &Device,
) -> std::result::Result<UmT5Encoder, WeightsFileError> {
    let tensors = official_t5_keys(read_whole_file(path)?);
    if !tensors.contains_key("token_embedding.weight")
        || !tensors.contains_key("blocks.0.attn.q.weight")
    {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: "this file holds no T5 encoder (no `token_embedding.weight` / `blocks.0.attn.q.weight`)".into(),
        });
    }
    let vb = Vb::from_tensors(tensors, dtype, device);
    UmT5Encoder::new(cfg, &vb).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: "umT5 encoder",
        detail: format!("{e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{wan_case, FixtureCase};
    use crate::wan::text_encoder::load_umt5_auto;

    #[test]
    fn hf_tensor_shapes_are_the_official_encoders_tensors() -> anyhow::Result<()> {
        let tensors = FixtureCase::load_dir(&wan_case("umt5_tiny"))?.weights;
        let mut official: Vec<(String, Vec<usize>)> = tensors
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect();
        official.sort();
        let mut listed: Vec<(String, Vec<usize>)> = hf_t5_tensor_shapes(&T5Config::tiny())
            .into_iter()
            .map(|(k, shape, _)| (hf_to_official(&k).unwrap_or(k), shape))
            .collect();
        listed.sort();
        assert_eq!(listed, official);
        Ok(())
    }

    #[test]
    fn hf_keys_map_to_official_names() {
        assert_eq!(
            hf_to_official("shared.weight").as_deref(),
            Some("token_embedding.weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.3.layer.1.DenseReluDense.wi_0.weight").as_deref(),
            Some("blocks.3.ffn.gate.0.weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
                .as_deref(),
            Some("blocks.0.pos_embedding.embedding.weight")
        );
        assert_eq!(
            hf_to_official("blocks.1.attn.o.weight").as_deref(),
            Some("blocks.1.attn.o.weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.9.unknown.weight"),
            None
        );
    }

    /// The Hugging Face (ComfyUI) name of an official umT5 key.
    fn official_to_hf(k: &str) -> String {
        let tail_map = [
            ("attn.q.weight", "layer.0.SelfAttention.q.weight"),
            ("attn.k.weight", "layer.0.SelfAttention.k.weight"),
            ("attn.v.weight", "layer.0.SelfAttention.v.weight"),
            ("attn.o.weight", "layer.0.SelfAttention.o.weight"),
            (
                "pos_embedding.embedding.weight",
                "layer.0.SelfAttention.relative_attention_bias.weight",
            ),
            ("norm1.weight", "layer.0.layer_norm.weight"),
            ("ffn.gate.0.weight", "layer.1.DenseReluDense.wi_0.weight"),
            ("ffn.fc1.weight", "layer.1.DenseReluDense.wi_1.weight"),
            ("ffn.fc2.weight", "layer.1.DenseReluDense.wo.weight"),
            ("norm2.weight", "layer.1.layer_norm.weight"),
        ];
        match k {
            "token_embedding.weight" => "shared.weight".into(),
            "norm.weight" => "encoder.final_layer_norm.weight".into(),
            _ => {
                let rest = k.strip_prefix("blocks.").unwrap_or(k);
                let (block, tail) = rest.split_once('.').unwrap_or((rest, ""));
                let hf = tail_map
                    .iter()
                    .find(|(o, _)| *o == tail)
                    .map(|(_, h)| *h)
                    .unwrap_or(tail);
                format!("encoder.block.{block}.{hf}")
            }
        }
    }

    /// The fixture's official-name weights renamed to Hugging Face names (as in ComfyUI's umT5 files), saved,
    /// loaded through [`load_umt5`] and run: the output must equal the official `hidden`.
    #[test]
    fn hf_named_safetensors_load_and_match_the_fixture() -> anyhow::Result<()> {
        let FixtureCase {
            weights,
            inputs,
            expected,
            ..
        } = FixtureCase::load_dir(&wan_case("umt5_tiny"))?;
        let hf: HashMap<String, Tensor> = weights
            .iter()
            .map(|(k, v)| (official_to_hf(k), v.clone()))
            .collect();
        assert!(hf.keys().all(|k| !k.starts_with("blocks.")));
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("umt5_hf.safetensors");
        candle_core::safetensors::save(&hf, &path)?;
        let cfg = T5Config::tiny();
        let encoder = load_umt5(&path, &cfg, DType::F32, &Device::Cpu)?;
        let hidden = encoder.encode(&inputs["ids"], &inputs["mask"])?;
        let err = (hidden - &expected["hidden"])?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(err < 1e-4, "max abs error {err}");
        let trimmed = encoder.encode_trimmed(&inputs["ids"], &inputs["mask"])?;
        assert_eq!(
            trimmed
                .iter()
                .map(|t| t.dim(0))
                .collect::<candle_core::Result<Vec<_>>>()?,
            vec![12, 7]
        );

        let err = load_umt5(&path, &T5Config::umt5_xxl(), DType::F32, &Device::Cpu).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("do not fit the umT5 encoder") && msg.contains("umt5_hf.safetensors"),
            "{msg}"
        );
        Ok(())
    }

    /// ComfyUI's scaled-FP8 umT5 layout (`umt5_xxl_fp8_e4m3fn_scaled.safetensors`): Hugging Face names, every
    /// Linear and the embedding as e4m3 codes with a per-tensor `scale_weight`, and the `scaled_fp8` marker. It
    /// must encode exactly as the same weights dequantised by hand (a missed scale is off by ~1/scale).
    #[test]
    fn comfy_scaled_fp8_umt5_loads_with_its_scales() -> anyhow::Result<()> {
        use framesmith_nn::fp8::{e4m3_decode, e4m3_encode};
        let FixtureCase {
            weights, inputs, ..
        } = FixtureCase::load_dir(&wan_case("umt5_tiny"))?;
        let mut scaled = HashMap::new();
        let mut dequantized = HashMap::new();
        let mut min_scale = f32::INFINITY;
        for (k, v) in &weights {
            let hf = official_to_hf(k);
            let quantize = v.rank() == 2 && !k.contains("pos_embedding");
            if !quantize {
                scaled.insert(hf.clone(), v.clone());
                dequantized.insert(hf, v.clone());
                continue;
            }
            let values = v.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let amax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = amax / 448.0;
            min_scale = min_scale.min(scale);
            let codes: Vec<u8> = values.iter().map(|x| e4m3_encode(x / scale)).collect();
            let back: Vec<f32> = codes.iter().map(|&c| e4m3_decode(c) * scale).collect();
            let module = hf.trim_end_matches(".weight");
            scaled.insert(
                hf.clone(),
                Tensor::from_raw_buffer(&codes, DType::F8E4M3, v.dims(), &Device::Cpu)?,
            );
            scaled.insert(
                format!("{module}.scale_weight"),
                Tensor::new(scale, &Device::Cpu)?,
            );
            dequantized.insert(hf, Tensor::from_vec(back, v.dims(), &Device::Cpu)?);
        }
        assert!(min_scale < 0.1, "the test needs scales far from 1");
        scaled.insert(
            "scaled_fp8".into(),
            Tensor::from_raw_buffer(&[0u8], DType::F8E4M3, &[1], &Device::Cpu)?,
        );
        let dir = tempfile::tempdir()?;
        let (fp8_path, ref_path) = (
            dir.path().join("fp8.safetensors"),
            dir.path().join("ref.safetensors"),
        );
        candle_core::safetensors::save(&scaled, &fp8_path)?;
        candle_core::safetensors::save(&dequantized, &ref_path)?;
        let encode = |path: &Path| -> anyhow::Result<Tensor> {
            let encoder = load_umt5(path, &T5Config::tiny(), DType::F32, &Device::Cpu)?;
            Ok(encoder.encode(&inputs["ids"], &inputs["mask"])?)
        };
        let max_abs = |a: Tensor, b: &Tensor| -> anyhow::Result<f32> {
            Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
        };
        let want = encode(&ref_path)?;
        let err = max_abs(encode(&fp8_path)?, &want)?;
        assert!(
            err < 1e-5,
            "max abs error {err} against the hand-dequantised weights"
        );
        let auto = load_umt5_auto(&fp8_path, DType::F32, &Device::Cpu)?;
        let err = max_abs(auto.encode(&inputs["ids"], &inputs["mask"])?, &want)?;
        assert!(err < 1e-5, "load_umt5_auto: max abs error {err}");
        Ok(())
    }

    #[test]
    fn scales_follow_their_linears() {
        assert_eq!(
            hf_to_official("encoder.block.3.layer.1.DenseReluDense.wi_0.scale_weight").as_deref(),
            Some("blocks.3.ffn.gate.0.scale_weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.0.SelfAttention.k.comfy_quant").as_deref(),
            Some("blocks.0.attn.k.comfy_quant")
        );
        assert_eq!(
            hf_to_official("shared.scale_weight").as_deref(),
            Some("token_embedding.scale_weight")
        );
        assert_eq!(
            hf_to_official("encoder.block.0.layer.0.SelfAttention.q.bogus"),
            None
        );
        assert_eq!(
            hf_to_official(
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.scale_weight"
            )
            .as_deref(),
            Some("blocks.0.pos_embedding.embedding.scale_weight")
        );
    }
}
