//! Sizes of the Qwen2.5-VL language model (`Qwen2_5_VLTextConfig` of transformers), read from a Hugging Face
//! `config.json` in either layout (transformers 4: text fields at the top, `rope_theta` and
//! `rope_scaling.mrope_section`; transformers 5: under `text_config`, with `rope_parameters`), or given as the
//! released 7B model's.

use serde_json::Value;

/// The language model's sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen25VlTextConfig {
    /// Rows of `embed_tokens`.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Multimodal RoPE's split of the frequencies into (time, height, width) parts; for text all three positions
    /// are equal, so the split does not change the result, but it must cover `head_dim / 2` frequencies.
    pub mrope_section: Vec<usize>,
}

/// Why a `config.json` is not a Qwen2.5-VL language model's.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config.json has no `{0}` (neither at the top nor under `text_config`)")]
    Missing(&'static str),
    #[error("config.json describes an impossible model: {0}")]
    Invalid(String),
}

impl Qwen25VlTextConfig {
    /// Qwen2.5-VL-7B-Instruct's language model, the text encoder of Qwen-Image and HunyuanVideo 1.5.
    pub fn qwen25_vl_7b() -> Self {
        Self {
            vocab_size: 152_064,
            hidden_size: 3584,
            intermediate_size: 18_944,
            num_hidden_layers: 28,
            num_attention_heads: 28,
            num_key_value_heads: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            mrope_section: vec![16, 24, 24],
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Whether these are the released 7B sizes.
    pub fn is_7b(&self) -> bool {
        let r = Self::qwen25_vl_7b();
        (
            self.hidden_size,
            self.num_hidden_layers,
            self.num_key_value_heads,
        ) == (r.hidden_size, r.num_hidden_layers, r.num_key_value_heads)
    }

    /// The language model's tensors under their names without a prefix (`embed_tokens.weight`,
    /// `layers.{i}.self_attn.q_proj.weight`, ..., `norm.weight`), in module order: (name, shape, whether it is a
    /// linear's weight). `lm_head` is left out, as text encoding never reads it.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>, bool)> {
        let (h, i, d) = (self.hidden_size, self.intermediate_size, self.head_dim());
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let mut out = vec![(
            "embed_tokens.weight".to_string(),
            vec![self.vocab_size, h],
            false,
        )];
        for layer in 0..self.num_hidden_layers {
            let p = format!("layers.{layer}");
            out.push((format!("{p}.input_layernorm.weight"), vec![h], false));
            for (name, rows, cols, bias) in [
                ("q_proj", q, h, true),
                ("k_proj", kv, h, true),
                ("v_proj", kv, h, true),
                ("o_proj", h, q, false),
            ] {
                out.push((
                    format!("{p}.self_attn.{name}.weight"),
                    vec![rows, cols],
                    true,
                ));
                if bias {
                    out.push((format!("{p}.self_attn.{name}.bias"), vec![rows], false));
                }
            }
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                vec![h],
                false,
            ));
            for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
            {
                out.push((format!("{p}.mlp.{name}.weight"), vec![rows, cols], true));
            }
        }
        out.push(("norm.weight".to_string(), vec![h], false));
        out
    }

    /// Reads a Hugging Face `config.json` (of `Qwen2_5_VLForConditionalGeneration` or of the text model alone).
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        let root: Value = serde_json::from_str(text)?;
        let field = |name: &'static str| -> Option<&Value> {
            root.get("text_config")
                .and_then(|t| t.get(name))
                .or_else(|| root.get(name))
        };
        let size = |name: &'static str| -> Result<usize, ConfigError> {
            field(name)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or(ConfigError::Missing(name))
        };
        let rope = field("rope_parameters").or_else(|| field("rope_scaling"));
        let rope_theta = rope
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| field("rope_theta"))
            .and_then(Value::as_f64)
            .ok_or(ConfigError::Missing("rope_theta"))?;
        let mrope_section = rope
            .and_then(|r| r.get("mrope_section"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|v| v as usize)
                    .collect()
            })
            .unwrap_or_else(|| vec![16, 24, 24]);
        let num_attention_heads = size("num_attention_heads")?;
        let cfg = Self {
            vocab_size: size("vocab_size")?,
            hidden_size: size("hidden_size")?,
            intermediate_size: size("intermediate_size")?,
            num_hidden_layers: size("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: size("num_key_value_heads").unwrap_or(num_attention_heads),
            rms_norm_eps: field("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            mrope_section,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that heads divide the width, key/value heads divide the heads, and the RoPE split covers half a
    /// head.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.num_attention_heads == 0 || self.hidden_size % self.num_attention_heads != 0 {
            return invalid(format!(
                "{} heads do not divide the width {}",
                self.num_attention_heads, self.hidden_size
            ));
        }
        if self.num_key_value_heads == 0 || self.num_attention_heads % self.num_key_value_heads != 0
        {
            return invalid(format!(
                "{} key/value heads do not divide {} heads",
                self.num_key_value_heads, self.num_attention_heads
            ));
        }
        let half = self.head_dim() / 2;
        if self.head_dim() % 2 != 0 || self.mrope_section.iter().sum::<usize>() != half {
            return invalid(format!(
                "mrope_section {:?} does not cover the {half} frequencies of a head of {}",
                self.mrope_section,
                self.head_dim()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_config_layouts_read_as_the_7b_model() -> anyhow::Result<()> {
        let v4 = r#"{"architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "vocab_size": 152064,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}"#;
        let v5 = r#"{"model_type": "qwen2_5_vl", "text_config": {"hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
            "vocab_size": 152064, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
            "mrope_section": [16, 24, 24]}}, "vision_config": {"hidden_size": 1280}}"#;
        for text in [v4, v5] {
            let cfg = Qwen25VlTextConfig::from_hf_json(text)?;
            assert_eq!(cfg, Qwen25VlTextConfig::qwen25_vl_7b());
            assert!(cfg.is_7b());
        }
        Ok(())
    }

    #[test]
    fn a_rope_split_that_misses_frequencies_is_refused() {
        let text = r#"{"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 10, "rope_theta": 10000.0,
            "rope_scaling": {"mrope_section": [16, 24, 24]}}"#;
        let err = Qwen25VlTextConfig::from_hf_json(text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("mrope_section"), "{err}");
    }

    /// The names and shapes the model is built from are the official model's: transformers' state dict of the
    /// fixture's model (`bench/reference/qwen25vl.py`), language model only.
    #[test]
    fn tensor_shapes_are_the_official_state_dicts() -> anyhow::Result<()> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen25vl");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let cfg = Qwen25VlTextConfig::from_hf_json(&json["text_config"].to_string())?;
        let weights = candle_core::safetensors::load(
            dir.join("weights.safetensors"),
            &candle_core::Device::Cpu,
        )?;
        let mut official: Vec<(String, Vec<usize>)> = weights
            .iter()
            .filter_map(|(name, t)| {
                let name = name.strip_prefix("model.language_model.")?;
                Some((name.to_string(), t.dims().to_vec()))
            })
            .collect();
        let mut ours: Vec<(String, Vec<usize>)> = cfg
            .tensor_shapes()
            .into_iter()
            .map(|(n, s, _)| (n, s))
            .collect();
        official.sort();
        ours.sort();
        assert_eq!(ours, official);
        let seven_b = Qwen25VlTextConfig::qwen25_vl_7b().tensor_shapes();
        let parameters: usize = seven_b
            .iter()
            .map(|(_, s, _)| s.iter().product::<usize>())
            .sum();
        assert_eq!(parameters, 7_070_619_136);
        Ok(())
    }
}
