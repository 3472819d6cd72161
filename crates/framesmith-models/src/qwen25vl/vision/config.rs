//! Sizes of the Qwen2.5-VL vision tower (`Qwen2_5_VLVisionConfig` of transformers), read from the `vision_config`
//! of a Hugging Face `config.json`, from a single file's shapes, or given as the released 7B model's.

use std::collections::BTreeMap;

use serde_json::Value;

/// The vision tower's sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen25VlVisionConfig {
    /// Blocks.
    pub depth: usize,
    /// Tower width.
    pub hidden_size: usize,
    /// Width of each block's SwiGLU MLP.
    pub intermediate_size: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Width of the merged embeddings: the language model's width.
    pub out_hidden_size: usize,
    /// Side of a square patch in pixels.
    pub patch_size: usize,
    /// Frames per patch (an image is repeated to fill them).
    pub temporal_patch_size: usize,
    /// Side of the square of patches merged into one language-model token.
    pub spatial_merge_size: usize,
    /// Side of an attention window in pixels.
    pub window_size: usize,
    /// Blocks that attend over the whole image instead of windows.
    pub fullatt_block_indexes: Vec<usize>,
    /// Base of the 2-D rotary embedding.
    pub rope_theta: f64,
}

/// Why a vision config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VisionConfigError {
    #[error("config.json is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config.json has no `vision_config.{0}`")]
    Missing(&'static str),
    #[error("the vision config describes an impossible model: {0}")]
    Invalid(String),
}

impl Qwen25VlVisionConfig {
    /// Qwen2.5-VL-7B-Instruct's vision tower, the one Qwen-Image-Edit's text encoder holds.
    pub fn qwen25_vl_7b() -> Self {
        Self {
            depth: 32,
            hidden_size: 1280,
            intermediate_size: 3420,
            num_heads: 16,
            out_hidden_size: 3584,
            patch_size: 14,
            temporal_patch_size: 2,
            spatial_merge_size: 2,
            window_size: 112,
            fullatt_block_indexes: vec![7, 15, 23, 31],
            rope_theta: 10_000.0,
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads.max(1)
    }

    /// Values in one flattened patch: channels × frames × pixels.
    pub fn patch_dim(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Side of an attention window in merged tokens.
    pub fn merged_window(&self) -> usize {
        self.window_size / self.spatial_merge_size / self.patch_size
    }

    /// The tower's tensors under their names without a prefix, in module order: (name, shape).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let merged = h * self.spatial_merge_size * self.spatial_merge_size;
        let (t, p) = (self.temporal_patch_size, self.patch_size);
        let mut out = vec![("patch_embed.proj.weight".to_string(), vec![h, 3, t, p, p])];
        for block in 0..self.depth {
            let b = format!("blocks.{block}");
            out.push((format!("{b}.norm1.weight"), vec![h]));
            out.push((format!("{b}.norm2.weight"), vec![h]));
            for (name, rows, cols) in [("attn.qkv", 3 * h, h), ("attn.proj", h, h)] {
                out.push((format!("{b}.{name}.weight"), vec![rows, cols]));
                out.push((format!("{b}.{name}.bias"), vec![rows]));
            }
            for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
            {
                out.push((format!("{b}.mlp.{name}.weight"), vec![rows, cols]));
                out.push((format!("{b}.mlp.{name}.bias"), vec![rows]));
            }
        }
        out.push(("merger.ln_q.weight".to_string(), vec![h]));
        for (name, rows, cols) in [
            ("mlp.0", merged, merged),
            ("mlp.2", self.out_hidden_size, merged),
        ] {
            out.push((format!("merger.{name}.weight"), vec![rows, cols]));
            out.push((format!("merger.{name}.bias"), vec![rows]));
        }
        out
    }

    /// Reads the `vision_config` of a Hugging Face `config.json` (transformers 4 or 5), or a vision config alone.
    pub fn from_hf_json(text: &str) -> Result<Self, VisionConfigError> {
        let root: Value = serde_json::from_str(text)?;
        let v = root.get("vision_config").unwrap_or(&root);
        let r = Self::qwen25_vl_7b();
        let size = |name: &'static str, default: usize| -> usize {
            v.get(name)
                .and_then(Value::as_u64)
                .map_or(default, |x| x as usize)
        };
        let need = |name: &'static str| -> Result<usize, VisionConfigError> {
            v.get(name)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or(VisionConfigError::Missing(name))
        };
        let fullatt_block_indexes = match v.get("fullatt_block_indexes").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .filter_map(Value::as_u64)
                .map(|x| x as usize)
                .collect(),
            None => r.fullatt_block_indexes.clone(),
        };
        let rope_theta = v
            .get("rope_parameters")
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| v.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(r.rope_theta);
        let cfg = Self {
            depth: need("depth")?,
            hidden_size: need("hidden_size")?,
            intermediate_size: need("intermediate_size")?,
            num_heads: need("num_heads")?,
            out_hidden_size: need("out_hidden_size")?,
            patch_size: size("patch_size", r.patch_size),
            temporal_patch_size: size("temporal_patch_size", r.temporal_patch_size),
            spatial_merge_size: size("spatial_merge_size", r.spatial_merge_size),
            window_size: size("window_size", r.window_size),
            fullatt_block_indexes,
            rope_theta,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The sizes a single file's shapes give (names without a prefix); the head count (not in any shape) is the
    /// released model's head width of 80, and the window and full-attention blocks are the released ones.
    pub fn from_shapes(shapes: &BTreeMap<&str, &[usize]>) -> Result<Self, VisionConfigError> {
        let dim = |name: &'static str, axis: usize| {
            shapes
                .get(name)
                .and_then(|s| s.get(axis).copied())
                .ok_or(VisionConfigError::Missing(name))
        };
        let r = Self::qwen25_vl_7b();
        let hidden_size = dim("patch_embed.proj.weight", 0)?;
        let depth = (0..)
            .take_while(|i| shapes.contains_key(format!("blocks.{i}.attn.qkv.weight").as_str()))
            .count();
        let cfg = Self {
            depth,
            hidden_size,
            intermediate_size: dim("blocks.0.mlp.gate_proj.weight", 0)?,
            num_heads: (hidden_size / r.head_dim()).max(1),
            out_hidden_size: dim("merger.mlp.2.weight", 0)?,
            temporal_patch_size: dim("patch_embed.proj.weight", 2)?,
            patch_size: dim("patch_embed.proj.weight", 3)?,
            fullatt_block_indexes: r
                .fullatt_block_indexes
                .iter()
                .copied()
                .filter(|&i| i < depth)
                .collect(),
            ..r
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that heads divide the width into even halves of the rotary embedding, and that windows hold at
    /// least one merged token.
    pub fn validate(&self) -> Result<(), VisionConfigError> {
        let invalid = |m: String| Err(VisionConfigError::Invalid(m));
        if self.num_heads == 0 || self.hidden_size % self.num_heads != 0 || self.head_dim() % 4 != 0
        {
            return invalid(format!(
                "{} heads do not split the width {} into heads whose width is a multiple of 4",
                self.num_heads, self.hidden_size
            ));
        }
        if self.spatial_merge_size == 0 || self.patch_size == 0 || self.merged_window() == 0 {
            return invalid(format!(
                "a window of {} pixels holds no {}×{} group of {}-pixel patches",
                self.window_size, self.spatial_merge_size, self.spatial_merge_size, self.patch_size
            ));
        }
        if self.temporal_patch_size == 0 || self.depth == 0 {
            return invalid("no blocks or no frames per patch".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_released_config_json_reads_as_the_7b_tower() -> anyhow::Result<()> {
        let text = r#"{"model_type": "qwen2_5_vl", "vision_config": {"depth": 32, "hidden_act": "silu",
            "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584,
            "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2}}"#;
        assert_eq!(
            Qwen25VlVisionConfig::from_hf_json(text)?,
            Qwen25VlVisionConfig::qwen25_vl_7b()
        );
        Ok(())
    }

    #[test]
    fn the_7b_shapes_give_the_7b_tower() -> anyhow::Result<()> {
        let cfg = Qwen25VlVisionConfig::qwen25_vl_7b();
        let shapes = cfg.tensor_shapes();
        let map: BTreeMap<&str, &[usize]> = shapes
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        assert_eq!(Qwen25VlVisionConfig::from_shapes(&map)?, cfg);
        let parameters: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        // Qwen2.5-VL-7B's `visual.*`: 676.5 M parameters.
        assert_eq!(parameters, 676_550_144);
        Ok(())
    }

    #[test]
    fn a_window_smaller_than_a_merged_patch_is_refused() {
        let cfg = Qwen25VlVisionConfig {
            window_size: 20,
            ..Qwen25VlVisionConfig::qwen25_vl_7b()
        };
        assert!(cfg.validate().is_err());
    }
}
