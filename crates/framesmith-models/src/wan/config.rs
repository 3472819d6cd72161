//! `WanConfig`: the hyper-parameters of every Wan DiT variant, with named constructors and the official
//! `config.json` reader. Pure data: no tensors, no I/O beyond parsing a string.

use serde::{Deserialize, Serialize};

/// Which conditioning the model takes (`model_type` in the official code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelType {
    /// Text to video.
    T2v,
    /// Image to video: 20 extra conditioning channels (and, in Wan 2.1, CLIP image tokens).
    I2v,
    /// Wan 2.2 text-image to video (5B): 48-channel latents, per-token timesteps.
    Ti2v,
}

/// Official code generation a checkpoint belongs to. It changes two details of the forward pass: Wan 2.1's I2V
/// has CLIP image tokens with their own keys and values, and Wan 2.2 embeds the timestep per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Generation {
    Wan21,
    Wan22,
}

/// Which expert of a Wan 2.2 A14B pair a checkpoint is, when it is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expert {
    HighNoise,
    LowNoise,
}

/// Hyper-parameters of a Wan DiT, named as in the official `WanModel.__init__`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WanConfig {
    pub generation: Generation,
    pub model_type: ModelType,
    pub patch_size: [usize; 3],
    pub text_len: usize,
    pub in_dim: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub freq_dim: usize,
    pub text_dim: usize,
    pub out_dim: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub qk_norm: bool,
    pub cross_attn_norm: bool,
    pub eps: f64,
    /// Width of the CLIP image features fed to `img_emb` (Wan 2.1 I2V only).
    pub clip_dim: usize,
    /// Number of CLIP image tokens prepended to the text context (Wan 2.1 I2V only).
    pub clip_tokens: usize,
    /// Wan 2.2 A14B: the timestep (in 0..1000) at and above which the high-noise expert is used.
    pub expert_boundary: Option<f64>,
}

/// Error from reading a `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigJsonError {
    #[error("not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("missing key `{0}`")]
    MissingKey(&'static str),
    #[error("unknown model_type `{0}` (expected t2v, i2v or ti2v)")]
    ModelType(String),
    #[error("dim {dim} is not divisible by num_heads {num_heads}")]
    Heads { dim: usize, num_heads: usize },
}

impl WanConfig {
    fn base(generation: Generation, model_type: ModelType) -> Self {
        Self {
            generation,
            model_type,
            patch_size: [1, 2, 2],
            text_len: 512,
            in_dim: 16,
            dim: 5120,
            ffn_dim: 13824,
            freq_dim: 256,
            text_dim: 4096,
            out_dim: 16,
            num_heads: 40,
            num_layers: 40,
            qk_norm: true,
            cross_attn_norm: true,
            eps: 1e-6,
            clip_dim: 1280,
            clip_tokens: 257,
            expert_boundary: None,
        }
    }

    /// Wan2.1 T2V-1.3B.
    pub fn wan21_t2v_1_3b() -> Self {
        Self {
            dim: 1536,
            ffn_dim: 8960,
            num_heads: 12,
            num_layers: 30,
            ..Self::base(Generation::Wan21, ModelType::T2v)
        }
    }

    /// Wan2.1 T2V-14B.
    pub fn wan21_t2v_14b() -> Self {
        Self::base(Generation::Wan21, ModelType::T2v)
    }

    /// Wan2.1 I2V-14B (480p and 720p share the architecture).
    pub fn wan21_i2v_14b() -> Self {
        Self {
            in_dim: 36,
            ..Self::base(Generation::Wan21, ModelType::I2v)
        }
    }

    /// One expert of Wan2.2 T2V-A14B (both experts share the architecture; boundary 0.875).
    pub fn wan22_t2v_a14b() -> Self {
        Self {
            expert_boundary: Some(875.0),
            ..Self::base(Generation::Wan22, ModelType::T2v)
        }
    }

    /// One expert of Wan2.2 I2V-A14B (no CLIP tokens; boundary 0.900).
    pub fn wan22_i2v_a14b() -> Self {
        Self {
            in_dim: 36,
            expert_boundary: Some(900.0),
            ..Self::base(Generation::Wan22, ModelType::I2v)
        }
    }

    /// Wan2.2 TI2V-5B.
    pub fn wan22_ti2v_5b() -> Self {
        Self {
            in_dim: 48,
            out_dim: 48,
            dim: 3072,
            ffn_dim: 14336,
            num_heads: 24,
            num_layers: 30,
            ..Self::base(Generation::Wan22, ModelType::Ti2v)
        }
    }

    /// A tiny Wan2.1 T2V-shaped model for the CPU demo and tests.
    pub fn tiny(num_layers: usize) -> Self {
        Self {
            text_len: 16,
            dim: 64,
            ffn_dim: 128,
            freq_dim: 32,
            text_dim: 32,
            num_heads: 2,
            num_layers,
            ..Self::base(Generation::Wan21, ModelType::T2v)
        }
    }

    /// Every named variant, with the name used on the command line.
    pub fn named_variants() -> Vec<(&'static str, WanConfig)> {
        vec![
            ("t2v-1.3b", Self::wan21_t2v_1_3b()),
            ("t2v-14b", Self::wan21_t2v_14b()),
            ("i2v-14b", Self::wan21_i2v_14b()),
            ("t2v-a14b", Self::wan22_t2v_a14b()),
            ("i2v-a14b", Self::wan22_i2v_a14b()),
            ("ti2v-5b", Self::wan22_ti2v_5b()),
        ]
    }

    /// Looks a variant up by its command-line name (`t2v-1.3b`, `t2v-14b`, `i2v-14b`, `t2v-a14b`, `i2v-a14b`,
    /// `ti2v-5b`).
    pub fn by_name(name: &str) -> Option<Self> {
        Self::named_variants()
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, c)| c)
    }

    /// Reads an official `config.json` (the Wan-AI repositories' diffusers-style file), or a fixture `config.json`
    /// whose `init` object holds the constructor arguments. `generation` decides the Wan 2.1 / 2.2 details the file
    /// does not record (TI2V implies Wan 2.2).
    pub fn from_json(text: &str, generation: Generation) -> Result<Self, ConfigJsonError> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        let obj = value.get("init").unwrap_or(&value);
        let usize_key = |key: &'static str| -> Result<Option<usize>, ConfigJsonError> {
            Ok(obj.get(key).and_then(|v| v.as_u64()).map(|v| v as usize))
        };
        let model_type = match obj
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("t2v")
        {
            "t2v" => ModelType::T2v,
            "i2v" | "flf2v" => ModelType::I2v,
            "ti2v" => ModelType::Ti2v,
            other => return Err(ConfigJsonError::ModelType(other.to_string())),
        };
        let generation = if model_type == ModelType::Ti2v {
            Generation::Wan22
        } else {
            generation
        };
        let mut cfg = Self::base(generation, model_type);
        cfg.dim = usize_key("dim")?.ok_or(ConfigJsonError::MissingKey("dim"))?;
        cfg.num_heads = usize_key("num_heads")?.ok_or(ConfigJsonError::MissingKey("num_heads"))?;
        cfg.num_layers =
            usize_key("num_layers")?.ok_or(ConfigJsonError::MissingKey("num_layers"))?;
        cfg.ffn_dim = usize_key("ffn_dim")?.ok_or(ConfigJsonError::MissingKey("ffn_dim"))?;
        for (key, field) in [
            ("text_len", &mut cfg.text_len),
            ("in_dim", &mut cfg.in_dim),
            ("freq_dim", &mut cfg.freq_dim),
            ("text_dim", &mut cfg.text_dim),
            ("out_dim", &mut cfg.out_dim),
        ] {
            if let Some(v) = usize_key(key)? {
                *field = v;
            }
        }
        if let Some(p) = obj.get("patch_size").and_then(|v| v.as_array()) {
            for (slot, v) in cfg.patch_size.iter_mut().zip(p) {
                *slot = v.as_u64().unwrap_or(1) as usize;
            }
        }
        if let Some(v) = obj.get("qk_norm").and_then(|v| v.as_bool()) {
            cfg.qk_norm = v;
        }
        if let Some(v) = obj.get("cross_attn_norm").and_then(|v| v.as_bool()) {
            cfg.cross_attn_norm = v;
        }
        if let Some(v) = obj.get("eps").and_then(|v| v.as_f64()) {
            cfg.eps = v;
        }
        if cfg.num_heads == 0 || cfg.dim % cfg.num_heads != 0 {
            return Err(ConfigJsonError::Heads {
                dim: cfg.dim,
                num_heads: cfg.num_heads,
            });
        }
        Ok(cfg)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.num_heads
    }

    /// The Wan2.2 A14B expert boundary in timesteps (0..1000): the low-noise expert denoises below it. `fraction`
    /// of the timesteps when given (a config's or the command line's), else the config's own, else the official
    /// value for the task (875 text-to-video, 900 image-to-video).
    pub fn boundary_timestep(&self, fraction: Option<f64>) -> f64 {
        fraction.map_or_else(
            || {
                self.expert_boundary.unwrap_or(match self.model_type {
                    ModelType::I2v => 900.0,
                    _ => 875.0,
                })
            },
            |b| b * 1000.0,
        )
    }

    /// Whether the model has Wan 2.1's CLIP image branch (`img_emb`, `k_img`, `v_img`).
    pub fn has_clip(&self) -> bool {
        self.generation == Generation::Wan21 && self.model_type == ModelType::I2v
    }

    /// Whether the timestep embedding is computed per token (Wan 2.2).
    pub fn per_token_time(&self) -> bool {
        self.generation == Generation::Wan22
    }

    /// Number of latent channels the model denoises (the output channels).
    pub fn latent_channels(&self) -> usize {
        self.out_dim
    }

    /// Number of parameters of the DiT (weights and biases), for sizes and the planner.
    pub fn parameter_count(&self) -> u64 {
        let d = self.dim as u64;
        let f = self.ffn_dim as u64;
        let patch = self.patch_size.iter().product::<usize>() as u64;
        let lin = |i: u64, o: u64| i * o + o;
        let mut block =
            4 * lin(d, d) + 4 * lin(d, d) + lin(d, f) + lin(f, d) + 6 * d + 4 * d + 2 * d;
        if self.has_clip() {
            block += 2 * lin(d, d) + d;
        }
        let mut total = block * self.num_layers as u64;
        total += lin(self.in_dim as u64 * patch, d);
        total += lin(self.text_dim as u64, d) + lin(d, d);
        total += lin(self.freq_dim as u64, d) + lin(d, d) + lin(d, 6 * d);
        total += lin(d, self.out_dim as u64 * patch) + 2 * d;
        if self.has_clip() {
            let c = self.clip_dim as u64;
            total += 2 * c + lin(c, c) + lin(c, d) + 2 * d;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_match_published_sizes() {
        let billions = |c: WanConfig| c.parameter_count() as f64 / 1e9;
        assert!((billions(WanConfig::wan21_t2v_1_3b()) - 1.42).abs() < 0.05);
        assert!((billions(WanConfig::wan21_t2v_14b()) - 14.29).abs() < 0.1);
        assert!((billions(WanConfig::wan22_ti2v_5b()) - 5.0).abs() < 0.1);
    }

    #[test]
    fn reads_official_config_json() -> Result<(), ConfigJsonError> {
        let text = r#"{"_class_name":"WanModel","dim":5120,"eps":1e-06,"ffn_dim":13824,"freq_dim":256,
            "in_dim":36,"model_type":"i2v","num_heads":40,"num_layers":40,"out_dim":16,"text_len":512}"#;
        let cfg = WanConfig::from_json(text, Generation::Wan21)?;
        assert_eq!(cfg, WanConfig::wan21_i2v_14b());
        Ok(())
    }

    #[test]
    fn rejects_bad_heads() {
        let text = r#"{"dim":100,"num_heads":3,"num_layers":1,"ffn_dim":8}"#;
        assert!(matches!(
            WanConfig::from_json(text, Generation::Wan21),
            Err(ConfigJsonError::Heads { .. })
        ));
    }
}
