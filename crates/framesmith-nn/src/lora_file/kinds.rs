//! LoKr, LoHa and DoRA modules in LoRA files, in the layout ComfyUI and LyCORIS read (`{module}.lokr_w1`,
//! `.lokr_w2_a`, `.hada_w1_a`, `.lora_down.weight` with `.dora_scale`, and `.alpha`): reading them, copying them
//! into a run's adapters (resume, `lora.init_from`) and attaching them to a model (generation).

use candle_core::{DType, Device, Tensor, Var};

use super::{FileResult, LoraFileError};
use crate::adapter::Adapter;
use crate::linear::Linear;

/// The tensor names (after the module name) of the adapters other than plain LoRA.
pub(super) const KIND_SUFFIXES: [&str; 11] = [
    "lokr_w1",
    "lokr_w1_a",
    "lokr_w1_b",
    "lokr_w2",
    "lokr_w2_a",
    "lokr_w2_b",
    "hada_w1_a",
    "hada_w1_b",
    "hada_w2_a",
    "hada_w2_b",
    "dora_scale",
];

/// One LoKr, LoHa or DoRA module read from a file.
#[derive(Clone, Debug)]
pub struct LoadedAdapter {
    /// musubi-tuner's name, `lora_unet_…`.
    pub name: String,
    /// The module path, where the file's names give it.
    pub path: Option<String>,
    /// The tensors by their name after the module (`lokr_w1`, `lora_down.weight`, `dora_scale`, …), dtype as
    /// stored.
    pub tensors: Vec<(String, Tensor)>,
    /// From the file (`None` when it has none: the rank, scale 1).
    pub alpha: Option<f64>,
}

impl LoadedAdapter {
    /// The adapter these tensors make, in new variables on `device` (its kind from the tensor names).
    pub fn adapter(&self, device: &Device) -> candle_core::Result<Adapter> {
        Adapter::from_tensors(&self.tensors, self.alpha, device)
    }

    /// `lokr`, `loha` or `dora`.
    pub fn kind_name(&self) -> &'static str {
        let has = |prefix: &str| self.tensors.iter().any(|(n, _)| n.starts_with(prefix));
        if has("lokr_") {
            "lokr"
        } else if has("hada_") {
            "loha"
        } else {
            "dora"
        }
    }

    /// The tensor named `suffix`.
    pub fn tensor(&self, suffix: &str) -> Option<&Tensor> {
        self.tensors
            .iter()
            .find(|(n, _)| n == suffix)
            .map(|(_, t)| t)
    }
}

/// Copies `loaded`'s tensors into `ours` (a run's adapter of module `name`): the file must hold the same kind
/// with every tensor of the same shape, and the same alpha.
pub(super) fn copy_into(ours: &Adapter, loaded: &LoadedAdapter, name: &str) -> FileResult<()> {
    let mismatch = |reason: String| LoraFileError::ShapeMismatch {
        name: name.to_string(),
        reason,
    };
    let names: Vec<&str> = ours.named_vars().iter().map(|(n, _)| *n).collect();
    let stored: Vec<&str> = loaded.tensors.iter().map(|(n, _)| n.as_str()).collect();
    if names.len() != stored.len() || names.iter().any(|n| !stored.contains(n)) {
        return Err(mismatch(format!(
            "the file's module holds {stored:?}, this run's {} adapter {names:?}",
            ours.kind_name()
        )));
    }
    let alpha = loaded.alpha.unwrap_or(ours.rank() as f64);
    if (alpha - ours.alpha()).abs() > 1e-6 * ours.alpha().abs().max(1.0) {
        return Err(mismatch(format!(
            "alpha {alpha} in the file, {} configured",
            ours.alpha()
        )));
    }
    let mut pairs = Vec::with_capacity(names.len());
    for (suffix, var) in ours.named_vars() {
        let t = loaded
            .tensor(suffix)
            .ok_or_else(|| mismatch(format!("no {suffix}")))?;
        let t = if suffix == "dora_scale" && t.dims().len() == 1 {
            t.reshape((t.dim(0)?, 1))?
        } else {
            t.clone()
        };
        if t.dims() != var.dims() {
            return Err(mismatch(format!(
                "{suffix} is {:?} in the file, {:?} in this run",
                t.dims(),
                var.dims()
            )));
        }
        pairs.push((var, t));
    }
    for (var, t) in pairs {
        var.set(&t.to_dtype(var.dtype())?.to_device(var.device())?)?;
    }
    Ok(())
}

/// Attaches `loaded` to `layer` with `multiplier`, factors in `dtype` on the layer's device; the shapes must fit.
pub(super) fn attach(
    loaded: &LoadedAdapter,
    layer: &mut Linear,
    multiplier: f64,
    dtype: DType,
) -> FileResult<()> {
    let device = layer.base().device().clone();
    let mut adapter = loaded.adapter(&device)?;
    check_fits(loaded, &adapter, layer)?;
    adapter = adapter.map_vars(|_, v| Var::from_tensor(&v.as_tensor().to_dtype(dtype)?))?;
    adapter.set_multiplier(multiplier);
    layer.set_adapter(Some(adapter));
    Ok(())
}

/// Refuses an adapter whose widths are not the layer's.
pub(super) fn check_fits(
    loaded: &LoadedAdapter,
    adapter: &Adapter,
    layer: &Linear,
) -> FileResult<()> {
    if (adapter.in_dim(), adapter.out_dim()) == (layer.in_dim(), layer.out_dim()) {
        return Ok(());
    }
    Err(LoraFileError::ShapeMismatch {
        name: loaded.name.clone(),
        reason: format!(
            "a {} adapter of in {}, out {} for a layer of in {}, out {}",
            loaded.kind_name(),
            adapter.in_dim(),
            adapter.out_dim(),
            layer.in_dim(),
            layer.out_dim()
        ),
    })
}

#[cfg(test)]
mod tests;
