//! Sizes of the Qwen-Image transformer (the constructor arguments of diffusers' `QwenImageTransformer2DModel`, as
//! its `transformer/config.json` spells them), with the released model as a named constructor.

use serde::Deserialize;

/// Constructor arguments of `QwenImageTransformer2DModel`. Unknown fields (`_class_name`, `_diffusers_version`)
/// are ignored, as diffusers does.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QwenImageConfig {
    /// Side of the square latent patch folded into one token (2).
    pub patch_size: usize,
    /// Width of a packed latent token (16 channels × 2 × 2 = 64).
    pub in_channels: usize,
    /// Latent channels predicted per patch position (the head's width is `patch_size² · out_channels`).
    #[serde(default)]
    pub out_channels: Option<usize>,
    /// Dual-stream blocks (`transformer_blocks.*`).
    pub num_layers: usize,
    /// Width of one attention head.
    pub attention_head_dim: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Width of a text token (Qwen2.5-VL-7B's hidden size, 3584).
    pub joint_attention_dim: usize,
    /// Unused by the released models (diffusers keeps it for a guidance-distilled variant that was never shipped).
    #[serde(default)]
    pub guidance_embeds: bool,
    /// RoPE widths of the (frame, height, width) axes; they sum to the head width.
    pub axes_dims_rope: Vec<usize>,
    /// Per-token modulation that treats conditioning-image tokens as timestep 0 (a later Edit release).
    #[serde(default)]
    pub zero_cond_t: bool,
    /// A learned embedding added to the timestep's (a later layered release).
    #[serde(default)]
    pub use_additional_t_cond: bool,
    /// The layered release's RoPE.
    #[serde(default)]
    pub use_layer3d_rope: bool,
}

impl QwenImageConfig {
    /// Qwen-Image (also Qwen-Image-Edit and Edit-2509, which share its shapes): 60 blocks, 24 heads of 128.
    pub fn qwen_image() -> Self {
        Self {
            patch_size: 2,
            in_channels: 64,
            out_channels: Some(16),
            num_layers: 60,
            attention_head_dim: 128,
            num_attention_heads: 24,
            joint_attention_dim: 3584,
            guidance_embeds: false,
            axes_dims_rope: vec![16, 56, 56],
            zero_cond_t: false,
            use_additional_t_cond: false,
            use_layer3d_rope: false,
        }
    }

    /// Reads diffusers' constructor arguments from JSON (a `transformer/config.json`, or a fixture's `init`).
    pub fn from_json(json: &str) -> serde_json::Result<Self> {
        serde_json::from_str(json)
    }

    /// Model width (`inner_dim`: heads × head width).
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Width of a predicted token: `patch_size² · out_channels` (`out_channels` defaults to `in_channels`).
    pub fn out_dim(&self) -> usize {
        self.patch_size * self.patch_size * self.out_channels.unwrap_or(self.in_channels)
    }

    /// Hidden width of the MLPs (diffusers' `FeedForward` default: 4 × width).
    pub fn mlp_hidden_dim(&self) -> usize {
        4 * self.inner_dim()
    }

    /// Checks what the model needs: three even RoPE axes summing to the head width, and none of the options of
    /// the later releases this implementation does not cover.
    pub fn validate(&self) -> candle_core::Result<()> {
        if self.num_attention_heads == 0 || self.attention_head_dim == 0 {
            candle_core::bail!(
                "Qwen-Image: the model needs at least one attention head of non-zero width"
            );
        }
        let axes: usize = self.axes_dims_rope.iter().sum();
        if self.axes_dims_rope.len() != 3
            || axes != self.attention_head_dim
            || self.axes_dims_rope.iter().any(|d| d % 2 != 0)
        {
            candle_core::bail!(
                "Qwen-Image: RoPE axes {:?} must be three even widths summing to the head width {}",
                self.axes_dims_rope,
                self.attention_head_dim
            );
        }
        let unsupported: Vec<&str> = [
            (self.zero_cond_t, "zero_cond_t"),
            (self.use_additional_t_cond, "use_additional_t_cond"),
            (self.use_layer3d_rope, "use_layer3d_rope"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if !unsupported.is_empty() {
            candle_core::bail!(
                "Qwen-Image: this transformer sets {}, an option of a later release that Framesmith does not \
                 support yet; use Qwen-Image, Qwen-Image-Edit or Qwen-Image-Edit-2509",
                unsupported.join(", ")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_sizes_follow_diffusers_defaults() {
        let cfg = QwenImageConfig::qwen_image();
        assert_eq!(cfg.inner_dim(), 3072);
        assert_eq!(cfg.out_dim(), 64);
        assert_eq!(cfg.mlp_hidden_dim(), 12_288);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn reads_a_diffusers_config_and_refuses_later_options() -> anyhow::Result<()> {
        let json = r#"{"_class_name": "QwenImageTransformer2DModel", "_diffusers_version": "0.35.0",
            "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": false,
            "in_channels": 64, "joint_attention_dim": 3584, "num_attention_heads": 24, "num_layers": 60,
            "out_channels": 16, "patch_size": 2, "pooled_projection_dim": 768}"#;
        let cfg = QwenImageConfig::from_json(json)?;
        assert_eq!(cfg, QwenImageConfig::qwen_image());
        let later = QwenImageConfig {
            zero_cond_t: true,
            ..cfg.clone()
        };
        let err = later
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("zero_cond_t"), "{err}");
        let bad_axes = QwenImageConfig {
            axes_dims_rope: vec![16, 56, 58],
            ..cfg
        };
        assert!(bad_axes.validate().is_err());
        Ok(())
    }
}
