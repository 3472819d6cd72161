//! Gemma 3's language-model sizes and switches (`Gemma3TextConfig` of transformers): read from a Hugging Face
//! `config.json` in the release's style (`text_config` with `rope_theta`, `rope_local_base_freq`, `rope_scaling`,
//! `sliding_window_pattern`) or transformers 5's (`rope_parameters` per layer type, `layer_types`), or taken from
//! Gemma 3 12B's sizes when a single file carries no config.

use serde_json::Value;

/// Which attention a layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Causal attention over the last `sliding_window` tokens, RoPE with the local base.
    Sliding,
    /// Causal attention over every token, RoPE with the global base and scaling.
    Full,
}

/// RoPE of one layer type: base and the linear scaling factor (positions divided by it; 1: none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    pub linear_factor: f64,
}

/// Gemma 3's language model.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// The attention scores are scaled by `query_pre_attn_scalar^-0.5` (not the head width's).
    pub query_pre_attn_scalar: f64,
    pub rms_norm_eps: f64,
    /// Keys a sliding layer's query sees: the last `sliding_window` positions, itself included.
    pub sliding_window: usize,
    pub layer_types: Vec<LayerType>,
    /// RoPE of the sliding layers.
    pub local_rope: RopeParams,
    /// RoPE of the full layers.
    pub global_rope: RopeParams,
}

impl Gemma3TextConfig {
    /// Gemma 3 12B (`google/gemma-3-12b-it`), LTX-2's text encoder.
    pub fn gemma3_12b() -> Self {
        let layers = 48;
        Self {
            vocab_size: 262_208,
            hidden_size: 3840,
            intermediate_size: 15_360,
            num_hidden_layers: layers,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: 256,
            query_pre_attn_scalar: 256.0,
            rms_norm_eps: 1e-6,
            sliding_window: 1024,
            layer_types: pattern_layer_types(layers, 6),
            local_rope: RopeParams {
                theta: 10_000.0,
                linear_factor: 1.0,
            },
            global_rope: RopeParams {
                theta: 1_000_000.0,
                linear_factor: 8.0,
            },
        }
    }

    /// Whether these are Gemma 3 12B's sizes.
    pub fn is_12b(&self) -> bool {
        let c = Self::gemma3_12b();
        (
            self.hidden_size,
            self.num_hidden_layers,
            self.intermediate_size,
            self.num_attention_heads,
            self.head_dim,
        ) == (
            c.hidden_size,
            c.num_hidden_layers,
            c.intermediate_size,
            c.num_attention_heads,
            c.head_dim,
        )
    }

    /// Reads a Hugging Face `config.json` of Gemma 3 (`Gemma3ForConditionalGeneration`'s, whose `text_config`
    /// holds the language model, or `Gemma3ForCausalLM`'s flat one). Keys absent take transformers' defaults.
    pub fn from_hf_json(text: &str) -> Result<Self, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let t = json.get("text_config").unwrap_or(&json);
        let num = |k: &str, default: f64| t.get(k).and_then(Value::as_f64).unwrap_or(default);
        let size = |k: &str, default: usize| num(k, default as f64) as usize;
        let layers = size("num_hidden_layers", 26);
        let heads = size("num_attention_heads", 8);
        let head_dim = size("head_dim", 256);
        let layer_types = match t.get("layer_types").and_then(Value::as_array) {
            Some(list) => list
                .iter()
                .map(|v| match v.as_str() {
                    Some("sliding_attention") => Ok(LayerType::Sliding),
                    Some("full_attention") => Ok(LayerType::Full),
                    other => Err(format!("unknown layer type {other:?} in layer_types")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => pattern_layer_types(layers, size("sliding_window_pattern", 6)),
        };
        let params = t.get("rope_parameters");
        let rope_of =
            |kind: &str, theta: f64, scaling: Option<&Value>| -> Result<RopeParams, String> {
                let p = params.and_then(|p| p.get(kind)).or(scaling);
                let theta = params
                    .and_then(|p| p.get(kind))
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
                    .unwrap_or(theta);
                let linear_factor = match p.and_then(|p| p.get("rope_type")).and_then(Value::as_str)
                {
                    None | Some("default") => 1.0,
                    Some("linear") => p
                        .and_then(|p| p.get("factor"))
                        .and_then(Value::as_f64)
                        .unwrap_or(1.0),
                    Some(other) => return Err(format!("RoPE type `{other}` of the {kind} layers")),
                };
                Ok(RopeParams {
                    theta,
                    linear_factor,
                })
            };
        let scaling = t.get("rope_scaling").filter(|v| !v.is_null());
        let cfg = Self {
            vocab_size: size("vocab_size", 262_208),
            hidden_size: size("hidden_size", 2304),
            intermediate_size: size("intermediate_size", 9216),
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: size("num_key_value_heads", 4),
            head_dim,
            query_pre_attn_scalar: num("query_pre_attn_scalar", 256.0),
            rms_norm_eps: num("rms_norm_eps", 1e-6),
            sliding_window: size("sliding_window", 4096),
            layer_types,
            local_rope: rope_of(
                "sliding_attention",
                num("rope_local_base_freq", 10_000.0),
                None,
            )?,
            global_rope: rope_of("full_attention", num("rope_theta", 1_000_000.0), scaling)?,
        };
        if let Some(v) = t.get("attn_logit_softcapping").filter(|v| !v.is_null()) {
            return Err(format!("attn_logit_softcapping = {v} (Gemma 3 has none)"));
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the sizes fit together.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.num_key_value_heads == 0 || self.num_attention_heads % self.num_key_value_heads != 0
        {
            problems.push(format!(
                "{} attention heads do not share {} key-value heads evenly",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim % 2 != 0 || self.head_dim == 0 {
            problems.push(format!("head width {} is not even", self.head_dim));
        }
        if self.layer_types.len() != self.num_hidden_layers {
            problems.push(format!(
                "{} layer types for {} layers",
                self.layer_types.len(),
                self.num_hidden_layers
            ));
        }
        if self.sliding_window == 0 {
            problems.push("sliding_window is 0".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!("Gemma 3 config: {}", problems.join("; ")))
        }
    }

    /// The language model's tensors under their names without a prefix, with their shapes and whether each is
    /// a linear weight (for writers of test and benchmark files).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>, bool)> {
        let (h, i, d) = (self.hidden_size, self.intermediate_size, self.head_dim);
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let mut out = vec![(
            "embed_tokens.weight".to_string(),
            vec![self.vocab_size, h],
            false,
        )];
        for layer in 0..self.num_hidden_layers {
            let p = format!("layers.{layer}");
            for (name, rows, cols) in [
                ("q_proj", q, h),
                ("k_proj", kv, h),
                ("v_proj", kv, h),
                ("o_proj", h, q),
            ] {
                out.push((
                    format!("{p}.self_attn.{name}.weight"),
                    vec![rows, cols],
                    true,
                ));
            }
            for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
            {
                out.push((format!("{p}.mlp.{name}.weight"), vec![rows, cols], true));
            }
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![d], false));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![d], false));
            for norm in [
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ] {
                out.push((format!("{p}.{norm}.weight"), vec![h], false));
            }
        }
        out.push(("norm.weight".to_string(), vec![h], false));
        out
    }

    /// The config as a Hugging Face `config.json` (`Gemma3ForConditionalGeneration`'s, in the release's style).
    pub fn to_hf_json(&self) -> String {
        let pattern = self
            .layer_types
            .iter()
            .map(|t| match t {
                LayerType::Sliding => "sliding_attention",
                LayerType::Full => "full_attention",
            })
            .collect::<Vec<_>>();
        serde_json::json!({
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "query_pre_attn_scalar": self.query_pre_attn_scalar,
                "rms_norm_eps": self.rms_norm_eps,
                "sliding_window": self.sliding_window,
                "layer_types": pattern,
                "rope_local_base_freq": self.local_rope.theta,
                "rope_theta": self.global_rope.theta,
                "rope_scaling": {"rope_type": "linear", "factor": self.global_rope.linear_factor},
            }
        })
        .to_string()
    }

    /// The RoPE of a layer of type `kind`.
    pub fn rope(&self, kind: LayerType) -> RopeParams {
        match kind {
            LayerType::Sliding => self.local_rope,
            LayerType::Full => self.global_rope,
        }
    }
}

/// transformers' default layer types: every `pattern`-th layer full, the rest sliding.
fn pattern_layer_types(layers: usize, pattern: usize) -> Vec<LayerType> {
    (0..layers)
        .map(|i| {
            if pattern > 0 && (i + 1) % pattern == 0 {
                LayerType::Full
            } else {
                LayerType::Sliding
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_config_and_transformers_5_config_agree() -> Result<(), String> {
        let release = r#"{"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
            "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
            "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}}"#;
        let cfg = Gemma3TextConfig::from_hf_json(release)?;
        assert_eq!(cfg, Gemma3TextConfig::gemma3_12b());
        assert!(cfg.is_12b());
        let v5 = r#"{"text_config": {"hidden_size": 3840, "intermediate_size": 15360,
            "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8, "sliding_window": 1024,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}}}"#;
        assert_eq!(Gemma3TextConfig::from_hf_json(v5)?, cfg);
        assert_eq!(
            (cfg.layer_types[4], cfg.layer_types[5], cfg.layer_types[47]),
            (LayerType::Sliding, LayerType::Full, LayerType::Full)
        );
        assert_eq!(Gemma3TextConfig::from_hf_json(&cfg.to_hf_json())?, cfg);
        let yarn = release.replace("linear", "yarn");
        assert!(Gemma3TextConfig::from_hf_json(&yarn).is_err_and(|e| e.contains("yarn")));
        Ok(())
    }
}
