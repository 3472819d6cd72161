//! `framesmith lora resize`: each LoRA (and DoRA's LoRA part) cut to a lower rank by the SVD of its `up · down`,
//! the best approximation of that rank (Eckart–Young): the squared error is the sum of the dropped singular
//! values squared. The SVD runs on the factors, never on the full `[out, in]` product (`svd.rs`). Alpha is rescaled with the rank so alpha / rank, the
//! scale, stays. Modules already at or under the rank are copied unchanged (bit for bit), so resizing to the
//! same rank changes nothing. LoKr and LoHa are refused: their factors have no rank an SVD can cut.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use framesmith_nn::lora_file::RawTensors;

use super::svd::FactorSvd;

/// What resizing kept of one module.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleResize {
    /// The module's name in the file.
    pub module: String,
    pub rank_before: usize,
    pub rank_after: usize,
    /// Kept share of `‖up · down‖²` (1 for a module copied unchanged).
    pub energy: f64,
}

/// What a resize did.
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeReport {
    pub modules: Vec<ModuleResize>,
    /// Kept share of the whole adapter's `Σ ‖scale · up · down‖²`.
    pub overall_energy: f64,
}

impl ResizeReport {
    /// The smallest and the mean kept energy over the modules that were cut (`None` when none was).
    pub fn cut_energy(&self) -> Option<(f64, f64)> {
        let cut: Vec<f64> = self
            .modules
            .iter()
            .filter(|m| m.rank_after < m.rank_before)
            .map(|m| m.energy)
            .collect();
        let min = cut.iter().copied().reduce(f64::min)?;
        Some((min, cut.iter().sum::<f64>() / cut.len() as f64))
    }
}

/// Names a module's down / up tensors take (musubi-tuner's, then PEFT's).
const DOWN: [&str; 2] = ["lora_down.weight", "lora_A.weight"];
const UP: [&str; 2] = ["lora_up.weight", "lora_B.weight"];

/// Resizes every LoRA / DoRA module of `input` to at most `rank` and writes `output` (same keys, dtypes and
/// metadata).
pub fn resize(input: &Path, output: &Path, rank: usize) -> Result<ResizeReport> {
    if rank == 0 {
        bail!("--rank must be at least 1");
    }
    super::refuse_same_file(input, output, "resize")?;
    let mut raw = RawTensors::read(input).context("cannot read the adapter")?;
    if raw.metadata.contains_key("lora_adapter_metadata") {
        bail!(
            "this diffusers / PEFT file keeps its alphas in its metadata; convert it with `framesmith lora convert \
             --to musubi` first, then resize: {}",
            input.display()
        );
    }
    let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, _) in &raw.tensors {
        let (module, part) = crate::adapter_file::split(key)
            .with_context(|| format!("`{key}` is not an adapter tensor: {}", input.display()))?;
        modules
            .entry(module.to_string())
            .or_default()
            .push(part.to_string());
    }
    let mut report = Vec::with_capacity(modules.len());
    let (mut kept_total, mut total) = (0.0, 0.0);
    for (module, parts) in &modules {
        let kind = parts.iter().find_map(|p| match p.split('_').next() {
            Some("lokr") => Some("LoKr"),
            Some("hada") => Some("LoHa"),
            _ => None,
        });
        if let Some(kind) = kind {
            bail!(
                "`{module}` is a {kind} module; resize cuts the rank of LoRA and DoRA modules only: {}",
                input.display()
            );
        }
        let cut = resize_module(&mut raw, module, parts, rank)
            .with_context(|| format!("cannot resize `{module}` of {}", input.display()))?;
        kept_total += cut.scaled_kept;
        total += cut.scaled_total;
        report.push(cut.resize);
    }
    raw.write(output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(ResizeReport {
        modules: report,
        overall_energy: if total > 0.0 { kept_total / total } else { 1.0 },
    })
}

struct Cut {
    resize: ModuleResize,
    /// Kept and total `Σσ²` times the scale squared.
    scaled_kept: f64,
    scaled_total: f64,
}

fn key(module: &str, parts: &[String], names: [&str; 2]) -> Result<String> {
    names
        .iter()
        .find(|n| parts.iter().any(|p| p == *n))
        .map(|n| format!("{module}.{n}"))
        .with_context(|| format!("no {} tensor", names.join(" / ")))
}

fn set(raw: &mut RawTensors, key: &str, value: Tensor) {
    if let Some(slot) = raw.tensors.iter_mut().find(|(k, _)| k == key) {
        slot.1 = value;
    }
}

/// Cuts one module to `rank` in `raw` (its factors and alpha replaced), or leaves it as it is when it is no
/// larger.
fn resize_module(raw: &mut RawTensors, module: &str, parts: &[String], rank: usize) -> Result<Cut> {
    let down_key = key(module, parts, DOWN)?;
    let up_key = key(module, parts, UP)?;
    let alpha_key = format!("{module}.alpha");
    let (down, up) = match (raw.get(&down_key), raw.get(&up_key)) {
        (Some(d), Some(u)) => (d.clone(), u.clone()),
        _ => bail!("no down / up pair"),
    };
    let alpha = raw.get(&alpha_key).cloned();
    let r = down.dim(0)?;
    let alpha_value = match &alpha {
        Some(a) => a
            .flatten_all()?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?
            .first()
            .copied()
            .unwrap_or(r as f64),
        None => r as f64,
    };
    let scale2 = (alpha_value / r as f64).powi(2);
    let svd = FactorSvd::new(&up, &down)?;
    let k = rank.min(r);
    let (kept, total) = svd.energy(k);
    let resize = ModuleResize {
        module: module.to_string(),
        rank_before: r,
        rank_after: k,
        energy: if total > 0.0 { kept / total } else { 1.0 },
    };
    if k < r {
        let (new_up, new_down) = svd.truncated(&up, &down, k)?;
        set(raw, &up_key, new_up.to_dtype(up.dtype())?);
        set(raw, &down_key, new_down.to_dtype(down.dtype())?);
        if let Some(a) = alpha {
            let scaled = Tensor::new(alpha_value * k as f64 / r as f64, &Device::Cpu)?
                .to_dtype(a.dtype())?
                .reshape(a.shape())?;
            set(raw, &alpha_key, scaled);
        }
    }
    Ok(Cut {
        resize,
        scaled_kept: kept * scale2,
        scaled_total: total * scale2,
    })
}
