//! HunyuanVideo 1.5's VAE from its files. Layouts read: the official release's `vae/diffusion_pytorch_model.safetensors`
//! and ComfyUI's `hunyuanvideo15_vae_fp16.safetensors` (both the official key names, `encoder.down.{i}.block.{j}…`,
//! optionally under a `vae.` / `first_stage_model.` prefix), and diffusers' `AutoencoderKLHunyuanVideo15` folders
//! (`encoder.down_blocks.{i}.resnets.{j}…`, renamed here). The architecture is read from the shapes. Files that are
//! another model — HunyuanVideo 1.0's VAE, a Wan VAE, the HunyuanVideo 1.5 transformer — are named as such.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::{Hv15Vae, Hv15VaeConfig, HV15_VAE_SCALING_FACTOR};
use crate::wan::weights::{read_header, read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// The key layouts a HunyuanVideo 1.5 VAE file comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hv15VaeLayout {
    /// The official release and ComfyUI's file: `encoder.down.{i}.block.{j}…`, `encoder.mid.attn_1.q…`.
    Official,
    /// diffusers' `AutoencoderKLHunyuanVideo15`: `encoder.down_blocks.{i}.resnets.{j}…`.
    Diffusers,
}

const PREFIXES: [&str; 3] = ["vae.", "first_stage_model.", "model."];
const OFFICIAL_PROBE: &str = "encoder.down.0.block.0.norm1.gamma";
const DIFFUSERS_PROBE: &str = "encoder.down_blocks.0.resnets.0.norm1.gamma";

/// The layout of `tensors` (after any prefix is stripped), or `None` when they are no HunyuanVideo 1.5 VAE.
pub fn detect_layout(tensors: &HashMap<String, Tensor>) -> Option<Hv15VaeLayout> {
    if tensors.contains_key(OFFICIAL_PROBE) {
        Some(Hv15VaeLayout::Official)
    } else if tensors.contains_key(DIFFUSERS_PROBE) {
        Some(Hv15VaeLayout::Diffusers)
    } else {
        None
    }
}

fn strip_prefix(tensors: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    if detect_layout(&tensors).is_some() {
        return tensors;
    }
    for prefix in PREFIXES {
        let probe = |p: &str| tensors.contains_key(&format!("{prefix}{p}"));
        if probe(OFFICIAL_PROBE) || probe(DIFFUSERS_PROBE) {
            return tensors
                .into_iter()
                .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| (k.to_string(), v)))
                .collect();
        }
    }
    tensors
}

/// One diffusers key in the official names.
fn official_key(key: &str) -> String {
    let mut parts: Vec<String> = key.split('.').map(str::to_string).collect();
    if parts.len() > 3 && (parts[1] == "down_blocks" || parts[1] == "up_blocks") {
        parts[1] = if parts[1] == "down_blocks" {
            "down"
        } else {
            "up"
        }
        .into();
        match parts[3].as_str() {
            "resnets" => parts[3] = "block".into(),
            "downsamplers" | "upsamplers" if parts.len() > 4 => {
                let name = if parts[3] == "downsamplers" {
                    "downsample"
                } else {
                    "upsample"
                };
                parts.splice(3..5, [name.to_string()]);
            }
            _ => {}
        }
    } else if parts.len() > 3 && parts[1] == "mid_block" {
        let renamed = match (parts[2].as_str(), parts[3].as_str()) {
            ("resnets", "0") => Some("block_1"),
            ("resnets", "1") => Some("block_2"),
            ("attentions", "0") => Some("attn_1"),
            _ => None,
        };
        if let Some(name) = renamed {
            parts.splice(1..4, ["mid".to_string(), name.to_string()]);
            if name == "attn_1" && parts.len() > 3 {
                if let Some(short) = parts[3].strip_prefix("to_") {
                    parts[3] = short.to_string();
                }
            }
        }
    }
    parts.join(".").replace(".conv_shortcut.", ".nin_shortcut.")
}

/// `tensors` in the official key names.
pub fn to_official(
    tensors: HashMap<String, Tensor>,
    layout: Hv15VaeLayout,
) -> HashMap<String, Tensor> {
    match layout {
        Hv15VaeLayout::Official => tensors,
        Hv15VaeLayout::Diffusers => tensors
            .into_iter()
            .map(|(k, v)| (official_key(&k), v))
            .collect(),
    }
}

fn dim(shapes: &HashMap<String, Vec<usize>>, key: &str, i: usize) -> Result<usize, String> {
    let t = shapes.get(key).ok_or_else(|| format!("no `{key}`"))?;
    t.get(i)
        .copied()
        .ok_or_else(|| format!("`{key}` has shape {t:?}"))
}

/// The architecture of a state dict in the official names, read from its tensors' shapes.
pub fn config_from_shapes(tensors: &HashMap<String, Vec<usize>>) -> Result<Hv15VaeConfig, String> {
    let mut widths = Vec::new();
    while let Ok(c) = dim(
        tensors,
        &format!("encoder.down.{}.block.0.conv1.conv.weight", widths.len()),
        0,
    ) {
        widths.push(c);
    }
    let mut layers = 0;
    while tensors.contains_key(&format!("encoder.down.0.block.{layers}.norm1.gamma")) {
        layers += 1;
    }
    let (mut spatial, mut temporal) = (1, 1);
    for i in 0..widths.len() {
        let key = format!("encoder.down.{i}.downsample.conv.conv.weight");
        if let (Ok(folded), Some(&next)) = (dim(tensors, &key, 0), widths.get(i + 1)) {
            spatial *= 2;
            if folded > 0 && next / folded == 8 {
                temporal *= 2;
            }
        }
    }
    if widths.is_empty() || layers == 0 {
        return Err("no encoder levels (`encoder.down.{i}.block.{j}`)".into());
    }
    Ok(Hv15VaeConfig {
        in_channels: dim(tensors, "encoder.conv_in.conv.weight", 1)?,
        out_channels: dim(tensors, "decoder.conv_out.conv.weight", 0)?,
        latent_channels: dim(tensors, "encoder.conv_out.conv.weight", 0)? / 2,
        block_out_channels: widths,
        layers_per_block: layers,
        ffactor_spatial: spatial,
        ffactor_temporal: temporal,
        scaling_factor: HV15_VAE_SCALING_FACTOR,
    })
}

/// What a file that holds no HunyuanVideo 1.5 VAE seems to be, with what to give instead.
fn describe_other(tensors: &HashMap<String, Tensor>) -> String {
    let has = |p: &str| tensors.keys().any(|k| k.contains(p));
    let instead = "give HunyuanVideo 1.5's VAE: `vae/diffusion_pytorch_model.safetensors` of tencent/HunyuanVideo-1.5 \
                   or ComfyUI's `hunyuanvideo15_vae_fp16.safetensors`";
    let what = if has("down_blocks.0.resnets.0.norm1.weight") {
        "HunyuanVideo 1.0's VAE (16 latent channels, GroupNorm), which HunyuanVideo 1.5 cannot use"
    } else if has("encoder.conv1.weight") || has("decoder.conv1.weight") {
        "a Wan VAE"
    } else if has("double_blocks.") || has("transformer_blocks.") {
        "a diffusion transformer (DiT), not a VAE"
    } else {
        "no HunyuanVideo 1.5 VAE (no `encoder.down.0.block.0.norm1.gamma`)"
    };
    format!("this file holds {what}; {instead}")
}

/// Builds the VAE from a state dict in any layout, with the architecture read from its shapes.
pub fn vae_from_tensors(
    tensors: HashMap<String, Tensor>,
    dtype: DType,
    device: &Device,
) -> Result<Hv15Vae, String> {
    let tensors = strip_prefix(tensors);
    let Some(layout) = detect_layout(&tensors) else {
        return Err(describe_other(&tensors));
    };
    let tensors = to_official(tensors, layout);
    let shapes = tensors
        .iter()
        .map(|(k, v)| (k.clone(), v.dims().to_vec()))
        .collect();
    let cfg = config_from_shapes(&shapes)?;
    let vb = Vb::from_tensors(tensors, dtype, device);
    Hv15Vae::new(&cfg, &vb).map_err(|e| format!("{e}"))
}

/// The weights file of a folder (the release's or a diffusers pipeline's root, or its `vae/`), else `path` itself.
pub fn vae_weights_file(path: &Path) -> PathBuf {
    if !path.is_dir() {
        return path.to_path_buf();
    }
    let name = "diffusion_pytorch_model.safetensors";
    [path.join("vae").join(name), path.join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| path.join("vae").join(name))
}

/// Whether `path` (a file or folder, read from its header only) holds HunyuanVideo 1.5's VAE in either layout.
pub fn is_hv15_vae_file(path: &Path) -> bool {
    read_header(&vae_weights_file(path)).is_ok_and(|h| {
        h.tensors
            .iter()
            .any(|t| t.name.ends_with(OFFICIAL_PROBE) || t.name.ends_with(DIFFUSERS_PROBE))
    })
}

/// Loads HunyuanVideo 1.5's VAE from `path` (safetensors or a pickle-free `.pt`, or a folder holding
/// `vae/diffusion_pytorch_model.safetensors`), weights in `dtype` on `device`.
pub fn load_hv15_vae(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<Hv15Vae, WeightsFileError> {
    let path = &vae_weights_file(path);
    let tensors = strip_prefix(read_whole_file(path)?);
    if detect_layout(&tensors).is_none() {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: describe_other(&tensors),
        });
    }
    vae_from_tensors(tensors, dtype, device).map_err(|detail| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: "HunyuanVideo 1.5 VAE",
        detail,
    })
}
