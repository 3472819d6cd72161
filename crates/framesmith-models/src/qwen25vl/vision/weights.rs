//! Builds the vision tower from the files users have: the `visual.*` tensors of ComfyUI's single files
//! (`qwen_2.5_vl_7b.safetensors`, `qwen_2.5_vl_7b_fp8_scaled.safetensors`) and of transformers 4 checkpoints, or
//! `model.visual.*` of transformers 5 folders (`text_encoder/` of Qwen/Qwen-Image-Edit). FP8 weights (with
//! `scale_weight` / `weight_scale`, or without) are dequantised to the compute dtype: the tower is small and
//! runs once per image. A file without the tower is named with what to download.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device};

use super::{Qwen25VlVision, Qwen25VlVisionConfig};
use crate::checkpoint::mapped_vb;
use crate::qwen25vl::weights::{scan, Qwen25VlFormatError, VISION};

/// How to build the vision tower.
#[derive(Debug, Clone)]
pub struct VisionLoadOptions {
    /// Compute dtype.
    pub dtype: DType,
    /// Where it runs.
    pub device: Device,
    /// Sizes to build instead of the file's (tests with small models); `None` also requires the 7B tower.
    pub config: Option<Qwen25VlVisionConfig>,
}

impl VisionLoadOptions {
    /// bf16 on `device`, the file's sizes.
    pub fn new(device: &Device) -> Self {
        Self {
            dtype: DType::BF16,
            device: device.clone(),
            config: None,
        }
    }
}

/// Builds the vision tower at `path` (a single file, a text encoder's folder, or a Qwen-Image-Edit folder holding
/// one), its tensors read from the opened files as the tower asks for them.
pub fn load_vision_model(
    path: &Path,
    options: &VisionLoadOptions,
) -> Result<Qwen25VlVision, Qwen25VlFormatError> {
    let scanned = scan(path, true)?;
    let build = |problem: String| Qwen25VlFormatError::Build {
        problem,
        path: path.to_path_buf(),
    };
    let prefix = VISION
        .into_iter()
        .rev()
        .find(|p| {
            scanned
                .tensors
                .iter()
                .any(|(_, t)| t.name == format!("{p}patch_embed.proj.weight"))
        })
        .ok_or_else(|| Qwen25VlFormatError::NoVisionTower {
            path: path.to_path_buf(),
        })?;
    let config = match (&options.config, &scanned.folder_config) {
        (Some(cfg), _) => cfg.clone(),
        (None, Some(text)) => {
            Qwen25VlVisionConfig::from_hf_json(text).map_err(|e| build(e.to_string()))?
        }
        (None, None) => {
            let shapes: BTreeMap<&str, &[usize]> = scanned
                .tensors
                .iter()
                .filter_map(|(_, t)| Some((t.name.strip_prefix(prefix)?, t.shape.as_slice())))
                .collect();
            Qwen25VlVisionConfig::from_shapes(&shapes).map_err(|e| build(e.to_string()))?
        }
    };
    if options.config.is_none() && config != Qwen25VlVisionConfig::qwen25_vl_7b() {
        return Err(build(format!(
            "a vision tower of width {} with {} blocks is not Qwen2.5-VL-7B's, which Qwen-Image-Edit uses",
            config.hidden_size, config.depth
        )));
    }
    let vb = mapped_vb(
        &scanned.files,
        &scanned.tensors,
        |name| name.strip_prefix(prefix),
        options.dtype,
        &options.device,
        None,
    )?;
    Qwen25VlVision::new(&config, &vb).map_err(|e| build(e.to_string()))
}
