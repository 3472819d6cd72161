//! The alphas of a diffusers / PEFT LoRA file, which has no per-module alpha tensor: diffusers'
//! `save_lora_weights` keeps its `LoraConfig` in the `lora_adapter_metadata` header entry (`transformer.lora_alpha`,
//! with exceptions by module path in `transformer.alpha_pattern`), and `load_lora_weights` scales by them. Without
//! that entry the scale is 1 (alpha = rank).

use std::collections::HashMap;

/// The header entry diffusers keeps a LoRA's `LoraConfig` in.
pub const PEFT_METADATA_KEY: &str = "lora_adapter_metadata";

/// The alpha diffusers uses for the module at `module_path` (diffusers' dotted path under the DiT, as the keys
/// name it after `transformer.`), from `metadata`'s `lora_adapter_metadata`; `None` without one (or when it is
/// not a JSON object giving a `lora_alpha`).
pub fn peft_alpha(metadata: &HashMap<String, String>, module_path: &str) -> Option<f64> {
    let config: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(metadata.get(PEFT_METADATA_KEY)?).ok()?;
    let field = |name: &str| {
        config
            .get(&format!("transformer.{name}"))
            .or_else(|| config.get(name))
    };
    let pattern = field("alpha_pattern").and_then(|p| p.as_object());
    let exception = pattern.and_then(|p| {
        p.get(module_path).or_else(|| {
            p.iter()
                .find(|(k, _)| module_path.ends_with(&format!(".{k}")))
                .map(|(_, v)| v)
        })
    });
    exception.or_else(|| field("lora_alpha"))?.as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_alpha_applies_unless_a_pattern_names_the_module() {
        let config = r#"{"transformer.lora_alpha": 16.0, "transformer.alpha_pattern": {"blocks.1.attn1.to_q": 4}}"#;
        let metadata = HashMap::from([(PEFT_METADATA_KEY.to_string(), config.to_string())]);
        assert_eq!(peft_alpha(&metadata, "blocks.0.attn1.to_q"), Some(16.0));
        assert_eq!(peft_alpha(&metadata, "blocks.1.attn1.to_q"), Some(4.0));
        assert_eq!(peft_alpha(&HashMap::new(), "blocks.0.attn1.to_q"), None);
    }
}
