//! [`LoraSet`]: the adapters a trainer optimises, by module path, sharing their variables with the layers they
//! are attached to; shared with a second model, mirrored on another device.

use candle_core::{Device, Result, Tensor, Var};

use super::{natural_cmp, LoraError};
use crate::adapter::Adapter;
use crate::linear::Linear;
use crate::lora::Lora;

/// A copy of `t` on `device` that shares no storage with it (`to_device` shares it on the same device), read
/// from `t` before it returns (the source is a LoRA factor the optimizer overwrites next).
fn copied_to(t: &Tensor, device: &Device) -> Result<Tensor> {
    if t.device().same_device(device) {
        t.copy()
    } else {
        crate::ops::to_device(t, device)
    }
}

/// Adapters by module path, in natural path order (`blocks.2` before `blocks.10`). Each adapter shares its
/// `Var`s with the copy attached to the layer, so optimiser updates through [`LoraSet::vars`] reach the model.
#[derive(Clone, Default)]
pub struct LoraSet {
    modules: Vec<(String, Adapter)>,
}

impl LoraSet {
    /// A set of plain LoRAs from (module path, adapter) pairs, sorted into natural path order.
    pub fn new(modules: Vec<(String, Lora)>) -> Self {
        Self::of_adapters(
            modules
                .into_iter()
                .map(|(p, l)| (p, Adapter::Lora(l)))
                .collect(),
        )
    }

    /// A set from (module path, adapter) pairs of any kind, sorted into natural path order.
    pub fn of_adapters(mut modules: Vec<(String, Adapter)>) -> Self {
        modules.sort_by(|a, b| natural_cmp(&a.0, &b.0));
        Self { modules }
    }

    /// (module path, adapter) in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Adapter)> {
        self.modules.iter().map(|(p, l)| (p.as_str(), l))
    }

    /// The adapter of `module_path`.
    pub fn get(&self, module_path: &str) -> Option<&Adapter> {
        self.modules
            .iter()
            .find(|(p, _)| p == module_path)
            .map(|(_, l)| l)
    }

    /// Number of adapted modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// Whether no module is adapted.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The trainable variables of each module in order (`down` then `up` for a LoRA; see
    /// [`Adapter::named_vars`]).
    pub fn vars(&self) -> Vec<Var> {
        self.modules.iter().flat_map(|(_, l)| l.vars()).collect()
    }

    /// Attaches these same adapters (sharing their `Var`s, so one update reaches both) to the layers of another
    /// model with the same module paths, as Wan2.2 A14B's two experts share one LoRA. Fails, attaching nothing,
    /// when a path has no layer there.
    pub fn share_with<'a, I>(&self, modules: I) -> std::result::Result<(), LoraError>
    where
        I: IntoIterator<Item = (String, &'a mut Linear)>,
    {
        let mut layers: Vec<(String, &mut Linear)> = modules.into_iter().collect();
        let mut matched = Vec::with_capacity(self.modules.len());
        for (path, lora) in &self.modules {
            match layers.iter().position(|(p, _)| p == path) {
                Some(k) => matched.push((k, lora)),
                None => return Err(LoraError::NotShared { path: path.clone() }),
            }
        }
        for (k, lora) in matched {
            layers[k].1.set_adapter(Some(lora.clone()));
        }
        Ok(())
    }

    /// A copy of these adapters on `device`, in new `Var`s (the same paths, values, alphas and multipliers): the
    /// mirror of a shared LoRA for a model on another GPU, kept equal with [`LoraSet::assign_from`].
    pub fn copy_to(&self, device: &Device) -> Result<LoraSet> {
        let modules = self
            .modules
            .iter()
            .map(|(path, l)| {
                let copy =
                    l.map_vars(|_, v| Var::from_tensor(&copied_to(v.as_tensor(), device)?))?;
                Ok((path.clone(), copy))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LoraSet::of_adapters(modules))
    }

    /// Sets every adapter's factors to `source`'s (copied to this set's devices). Both sets must have the same
    /// paths and shapes, as a [`LoraSet::copy_to`] mirror has.
    pub fn assign_from(&self, source: &LoraSet) -> Result<()> {
        if self.modules.len() != source.modules.len() {
            candle_core::bail!(
                "LoRA sets differ: {} modules against {}",
                self.modules.len(),
                source.modules.len()
            );
        }
        for ((path, to), (from_path, from)) in self.modules.iter().zip(&source.modules) {
            if path != from_path {
                candle_core::bail!("LoRA sets differ: {path} against {from_path}");
            }
            let (to, from) = (to.named_vars(), from.named_vars());
            if to.len() != from.len() {
                candle_core::bail!("LoRA sets differ in the kind of {path}");
            }
            for ((_, to), (_, from)) in to.into_iter().zip(from) {
                to.set(&copied_to(from.as_tensor(), to.device())?)?;
            }
        }
        Ok(())
    }

    /// Trainable parameter count.
    pub fn parameter_count(&self) -> usize {
        self.modules.iter().map(|(_, l)| l.parameter_count()).sum()
    }
}
