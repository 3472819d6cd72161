//! Sizes of the FLUX.1 DiT (`FluxParams` of the official `model.py`), with the released variants as named
//! constructors and a reader for the official parameter names (a fixture's `config.json` `init`).

use serde::Deserialize;

/// Constructor arguments of the official `Flux` module.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FluxConfig {
    /// Width of a packed latent token (16 channels × 2 × 2 = 64).
    pub in_channels: usize,
    /// Width of a predicted token.
    pub out_channels: usize,
    /// Width of the pooled text vector (CLIP-L: 768).
    pub vec_in_dim: usize,
    /// Width of a text token (T5-XXL: 4096).
    pub context_in_dim: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width over model width.
    pub mlp_ratio: f64,
    /// Attention heads.
    pub num_heads: usize,
    /// Double-stream blocks.
    pub depth: usize,
    /// Single-stream blocks.
    pub depth_single_blocks: usize,
    /// RoPE widths of the (t, h, w) id axes; they sum to the head dimension.
    pub axes_dim: Vec<usize>,
    /// RoPE base.
    pub theta: f64,
    /// Whether the attention `qkv` projections have a bias.
    pub qkv_bias: bool,
    /// Whether the model takes a guidance strength (`guidance_in`; dev and Kontext, not schnell).
    pub guidance_embed: bool,
}

impl FluxConfig {
    /// FLUX.1-dev (also FLUX.1-Kontext-dev and Krea-dev, which share its shapes).
    pub fn dev() -> Self {
        Self {
            in_channels: 64,
            out_channels: 64,
            vec_in_dim: 768,
            context_in_dim: 4096,
            hidden_size: 3072,
            mlp_ratio: 4.0,
            num_heads: 24,
            depth: 19,
            depth_single_blocks: 38,
            axes_dim: vec![16, 56, 56],
            theta: 10_000.0,
            qkv_bias: true,
            guidance_embed: true,
        }
    }

    /// FLUX.1-schnell: dev without the guidance embedding.
    pub fn schnell() -> Self {
        Self {
            guidance_embed: false,
            ..Self::dev()
        }
    }

    /// Reads the official `FluxParams` names from JSON (e.g. a fixture's `init` object).
    pub fn from_json(json: &str) -> serde_json::Result<Self> {
        serde_json::from_str(json)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads.max(1)
    }

    /// Hidden width of the MLPs (`int(hidden_size * mlp_ratio)` officially).
    pub fn mlp_hidden_dim(&self) -> usize {
        (self.hidden_size as f64 * self.mlp_ratio) as usize
    }

    /// Checks what the official constructor asserts: the head dimension divides the width and the RoPE axes
    /// sum to it.
    pub fn validate(&self) -> candle_core::Result<()> {
        if self.num_heads == 0 || self.hidden_size % self.num_heads != 0 {
            candle_core::bail!(
                "FLUX: hidden size {} is not divisible by {} heads",
                self.hidden_size,
                self.num_heads
            );
        }
        let axes: usize = self.axes_dim.iter().sum();
        if axes != self.head_dim() || self.axes_dim.iter().any(|d| d % 2 != 0) {
            candle_core::bail!(
                "FLUX: RoPE axes {:?} must be even and sum to the head dimension {}",
                self.axes_dim,
                self.head_dim()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_sizes_follow_the_official_params() {
        let cfg = FluxConfig::dev();
        assert_eq!(cfg.head_dim(), 128);
        assert_eq!(cfg.mlp_hidden_dim(), 12_288);
        assert!(cfg.validate().is_ok());
        assert!(!FluxConfig::schnell().guidance_embed);
    }

    #[test]
    fn reads_the_official_names() -> anyhow::Result<()> {
        let json = r#"{"in_channels": 64, "out_channels": 64, "vec_in_dim": 32, "context_in_dim": 32,
            "hidden_size": 32, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 2,
            "axes_dim": [4, 6, 6], "theta": 10000, "qkv_bias": true, "guidance_embed": false}"#;
        let cfg = FluxConfig::from_json(json)?;
        assert_eq!(cfg.head_dim(), 16);
        assert!(cfg.validate().is_ok());
        let bad = FluxConfig {
            axes_dim: vec![4, 6, 4],
            ..cfg
        };
        assert!(bad.validate().is_err());
        Ok(())
    }
}
