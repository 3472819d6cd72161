//! DoRA's forward and backward on a [`Linear`]: the LoRA's low-rank path, each output row scaled by
//! `g = 1 + multiplier · (m / ‖W + ΔW‖ − 1)` with the norms from [`Dora::norms`] (no `W + ΔW` formed) and
//! `‖W_o‖²` computed once per layer.

use candle_core::{DType, Result, Tensor};

use super::super::grad::{
    add_matmul, detached_factors, InputGrad, InputShare, LinearTape, ParamGrad,
};
use super::super::{FrozenMatmul, Linear};
use crate::adapter::{base_row_squares, param_grad, work_dtype, Dora};

impl Linear {
    /// [`Dora::norms`] for this layer's base, `‖W_o‖²` from the layer's cache (computed on first use), `W Aᵀ` in
    /// `dtype`.
    pub(in crate::linear) fn dora_norms(&self, dora: &Dora, dtype: DType) -> Result<Tensor> {
        let work = work_dtype(&dora.lora.down);
        let cached = self
            .base_squares
            .0
            .get()
            .filter(|t| t.dtype() == work)
            .cloned();
        let squares = match cached {
            Some(t) => t,
            None => {
                let t = base_row_squares(&self.base, work)?;
                // A layer used in two work dtypes keeps the first; the other recomputes.
                let _ = self.base_squares.0.set(t.clone());
                t
            }
        };
        dora.norms(&self.base, &squares, dtype)
    }

    /// `x W'ᵀ` before the row scale (`z`, from the base and the LoRA), the scaled output (no bias) and the tape.
    pub(super) fn dora_forward_untracked(
        &self,
        dora: &Dora,
        x2: &Tensor,
    ) -> Result<(Tensor, LinearTape)> {
        let dtype = x2.dtype();
        let (down, up) = detached_factors(&dora.lora, dtype)?;
        let mid = (x2.matmul(&down.t()?)? * dora.lora.scale())?;
        let base = x2.apply_op1_no_bwd(&FrozenMatmul {
            base: self.base.clone(),
        })?;
        let z = add_matmul(base, &mid, &up, true)?;
        let norms = self.dora_norms(dora, dtype)?;
        let gain = dora.gain(&norms, &dora.magnitude.as_tensor().detach())?;
        let y = z.broadcast_mul(&row(&gain, dtype)?)?;
        let tape = LinearTape {
            mid: Some(mid),
            dora: Some((z, norms)),
        };
        Ok((y, tape))
    }

    /// DoRA's backward: with `g` the row scale, the LoRA's gradients and the input gradient for `dy ⊙ g`, and
    /// `∂m = multiplier · Σ_rows(dy ⊙ z) / ‖W + ΔW‖` (the column sum a product with a row of ones, accumulated in
    /// f32 by the GEMM).
    pub(super) fn dora_backward(
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
                (
                    add_matmul(base, &mid, &up, true)?,
                    self.dora_norms(dora, dtype)?,
                )
            }
        };
        let ones = Tensor::ones((1, dy2.dim(0)?), dtype, dy2.device())?;
        let column_sums = ones.matmul(&(dy2 * &z)?)?;
        drop(z);
        let d_m = column_sums
            .to_dtype(norms.dtype())?
            .t()?
            .div(&norms)?
            .affine(dora.multiplier, 0.0)?;
        let gain = dora.gain(&norms, &dora.magnitude.as_tensor().detach())?;
        let dyg = dy2.broadcast_mul(&row(&gain, dtype)?)?;
        let t = (dyg.matmul(&up)? * s)?;
        let d_down = t.t()?.matmul(x2)?;
        let d_up = dyg.t()?.matmul(&mid)?;
        let params = vec![
            param_grad(&dora.lora.down, d_down)?,
            param_grad(&dora.lora.up, d_up)?,
            param_grad(&dora.magnitude, d_m)?,
        ];
        let dx = self.input_grad(&dyg, Some(InputShare { t, down }), input)?;
        Ok((dx, params))
    }

    /// DoRA on candle's autograd: `(y + lora(x)) ⊙ g` for the base output `y` (no bias), the norm detached.
    pub(in crate::linear) fn dora_forward_tracked(
        &self,
        dora: &Dora,
        x2: &Tensor,
        y: Tensor,
    ) -> Result<Tensor> {
        let z = (y + dora.lora.forward(x2)?)?;
        let norms = self.dora_norms(dora, z.dtype())?;
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
