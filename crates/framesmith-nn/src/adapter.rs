//! The adapter a frozen [`Linear`] trains: plain LoRA ([`Lora`]), LoKr, LoHa or DoRA, named and initialised as
//! LyCORIS does (the update is zero at step 0). Every model family reaches these through `Linear`'s forward and
//! hand-written backward (`linear/kinds.rs`), so a kind is added here, never in a model.
//!
//! LoKr and LoHa define a weight update `ΔW` [out, in] from their factors; the layer runs on `W + ΔW` and its
//! backward turns `∂L/∂ΔW` into the factors' gradients. DoRA is a LoRA whose output rows are rescaled to a trained
//! magnitude: `W' = m · (W + ΔW) / ‖W + ΔW‖` per output row, the norm held constant in the backward as in the
//! DoRA paper and PEFT.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::Rng;

use super::linear::{BaseWeight, ParamGrad};
use super::lora::Lora;

mod cost;
mod dora;
mod loha;
mod lokr;
mod merge;
#[cfg(test)]
mod tests;

pub use cost::{UpdatePath, UpdateShape, LOKR_CHUNK_ROWS};
pub use dora::{base_row_squares, Dora};
pub use loha::Loha;
pub use lokr::{factorization, Factor, Lokr};

/// Which adapter a run trains (`[lora] kind`), with that kind's options as LyCORIS names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AdapterKind {
    /// `up(down(x)) · alpha / rank`.
    #[default]
    Lora,
    /// `ΔW = w1 ⊗ w2 · alpha / rank`.
    Lokr {
        /// The largest factor of each width given to `w1` (LyCORIS' `factor`; -1 picks the most square split).
        factor: i64,
        /// `w1` too as a product of two rank-`rank` factors when that is smaller (LyCORIS' `decompose_both`).
        decompose_both: bool,
        /// `w1` and `w2` full matrices whatever the rank (LyCORIS' `full_matrix`).
        full_matrix: bool,
    },
    /// `ΔW = (w1_a w1_b) ⊙ (w2_a w2_b) · alpha / rank`.
    Loha,
    /// A LoRA with a trained magnitude per output row.
    Dora,
}

impl AdapterKind {
    /// The name users and files know it by: `lora`, `lokr`, `loha` or `dora`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Lora => "lora",
            Self::Lokr { .. } => "lokr",
            Self::Loha => "loha",
            Self::Dora => "dora",
        }
    }
}

impl AdapterKind {
    /// Trainable parameters of a fresh adapter of this kind on a layer `[in, out]` at `rank` (what
    /// [`Adapter::new`] makes, counted without making it): the planner's count.
    pub fn parameter_count(&self, [in_dim, out_dim]: [usize; 2], rank: usize) -> u64 {
        let (i, o, r) = (in_dim as u64, out_dim as u64, rank as u64);
        match *self {
            Self::Lora => r * (i + o),
            Self::Loha => 2 * r * (i + o),
            Self::Dora => r * (i + o) + o,
            Self::Lokr {
                factor,
                decompose_both,
                full_matrix,
            } => {
                let (out_l, out_k) = factorization(out_dim, factor);
                let (in_m, in_n) = factorization(in_dim, factor);
                let low = |rows: usize, cols: usize| {
                    !full_matrix && (rank as f64) < rows.max(cols) as f64 / 2.0
                };
                let size = |rows: usize, cols: usize, product: bool| {
                    if product {
                        r * (rows + cols) as u64
                    } else {
                        (rows * cols) as u64
                    }
                };
                size(out_l, in_m, decompose_both && low(out_l, in_m))
                    + size(out_k, in_n, low(out_k, in_n))
            }
        }
    }

    /// Bytes one layer's adapter arithmetic holds beyond plain LoRA's on a layer `[in, out]` at `rank` for `rows`
    /// rows in a compute dtype of `compute_bytes` bytes: LoKr's and LoHa's as [`UpdateShape::work_bytes`] counts
    /// them (the way the layer picks), DoRA's output-sized product `dy ⊙ z` or `dy ⊙ g` [rows, out].
    pub fn work_bytes(
        &self,
        [in_dim, out_dim]: [usize; 2],
        rank: usize,
        rows: usize,
        compute_bytes: u64,
    ) -> u64 {
        let shape = match *self {
            Self::Lora => return 0,
            Self::Dora => return (rows * out_dim) as u64 * compute_bytes,
            Self::Loha => UpdateShape::Loha {
                in_dim,
                out_dim,
                rank,
            },
            Self::Lokr { factor, .. } => {
                let (out_l, out_k) = factorization(out_dim, factor);
                let (in_m, in_n) = factorization(in_dim, factor);
                UpdateShape::Lokr {
                    w1: [out_l, in_m],
                    w2: [out_k, in_n],
                }
            }
        };
        shape.work_bytes(rows, compute_bytes)
    }
}

/// What a fresh adapter is made from: the layer's widths, the rank, alpha (already resolved: never 0), the
/// factors' dtype.
#[derive(Clone, Copy, Debug)]
pub struct AdapterShape {
    pub in_dim: usize,
    pub out_dim: usize,
    pub rank: usize,
    pub alpha: f64,
    pub dtype: DType,
}

/// A trained adapter of one layer.
#[derive(Clone)]
pub enum Adapter {
    Lora(Lora),
    Lokr(Lokr),
    Loha(Loha),
    Dora(Dora),
}

impl Adapter {
    /// A fresh adapter of `kind` for a layer with frozen weight `base`, drawn from `rng` on the host and placed
    /// on the base's device. Its update is zero: the layer is unchanged until the first step.
    pub fn new(
        kind: AdapterKind,
        shape: AdapterShape,
        base: &BaseWeight,
        rng: &mut impl Rng,
    ) -> Result<Self> {
        let device = base.device();
        let AdapterShape {
            in_dim,
            out_dim,
            rank,
            alpha,
            dtype,
        } = shape;
        Ok(match kind {
            AdapterKind::Lora => Self::Lora(Lora::new(
                [in_dim, out_dim, rank],
                alpha,
                dtype,
                device,
                rng,
            )?),
            AdapterKind::Lokr {
                factor,
                decompose_both,
                full_matrix,
            } => Self::Lokr(Lokr::new(
                shape,
                lokr::LokrOptions {
                    factor,
                    decompose_both,
                    full_matrix,
                },
                device,
                rng,
            )?),
            AdapterKind::Loha => Self::Loha(Loha::new(shape, device, rng)?),
            AdapterKind::Dora => Self::Dora(Dora::new(shape, base, rng)?),
        })
    }

    /// The kind's name (`lora`, `lokr`, `loha`, `dora`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Lora(_) => "lora",
            Self::Lokr(_) => "lokr",
            Self::Loha(_) => "loha",
            Self::Dora(_) => "dora",
        }
    }

    /// The trainable variables under the names their tensors have in a file (after the module name:
    /// `lora_down.weight`, `lokr_w1`, `hada_w2_b`, `dora_scale`, …), in a fixed order.
    pub fn named_vars(&self) -> Vec<(&'static str, &Var)> {
        match self {
            Self::Lora(l) => vec![("lora_down.weight", &l.down), ("lora_up.weight", &l.up)],
            Self::Lokr(k) => k.named_vars(),
            Self::Loha(h) => h.named_vars(),
            Self::Dora(d) => vec![
                ("lora_down.weight", &d.lora.down),
                ("lora_up.weight", &d.lora.up),
                ("dora_scale", &d.magnitude),
            ],
        }
    }

    /// The trainable variables in [`Adapter::named_vars`] order.
    pub fn vars(&self) -> Vec<Var> {
        self.named_vars()
            .into_iter()
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Trainable parameter count.
    pub fn parameter_count(&self) -> usize {
        self.named_vars().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The plain LoRA, if this is one.
    pub fn as_lora(&self) -> Option<&Lora> {
        match self {
            Self::Lora(l) => Some(l),
            _ => None,
        }
    }

    /// The rank the file's `alpha` divides (for LoKr, of whichever factor is a product; 1 when neither is).
    pub fn rank(&self) -> usize {
        match self {
            Self::Lora(l) => l.rank(),
            Self::Lokr(k) => k.rank,
            Self::Loha(h) => h.rank(),
            Self::Dora(d) => d.lora.rank(),
        }
    }

    /// `alpha` as written to a file.
    pub fn alpha(&self) -> f64 {
        match self {
            Self::Lora(l) => l.alpha,
            Self::Lokr(k) => k.alpha,
            Self::Loha(h) => h.alpha,
            Self::Dora(d) => d.lora.alpha,
        }
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        match self {
            Self::Lora(l) => l.in_dim(),
            Self::Lokr(k) => k.in_dim(),
            Self::Loha(h) => h.in_dim(),
            Self::Dora(d) => d.lora.in_dim(),
        }
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        match self {
            Self::Lora(l) => l.out_dim(),
            Self::Lokr(k) => k.out_dim(),
            Self::Loha(h) => h.out_dim(),
            Self::Dora(d) => d.lora.out_dim(),
        }
    }

    /// Sets the strength the adapter is applied with (1 in training).
    pub fn set_multiplier(&mut self, multiplier: f64) {
        match self {
            Self::Lora(l) => l.multiplier = multiplier,
            Self::Lokr(k) => k.multiplier = multiplier,
            Self::Loha(h) => h.multiplier = multiplier,
            Self::Dora(d) => d.multiplier = multiplier,
        }
    }

    /// The same adapter over new variables made by `f` from each of this one's (in [`Adapter::named_vars`]
    /// order): copies on another device, or values read from a file.
    pub fn map_vars(&self, mut f: impl FnMut(&'static str, &Var) -> Result<Var>) -> Result<Self> {
        let mut next = |name, v: &Var| f(name, v);
        Ok(match self {
            Self::Lora(l) => Self::Lora(Lora {
                down: next("lora_down.weight", &l.down)?,
                up: next("lora_up.weight", &l.up)?,
                ..l.clone()
            }),
            Self::Lokr(k) => Self::Lokr(k.map_vars(&mut next)?),
            Self::Loha(h) => Self::Loha(h.map_vars(&mut next)?),
            Self::Dora(d) => Self::Dora(Dora {
                lora: Lora {
                    down: next("lora_down.weight", &d.lora.down)?,
                    up: next("lora_up.weight", &d.lora.up)?,
                    ..d.lora.clone()
                },
                magnitude: next("dora_scale", &d.magnitude)?,
                multiplier: d.multiplier,
            }),
        })
    }

    /// What picks how a LoKr or LoHa layer applies its update ([`UpdateShape::path`]); `None` for LoRA and DoRA.
    pub fn update_shape(&self) -> Result<Option<UpdateShape>> {
        Ok(match self {
            Self::Loha(h) => Some(UpdateShape::Loha {
                in_dim: h.in_dim(),
                out_dim: h.out_dim(),
                rank: h.rank(),
            }),
            Self::Lokr(k) => {
                let (w1, w2) = k.factor_dims()?;
                Some(UpdateShape::Lokr { w1, w2 })
            }
            Self::Lora(_) | Self::Dora(_) => None,
        })
    }

    /// The weight update `ΔW` [out, in] of LoKr and LoHa (scale and multiplier included), in f32 (f64 for f64
    /// factors), from the
    /// factors detached, or tracked for candle's autograd when `tracked`. `None` for LoRA and DoRA, which apply
    /// their factors to the activations instead.
    pub fn delta(&self, tracked: bool) -> Result<Option<Tensor>> {
        let read = |v: &Var| -> Result<Tensor> {
            let t = if tracked {
                v.as_tensor().clone()
            } else {
                v.as_tensor().detach()
            };
            t.to_dtype(work_dtype(v))
        };
        match self {
            Self::Lokr(k) => k.delta(&read).map(Some),
            Self::Loha(h) => h.delta(&read).map(Some),
            Self::Lora(_) | Self::Dora(_) => Ok(None),
        }
    }

    /// The factors' gradients of LoKr and LoHa (in [`Adapter::named_vars`] order) from `grad`, the gradient of
    /// the loss with respect to [`Adapter::delta`] (f32 [out, in]); empty for LoRA and DoRA.
    pub fn delta_backward(&self, grad: &Tensor) -> Result<Vec<ParamGrad>> {
        match self {
            Self::Lokr(k) => k.delta_backward(grad),
            Self::Loha(h) => h.delta_backward(grad),
            Self::Lora(_) | Self::Dora(_) => Ok(Vec::new()),
        }
    }

    /// Builds an adapter of the kind that `tensors` (file names as in [`Adapter::named_vars`], without the
    /// module) hold, in new variables on `device`, with `alpha` (the rank when `None`). Says what is missing or
    /// does not fit otherwise.
    pub fn from_tensors(
        tensors: &[(String, Tensor)],
        alpha: Option<f64>,
        device: &Device,
    ) -> Result<Self> {
        let get = |name: &str| {
            tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.to_device(device))
                .transpose()
        };
        if tensors.iter().any(|(n, _)| n.starts_with("lokr_")) {
            return Lokr::from_parts(&get, alpha).map(Self::Lokr);
        }
        if tensors.iter().any(|(n, _)| n.starts_with("hada_")) {
            return Loha::from_parts(&get, alpha).map(Self::Loha);
        }
        let (Some(down), Some(up)) = (get("lora_down.weight")?, get("lora_up.weight")?) else {
            candle_core::bail!("needs lora_down and lora_up tensors (a DoRA module has them beside its dora_scale; LoKr and \
             LoHa modules have lokr_ / hada_ tensors)");
        };
        let rank = down.dim(0)?;
        let lora = Lora::from_tensors(&down, &up, alpha.unwrap_or(rank as f64))?;
        match get("dora_scale")? {
            None => Ok(Self::Lora(lora)),
            Some(m) => Dora::from_parts(lora, &m).map(Self::Dora),
        }
    }
}

/// Kaiming-uniform with `a = √5` as PyTorch's `nn.Linear` and LyCORIS draw it: U(−1/√fan_in, 1/√fan_in) for a
/// `[rows, fan_in]` matrix, drawn on the host.
pub(crate) fn kaiming(
    rng: &mut impl Rng,
    [rows, fan_in]: [usize; 2],
    dtype: DType,
    device: &Device,
) -> Result<Var> {
    let bound = 1.0 / (fan_in as f32).sqrt();
    let t = super::init::uniform(rng, (rows, fan_in), -bound, bound, device)?.to_dtype(dtype)?;
    Var::from_tensor(&t)
}

/// The dtype adapter arithmetic runs in for factors stored as `v`'s: f32, or f64 for f64 factors (tests).
pub(crate) fn work_dtype(v: &Var) -> DType {
    if v.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// A detached copy of `v` in its [`work_dtype`].
pub(crate) fn work_tensor(v: &Var) -> Result<Tensor> {
    v.as_tensor().detach().to_dtype(work_dtype(v))
}

/// A gradient for `var` from `grad` (cast to the variable's dtype).
pub(crate) fn param_grad(var: &Var, grad: Tensor) -> Result<ParamGrad> {
    Ok(ParamGrad {
        var: var.clone(),
        grad: grad.to_dtype(var.dtype())?.contiguous()?,
    })
}
