//! [`Linear`]'s forward and backward for the adapters other than plain LoRA, the one place their updates and
//! gradients are computed for every model family. LoKr and LoHa run the layer on `W + ΔW` (summed in f32, rounded
//! once to the compute dtype, as LyCORIS merges) and turn `∂L/∂ΔW = dyᵀ x` into their factors' gradients. DoRA
//! keeps the LoRA's low-rank path and scales each output row by `m / ‖W + ΔW‖`, the norm held constant.

use candle_core::{DType, Result, Tensor};

use super::grad::{add_matmul, detached_factors, InputGrad, LinearTape, ParamGrad};
use super::{FrozenMatmul, Linear};
use crate::adapter::{param_grad, work_dtype, Adapter, Dora};

impl Linear {
    /// The untracked forward of a LoKr, LoHa or DoRA layer on the flattened input `x2`, shaped `out_dims`.
    pub(super) fn forward_kind_untracked(
        &self,
        x2: &Tensor,
        adapter: &Adapter,
        out_dims: Vec<usize>,
    ) -> Result<(Tensor, LinearTape)> {
        let dtype = x2.dtype();
        let (y, tape) = match adapter {
            Adapter::Dora(dora) => self.dora_forward_untracked(dora, x2)?,
            _ => {
                let w = self.merged_weight(adapter, dtype)?;
                (x2.matmul(&w.t()?)?, LinearTape::default())
            }
        };
        let y = match self.bias.as_ref() {
            Some(b) => y.broadcast_add(&b.detach().to_dtype(dtype)?)?,
            None => y,
        };
        Ok((y.reshape(out_dims)?, tape))
    }

    /// `W + ΔW` [out, in] in `dtype` for LoKr and LoHa.
    fn merged_weight(&self, adapter: &Adapter, dtype: DType) -> Result<Tensor> {
        let delta = adapter.delta(false)?.ok_or_else(|| {
            candle_core::Error::msg(format!(
                "a {} adapter has no weight update",
                adapter.kind_name()
            ))
        })?;
        (self.base.dense(delta.dtype())? + &delta)?.to_dtype(dtype)
    }

    /// The backward of [`Linear::forward_kind_untracked`] for `dy2` [m, out] (compute dtype): the input gradient
    /// [m, in] as `input` says, and the adapter's gradients in its `named_vars` order.
    pub(super) fn backward_kind(
        &self,
        adapter: &Adapter,
        x2: &Tensor,
        tape: &LinearTape,
        dy2: &Tensor,
        input: InputGrad,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        if let Adapter::Dora(dora) = adapter {
            return self.dora_backward(dora, x2, tape, dy2, input);
        }
        let w = self.merged_weight(adapter, x2.dtype())?;
        let work = adapter
            .named_vars()
            .first()
            .map_or(DType::F32, |(_, v)| work_dtype(v));
        let grad = dy2.t()?.matmul(x2)?.to_dtype(work)?;
        let params = adapter.delta_backward(&grad)?;
        let dx = match input {
            InputGrad::Skip => None,
            InputGrad::New => Some(dy2.matmul(&w)?),
            InputGrad::Add(acc) => Some(add_matmul(
                acc.flatten_to(candle_core::D::Minus2)?,
                dy2,
                &w,
                false,
            )?),
        };
        Ok((dx, params))
    }

    /// `x W'ᵀ` before the row scale (`z`, from the base and the LoRA), the scaled output (no bias) and the tape.
    fn dora_forward_untracked(&self, dora: &Dora, x2: &Tensor) -> Result<(Tensor, LinearTape)> {
        let dtype = x2.dtype();
        let (down, up) = detached_factors(&dora.lora, dtype)?;
        let mid = (x2.matmul(&down.t()?)? * dora.lora.scale())?;
        let base = x2.apply_op1_no_bwd(&FrozenMatmul {
            base: self.base.clone(),
        })?;
        let z = add_matmul(base, &mid, &up, true)?;
        let norms = dora.norms(&self.base)?;
        let gain = dora.gain(&norms, &dora.magnitude.as_tensor().detach())?;
        let y = z.broadcast_mul(&row(&gain, dtype)?)?;
        let tape = LinearTape {
            mid: Some(mid),
            dora: Some((z, norms)),
        };
        Ok((y, tape))
    }

    /// DoRA's backward: with `g` the row scale, the LoRA's gradients and the input gradient for `dy ⊙ g`, and
    /// `∂m = multiplier · Σ_rows(dy ⊙ z) / ‖W + ΔW‖`.
    fn dora_backward(
        &self,
        dora: &Dora,
        x2: &Tensor,
        tape: &LinearTape,
        dy2: &Tensor,
        input: InputGrad,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        let dtype = x2.dtype();
        let (down, up) = detached_factors(&dora.lora, dtype)?;
        let s = dora.lora.scale();
        let mid = match &tape.mid {
            Some(m) => m.clone(),
            None => (x2.matmul(&down.t()?)? * s)?,
        };
        let (z, norms) = match &tape.dora {
            Some((z, n)) => (z.clone(), n.clone()),
            None => {
                let base = x2.apply_op1_no_bwd(&FrozenMatmul {
                    base: self.base.clone(),
                })?;
                (add_matmul(base, &mid, &up, true)?, dora.norms(&self.base)?)
            }
        };
        let gain = dora.gain(&norms, &dora.magnitude.as_tensor().detach())?;
        let dyg = dy2.broadcast_mul(&row(&gain, dtype)?)?;
        let t = (dyg.matmul(&up)? * s)?;
        let d_down = t.t()?.matmul(x2)?;
        let d_up = dyg.t()?.matmul(&mid)?;
        let work = norms.dtype();
        let zy = (dy2.to_dtype(work)? * z.to_dtype(work)?)?;
        let d_m = (zy.sum(0)?.reshape(norms.shape())?.div(&norms)? * dora.multiplier)?;
        let params = vec![
            param_grad(&dora.lora.down, d_down)?,
            param_grad(&dora.lora.up, d_up)?,
            param_grad(&dora.magnitude, d_m)?,
        ];
        let w = self.base.dense(dtype)?;
        let dx = match input {
            InputGrad::Skip => None,
            InputGrad::New => Some(add_matmul(dyg.matmul(&w)?, &t, &down, false)?),
            InputGrad::Add(acc) => {
                let acc = add_matmul(acc.flatten_to(candle_core::D::Minus2)?, &dyg, &w, false)?;
                Some(add_matmul(acc, &t, &down, false)?)
            }
        };
        Ok((dx, params))
    }

    /// `x ΔWᵀ` for LoKr and LoHa on candle's autograd (the factors tracked unless inside
    /// [`crate::lora::untracked`]), in `x2`'s dtype.
    pub(super) fn delta_forward_tracked(&self, adapter: &Adapter, x2: &Tensor) -> Result<Tensor> {
        let delta = adapter
            .delta(!crate::lora::is_untracked())?
            .ok_or_else(|| candle_core::Error::msg("this adapter has no weight update"))?;
        x2.matmul(&delta.to_dtype(x2.dtype())?.t()?)
    }

    /// DoRA on candle's autograd: `(y + lora(x)) ⊙ g` for the base output `y` (no bias), the norm detached.
    pub(super) fn dora_forward_tracked(
        &self,
        dora: &Dora,
        x2: &Tensor,
        y: Tensor,
    ) -> Result<Tensor> {
        let z = (y + dora.lora.forward(x2)?)?;
        let norms = dora.norms(&self.base)?;
        let magnitude = if crate::lora::is_untracked() {
            dora.magnitude.as_tensor().detach()
        } else {
            dora.magnitude.as_tensor().clone()
        };
        let gain = dora.gain(&norms, &magnitude)?;
        z.broadcast_mul(&row(&gain, z.dtype())?)
    }
}

/// A per-row scale [out, 1] as a row vector [1, out] in `dtype`, to broadcast over the outputs.
fn row(gain: &Tensor, dtype: DType) -> Result<Tensor> {
    gain.to_dtype(dtype)?.t()
}
