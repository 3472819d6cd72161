//! The diffusers / PEFT side of a conversion: `transformer.{module}.lora_A.weight` / `lora_B.weight` keys, and the
//! alphas in the `lora_adapter_metadata` header entry as diffusers' `save_lora_weights` writes it and
//! `load_lora_weights` reads it into PEFT's `LoraConfig` (`transformer.r`, `transformer.lora_alpha`, the
//! `rank_pattern` / `alpha_pattern` exceptions, `target_modules`). Without that entry diffusers uses scale 1
//! (alpha = rank), and so do we.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use framesmith_nn::lora_file::peft_alpha;
use serde_json::{json, Map, Value};

use super::Modules;

/// The header entry diffusers keeps a LoRA's `LoraConfig` in.
pub(super) use framesmith_nn::lora_file::PEFT_METADATA_KEY as METADATA_KEY;

/// The component prefix of a pipeline's DiT, on keys and on the config's entries.
const PREFIX: &str = "transformer.";

/// Adds an `alpha` (f32 scalar) from `metadata`'s `lora_adapter_metadata` to each module (diffusers' module
/// path) that has none.
pub(super) fn add_alphas(modules: &mut Modules, metadata: &HashMap<String, String>) -> Result<()> {
    for (path, parts) in modules.iter_mut() {
        if parts.contains_key("alpha") {
            continue;
        }
        if let Some(alpha) = peft_alpha(metadata, path) {
            parts.insert("alpha".into(), Tensor::new(alpha as f32, &Device::Cpu)?);
        }
    }
    Ok(())
}

/// A module's rank (rows of `lora_down`) and alpha (the rank when it has none).
fn rank_alpha(path: &str, parts: &BTreeMap<String, Tensor>) -> Result<(usize, f64)> {
    let down = parts
        .get("lora_down.weight")
        .with_context(|| format!("`{path}` has no lora_down / lora_A"))?;
    let rank = down.dim(0)?;
    let alpha = match parts.get("alpha") {
        Some(a) => a
            .flatten_all()?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?
            .first()
            .copied()
            .unwrap_or(rank as f64),
        None => rank as f64,
    };
    Ok((rank, alpha))
}

/// The most frequent value (the smallest among equals), as diffusers picks `r` and `lora_alpha`.
fn most_common<T: Ord + Copy>(values: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(v, _)| *v)
}

/// The `lora_adapter_metadata` JSON for `modules` (diffusers' module paths).
pub(super) fn metadata(modules: &Modules) -> Result<String> {
    let mut ranks = BTreeMap::new();
    let mut alphas = BTreeMap::new();
    for (path, parts) in modules {
        let (rank, alpha) = rank_alpha(path, parts)?;
        ranks.insert(path.clone(), rank);
        alphas.insert(path.clone(), alpha);
    }
    let r = most_common(ranks.values().copied()).unwrap_or(0);
    // f64 bits order like the values for the positive alphas files hold; the most common one is compared exactly.
    let alpha_bits = most_common(alphas.values().map(|a| a.to_bits())).unwrap_or(0);
    let lora_alpha = f64::from_bits(alpha_bits);
    let rank_pattern: Map<String, Value> = ranks
        .iter()
        .filter(|(_, v)| **v != r)
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let alpha_pattern: Map<String, Value> = alphas
        .iter()
        .filter(|(_, v)| v.to_bits() != alpha_bits)
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let targets: Vec<&String> = modules.keys().collect();
    let config = json!({
        format!("{PREFIX}r"): r,
        format!("{PREFIX}lora_alpha"): lora_alpha,
        format!("{PREFIX}rank_pattern"): rank_pattern,
        format!("{PREFIX}alpha_pattern"): alpha_pattern,
        format!("{PREFIX}target_modules"): targets,
    });
    Ok(serde_json::to_string(&config)?)
}

/// The tensors under diffusers' keys (`transformer.{module}.lora_A.weight`, `lora_B.weight`; alphas left to the
/// metadata).
pub(super) fn tensors(modules: Modules) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    for (path, parts) in modules {
        for (suffix, t) in parts {
            let key = match suffix.as_str() {
                "lora_down.weight" => "lora_A.weight",
                "lora_up.weight" => "lora_B.weight",
                _ => continue,
            };
            out.push((format!("{PREFIX}{path}.{key}"), t));
        }
    }
    out
}
