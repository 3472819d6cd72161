//! `framesmith lora inspect`'s norms: the Frobenius norm of each module's weight change `‖ΔW‖` (scale included;
//! DoRA's LoRA part, before its row rescaling, which needs the base weights), summed in squares per block.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use framesmith_nn::adapter::Adapter;
use framesmith_nn::lora_file::LoraFile;

/// `‖ΔW‖` per block, by block group (`blocks`, `double_blocks`, …) then index; modules outside blocks under
/// the group `other`, index 0.
pub type BlockNorms = BTreeMap<String, BTreeMap<usize, f64>>;

/// `‖s · up · down‖_F` without forming the product: `s · √trace((upᵀ up)(down downᵀ))`.
fn lora_norm(up: &Tensor, down: &Tensor, scale: f64) -> Result<f64> {
    let (up, down) = (up.to_dtype(DType::F64)?, down.to_dtype(DType::F64)?);
    let gram_up = up.t()?.matmul(&up)?;
    let gram_down = down.matmul(&down.t()?)?;
    let trace = (gram_up * gram_down.t()?)?.sum_all()?.to_scalar::<f64>()?;
    Ok(scale.abs() * trace.max(0.0).sqrt())
}

fn adapter_norm(adapter: &Adapter) -> Result<f64> {
    match adapter {
        Adapter::Lora(l) => lora_norm(l.up.as_tensor(), l.down.as_tensor(), l.scale()),
        Adapter::Dora(d) => lora_norm(
            d.lora.up.as_tensor(),
            d.lora.down.as_tensor(),
            d.lora.scale(),
        ),
        Adapter::Lokr(_) | Adapter::Loha(_) => {
            let delta = adapter.delta(false)?.context("no weight update")?;
            Ok(delta
                .to_dtype(DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?
                .sqrt())
        }
    }
}

/// The norms per block of the adapter file at `path` (any layout, any kind).
pub fn block_norms(path: &Path) -> Result<BlockNorms> {
    let file = LoraFile::load(path, &Device::Cpu)
        .with_context(|| format!("cannot read the adapter {}", path.display()))?;
    let mut squares: BlockNorms = BTreeMap::new();
    let mut add = |name: &str, norm: f64| {
        let (group, index) = crate::adapter_file::block_of(name).unwrap_or(("other".into(), 0));
        *squares.entry(group).or_default().entry(index).or_default() += norm * norm;
    };
    for m in &file.modules {
        let rank = m.down.dim(0)?;
        add(&m.name, lora_norm(&m.up, &m.down, m.alpha / rank as f64)?);
    }
    for m in &file.adapters {
        add(&m.name, adapter_norm(&m.adapter(&Device::Cpu)?)?);
    }
    for blocks in squares.values_mut() {
        for v in blocks.values_mut() {
            *v = v.sqrt();
        }
    }
    Ok(squares)
}
