//! Sizes of the HunyuanVideo 1.5 transformer: the constructor arguments of diffusers'
//! `HunyuanVideo15Transformer3DModel` as its `transformer/config.json` spells them, the released 8.3B model as a
//! named constructor, and the sizes read back from a checkpoint's tensor shapes (the official release and ComfyUI's
//! files carry no diffusers config).

use serde::Deserialize;

/// Hidden width of the glyph (byT5) projection in every release (diffusers fixes it in the constructor).
pub const BYT5_HIDDEN: usize = 2048;

fn default_byt5_hidden() -> usize {
    BYT5_HIDDEN
}

/// Constructor arguments of `HunyuanVideo15Transformer3DModel`. Unknown fields (`_class_name`, `target_size`,
/// `task_type`, …) are ignored, as diffusers does.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HunyuanVideo15Config {
    /// Channels of the model input: latents, condition latents and the condition mask (32 + 32 + 1).
    pub in_channels: usize,
    /// Latent channels predicted.
    pub out_channels: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Width of one attention head.
    pub attention_head_dim: usize,
    /// Double-stream blocks (`double_blocks.*`; diffusers' `transformer_blocks.*`).
    pub num_layers: usize,
    /// Blocks of the text token refiner (`txt_in.individual_token_refiner.blocks.*`).
    pub num_refiner_layers: usize,
    /// MLP width over model width.
    pub mlp_ratio: f64,
    /// Spatial side of a latent patch folded into one token.
    pub patch_size: usize,
    /// Frames of a latent patch.
    pub patch_size_t: usize,
    /// Width of a Qwen2.5-VL hidden state (3584).
    pub text_embed_dim: usize,
    /// Width of a byT5 (Glyph-SDXL-v2) hidden state (1472).
    pub text_embed_2_dim: usize,
    /// Hidden width of the glyph projection (not a diffusers argument: 2048 in every release).
    #[serde(default = "default_byt5_hidden")]
    pub byt5_hidden_dim: usize,
    /// Width of a SigLIP image embedding (1152).
    pub image_embed_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE widths of the (frame, height, width) axes; they sum to the head width.
    pub rope_axes_dim: Vec<usize>,
    /// The step-distilled release's second timestep embedding (`time_r_in`).
    #[serde(default)]
    pub use_meanflow: bool,
}

impl HunyuanVideo15Config {
    /// HunyuanVideo 1.5 (8.3B; every 480p / 720p, T2V / I2V transformer of `tencent/HunyuanVideo-1.5`): 54
    /// double-stream blocks, 16 heads of 128, 1×1×1 patches of 65 input channels.
    pub fn hunyuan_video15() -> Self {
        Self {
            in_channels: 65,
            out_channels: 32,
            num_attention_heads: 16,
            attention_head_dim: 128,
            num_layers: 54,
            num_refiner_layers: 2,
            mlp_ratio: 4.0,
            patch_size: 1,
            patch_size_t: 1,
            text_embed_dim: 3584,
            text_embed_2_dim: 1472,
            byt5_hidden_dim: BYT5_HIDDEN,
            image_embed_dim: 1152,
            rope_theta: 256.0,
            rope_axes_dim: vec![16, 56, 56],
            use_meanflow: false,
        }
    }

    /// Reads diffusers' constructor arguments from JSON (a `transformer/config.json`, or a fixture's `init`).
    pub fn from_json(json: &str) -> serde_json::Result<Self> {
        serde_json::from_str(json)
    }

    /// Model width (heads × head width).
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Hidden width of the blocks' and the refiner's MLPs.
    pub fn mlp_hidden_dim(&self) -> usize {
        (self.inner_dim() as f64 * self.mlp_ratio) as usize
    }

    /// Latent values folded into one token: `in_channels · patch_size_t · patch_size²`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.patch_size_t * self.patch_size * self.patch_size
    }

    /// Width of a predicted token: `out_channels · patch_size_t · patch_size²`.
    pub fn out_dim(&self) -> usize {
        self.out_channels * self.patch_size_t * self.patch_size * self.patch_size
    }

    /// Checks what the model needs: heads, three even RoPE axes summing to the head width, non-zero patches, an
    /// MLP ratio giving a whole width, and no option this implementation does not cover.
    pub fn validate(&self) -> candle_core::Result<()> {
        if self.num_attention_heads == 0 || self.attention_head_dim == 0 {
            candle_core::bail!(
                "HunyuanVideo 1.5: the model needs at least one attention head of non-zero width"
            );
        }
        let axes: usize = self.rope_axes_dim.iter().sum();
        if self.rope_axes_dim.len() != 3
            || axes != self.attention_head_dim
            || self.rope_axes_dim.iter().any(|d| d % 2 != 0)
        {
            candle_core::bail!(
                "HunyuanVideo 1.5: RoPE axes {:?} must be three even widths summing to the head width {}",
                self.rope_axes_dim,
                self.attention_head_dim
            );
        }
        if self.patch_size == 0 || self.patch_size_t == 0 {
            candle_core::bail!("HunyuanVideo 1.5: the patch sizes must be at least 1");
        }
        let hidden = self.inner_dim() as f64 * self.mlp_ratio;
        if hidden.fract() != 0.0 || hidden < 1.0 {
            candle_core::bail!(
                "HunyuanVideo 1.5: mlp_ratio {} does not give a whole MLP width",
                self.mlp_ratio
            );
        }
        if self.use_meanflow {
            candle_core::bail!(
                "HunyuanVideo 1.5: this transformer is the step-distilled (MeanFlow) release, which Framesmith does \
                 not support yet; use a 480p or 720p T2V / I2V transformer of tencent/HunyuanVideo-1.5"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_sizes_follow_the_8_3b_model() {
        let cfg = HunyuanVideo15Config::hunyuan_video15();
        assert_eq!(cfg.inner_dim(), 2048);
        assert_eq!(cfg.mlp_hidden_dim(), 8192);
        assert_eq!(cfg.patch_dim(), 65);
        assert_eq!(cfg.out_dim(), 32);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn reads_a_diffusers_config_and_refuses_meanflow() -> anyhow::Result<()> {
        let json = r#"{"_class_name": "HunyuanVideo15Transformer3DModel", "_diffusers_version": "0.36.0",
            "attention_head_dim": 128, "image_embed_dim": 1152, "in_channels": 65, "mlp_ratio": 4.0,
            "num_attention_heads": 16, "num_layers": 54, "num_refiner_layers": 2, "out_channels": 32,
            "patch_size": 1, "patch_size_t": 1, "qk_norm": "rms_norm", "rope_axes_dim": [16, 56, 56],
            "rope_theta": 256.0, "target_size": 640, "task_type": "i2v", "text_embed_2_dim": 1472,
            "text_embed_dim": 3584, "use_meanflow": false}"#;
        let cfg = HunyuanVideo15Config::from_json(json)?;
        assert_eq!(cfg, HunyuanVideo15Config::hunyuan_video15());
        let distilled = HunyuanVideo15Config {
            use_meanflow: true,
            ..cfg.clone()
        };
        let err = distilled
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("MeanFlow"), "{err}");
        let bad_axes = HunyuanVideo15Config {
            rope_axes_dim: vec![16, 56, 58],
            ..cfg
        };
        assert!(bad_axes.validate().is_err());
        Ok(())
    }
}
