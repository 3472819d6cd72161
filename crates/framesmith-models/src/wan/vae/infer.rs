//! The VAE's constructor arguments read from its weights, so a Wan VAE file loads without naming its sizes:
//! widths from the encoder's input conv and residual blocks, stages and temporal downsampling from the
//! encoder's resample layers, attention from `to_qkv` tensors, the decoder width from its head.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::weights::{describe_non_vae, strip_vae_prefix};
use super::{detect_vae_variant, VaeConfig, VaeVariant, WanVae};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// One stage of the encoder: residual blocks' output widths, attention after them, and the resample closing
/// it (`Some(temporal)`), if any.
#[derive(Default)]
struct Stage {
    residual_widths: Vec<usize>,
    attention: bool,
    resample: Option<bool>,
}

/// Classifies the layer under `prefix`; false when nothing is there.
fn add_layer(tensors: &HashMap<String, Tensor>, prefix: &str, stage: &mut Stage) -> bool {
    let has = |name: &str| tensors.contains_key(&format!("{prefix}.{name}"));
    if let Some(w) = tensors.get(&format!("{prefix}.residual.2.weight")) {
        stage.residual_widths.push(w.dims()[0]);
    } else if has("to_qkv.weight") {
        stage.attention = true;
    } else if has("resample.1.weight") {
        stage.resample = Some(has("time_conv.weight"));
    } else {
        return false;
    }
    true
}

/// Wan 2.1 keeps one flat `encoder.downsamples.{k}` list; a resample closes each stage but the last.
fn wan21_stages(tensors: &HashMap<String, Tensor>) -> Vec<Stage> {
    let mut stages = vec![Stage::default()];
    for k in 0.. {
        let Some(stage) = stages.last_mut() else {
            break;
        };
        if !add_layer(tensors, &format!("encoder.downsamples.{k}"), stage) {
            break;
        }
        if stage.resample.is_some() {
            stages.push(Stage::default());
        }
    }
    stages
}

/// Wan 2.2 nests each stage: `encoder.downsamples.{i}.downsamples.{j}`.
fn wan22_stages(tensors: &HashMap<String, Tensor>) -> Vec<Stage> {
    let mut stages = Vec::new();
    for i in 0.. {
        let mut stage = Stage::default();
        let mut layers = 0;
        while add_layer(
            tensors,
            &format!("encoder.downsamples.{i}.downsamples.{layers}"),
            &mut stage,
        ) {
            layers += 1;
        }
        if layers == 0 {
            break;
        }
        stages.push(stage);
    }
    stages
}

/// The configuration of the Wan VAE whose tensors (official names) are `tensors`; `None` when they are not a
/// Wan VAE or its layout is not one the official constructor makes (stages of unequal depth, a resample after
/// the last stage).
pub fn vae_config_from_tensors(tensors: &HashMap<String, Tensor>) -> Option<VaeConfig> {
    let variant = detect_vae_variant(tensors)?;
    let dim = tensors.get("encoder.conv1.weight")?.dims()[0];
    let z_dim = tensors.get("conv2.weight")?.dims()[0];
    let stages = match variant {
        VaeVariant::Wan21 => wan21_stages(tensors),
        VaeVariant::Wan22 => wan22_stages(tensors),
    };
    let (last, inner) = stages.split_last()?;
    let num_res_blocks = stages.first()?.residual_widths.len();
    let regular = num_res_blocks > 0
        && last.resample.is_none()
        && inner.iter().all(|s| s.resample.is_some())
        && stages
            .iter()
            .all(|s| s.residual_widths.len() == num_res_blocks);
    if !regular || dim == 0 {
        return None;
    }
    let dim_mult = stages
        .iter()
        .map(|s| s.residual_widths.last().map(|w| w / dim))
        .collect::<Option<Vec<_>>>()?;
    let temporal_downsample = inner.iter().map(|s| s.resample.unwrap_or(false)).collect();
    let attn_scales = stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.attention)
        .map(|(i, _)| 1.0 / (1u64 << i) as f64)
        .collect();
    let dec_dim = match variant {
        VaeVariant::Wan21 => dim,
        VaeVariant::Wan22 => {
            tensors.get("decoder.head.0.gamma")?.dims()[0] / dim_mult.first()?.max(&1)
        }
    };
    Some(VaeConfig {
        variant,
        dim,
        dec_dim,
        z_dim,
        dim_mult,
        num_res_blocks,
        attn_scales,
        temporal_downsample,
    })
}

/// Loads a Wan VAE (official `.pth`, ComfyUI or other safetensors) with the architecture read from its
/// weights, converting them to `dtype` on `device`.
pub fn load_vae_auto(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<WanVae, WeightsFileError> {
    vae_from_tensors(read_whole_file(path)?, path, dtype, device)
}

/// The VAE of `tensors` (read from `path`, which messages name) with the architecture read from them: official
/// names at the top level or under a known prefix, converted to `dtype` on `device`. The shared entry point of every
/// family whose VAE is this architecture (Qwen-Image's is Wan 2.1's, `crate::qwen_image::vae`).
pub fn vae_from_tensors(
    tensors: HashMap<String, Tensor>,
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<WanVae, WeightsFileError> {
    let tensors = strip_vae_prefix(tensors);
    let Some(cfg) = vae_config_from_tensors(&tensors) else {
        let what = if detect_vae_variant(&tensors).is_some() {
            "this Wan VAE has a layout the official code does not make (stages of unequal depth?)"
                .into()
        } else {
            describe_non_vae(&tensors)
        };
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what,
        });
    };
    let vb = Vb::from_tensors(tensors, dtype, device);
    WanVae::new(&cfg, &vb).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: match cfg.variant {
            VaeVariant::Wan21 => "Wan 2.1 VAE",
            VaeVariant::Wan22 => "Wan 2.2 VAE",
        },
        detail: format!("{e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_config(case: &str) -> anyhow::Result<(HashMap<String, Tensor>, VaeConfig)> {
        let dir = crate::fixtures::wan_case(case);
        let tensors =
            candle_core::safetensors::load(dir.join("weights.safetensors"), &Device::Cpu)?;
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let init = &json["init"];
        let list = |key: &str| -> Vec<serde_json::Value> {
            init[key].as_array().cloned().unwrap_or_default()
        };
        let dim = init["dim"].as_u64().unwrap_or(0) as usize;
        let cfg = VaeConfig {
            variant: if case.starts_with("wan22") {
                VaeVariant::Wan22
            } else {
                VaeVariant::Wan21
            },
            dim,
            dec_dim: init["dec_dim"].as_u64().map_or(dim, |d| d as usize),
            z_dim: init["z_dim"].as_u64().unwrap_or(0) as usize,
            dim_mult: list("dim_mult")
                .iter()
                .filter_map(|v| v.as_u64().map(|v| v as usize))
                .collect(),
            num_res_blocks: init["num_res_blocks"].as_u64().unwrap_or(0) as usize,
            attn_scales: list("attn_scales")
                .iter()
                .filter_map(serde_json::Value::as_f64)
                .collect(),
            temporal_downsample: list("temperal_downsample")
                .iter()
                .filter_map(serde_json::Value::as_bool)
                .collect(),
        };
        Ok((tensors, cfg))
    }

    #[test]
    fn both_fixture_vaes_are_read_from_their_weights() -> anyhow::Result<()> {
        for case in ["wan21_vae_tiny", "wan22_vae_tiny"] {
            let (tensors, expected) = fixture_config(case)?;
            assert_eq!(vae_config_from_tensors(&tensors), Some(expected), "{case}");
        }
        let path = crate::fixtures::wan_case("wan22_vae_tiny").join("weights.safetensors");
        let vae = load_vae_auto(&path, DType::F32, &Device::Cpu)?;
        assert_eq!((vae.config().dec_dim, vae.config().z_dim), (12, 48));
        Ok(())
    }

    #[test]
    fn tensor_shapes_are_the_official_checkpoints_tensors() -> anyhow::Result<()> {
        for case in ["wan21_vae_tiny", "wan22_vae_tiny"] {
            let (tensors, cfg) = fixture_config(case)?;
            let mut official: Vec<(String, Vec<usize>)> = tensors
                .iter()
                .map(|(k, t)| (k.clone(), t.dims().to_vec()))
                .collect();
            official.sort();
            let mut listed = crate::wan::vae::WanVae::tensor_shapes(&cfg)?;
            listed.sort();
            assert_eq!(listed, official, "{case}");
        }
        Ok(())
    }

    #[test]
    fn irregular_or_foreign_weights_are_refused() -> anyhow::Result<()> {
        let (mut tensors, _) = fixture_config("wan21_vae_tiny")?;
        // Dropping a residual block of stage 1 makes the stages unequal.
        tensors.retain(|k, _| !k.starts_with("encoder.downsamples.2."));
        assert!(vae_config_from_tensors(&tensors).is_none());

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t5.safetensors");
        let t5 = crate::fixtures::wan_case("umt5_tiny").join("weights.safetensors");
        std::fs::copy(t5, &path)?;
        let msg = load_vae_auto(&path, DType::F32, &Device::Cpu)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("T5 text encoder, not the VAE") && msg.contains("t5.safetensors"),
            "{msg}"
        );
        Ok(())
    }
}
