//! DoRA's forward and backward on a [`Linear`]: the LoRA's low-rank path, each output row scaled by
//! `g = 1 + multiplier · (m / ‖W + ΔW‖ − 1)` with the norms from [`Dora::norms`] (no `W + ΔW` formed) and
//! `‖W_o‖²` computed once per layer.
//!
//! The row scale and the bias are one pass over the output, with `g` in f32 (a bf16 `g` would move every row by
//! up to 2⁻⁹, far more than a step moves the magnitude). The tape keeps the output `y = g ⊙ z + b` rather than
//! the product `z` before it: the magnitude gradient `Σ_t dy ⊙ z` is `(Σ_t dy ⊙ y − b ⊙ Σ_t dy) / g`, two column
//! sums of one pass, and a layer whose output an earlier pass kept ([`LinearTape::kept`]) needs no product run
//! again. Only an empty tape recomputes `z`. (A row whose gain is exactly zero has no `z` left in `y`; a trained
//! magnitude does not land on exactly zero.)

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

    /// `z = x W'ᵀ` [m, out] before the row scale and the bias, from the base and the LoRA's scaled low-rank
    /// activation `mid`: on CUDA the low-rank product written first and the base product accumulated onto it.
    fn dora_product(&self, x2: &Tensor, mid: &Tensor, up: &Tensor) -> Result<Tensor> {
        if self.low_rank_first(x2) {
            return add_matmul(
                mid.matmul(&up.t()?)?,
                x2,
                &self.base.dense(x2.dtype())?,
                true,
            );
        }
        let base = x2.apply_op1_no_bwd(&FrozenMatmul {
            base: self.base.clone(),
        })?;
        add_matmul(base, mid, up, true)
    }

    /// The scaled output (bias included) and the tape.
    pub(super) fn dora_forward_untracked(
        &self,
        dora: &Dora,
        x2: &Tensor,
    ) -> Result<(Tensor, LinearTape)> {
        let dtype = x2.dtype();
        let (down, up) = detached_factors(&dora.lora, dtype)?;
        let mid = (x2.matmul(&down.t()?)? * dora.lora.scale())?;
        let z = self.dora_product(x2, &mid, &up)?;
        let norms = self.dora_norms(dora, dtype)?;
        let gain = dora.gain(&norms, &dora.magnitude.as_tensor().detach())?;
        let y = scale_rows(&z, &gain, self.bias.as_ref())?;
        let tape = LinearTape {
            mid: Some(mid),
            output: Some(y.clone()),
            norms: Some(norms),
            factors: None,
        };
        Ok((y, tape))
    }

    /// DoRA's backward: with `g` the row scale, the LoRA's gradients and the input gradient for `dy ⊙ g`, and
    /// `∂m = multiplier · Σ_rows(dy ⊙ z) / ‖W + ΔW‖` (module docs for where `z` comes from).
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
        let norms = match &tape.norms {
            Some(n) => n.clone(),
            None => self.dora_norms(dora, dtype)?,
        };
        let gain = dora.gain(&norms, &dora.magnitude.as_tensor().detach())?;
        let dy_z = match &tape.output {
            Some(y) => self.dy_z_from_output(y, dy2, &gain)?,
            None => {
                let z = self.dora_product(x2, &mid, &up)?;
                column_sums(&z, dy2, false, norms.dtype())?.0
            }
        };
        let d_m = dy_z.div(&norms)?;
        let d_m = if dora.multiplier == 1.0 {
            d_m
        } else {
            (d_m * dora.multiplier)?
        };
        let dyg = scale_rows(dy2, &gain, None)?;
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

    /// `Σ_rows dy ⊙ z` [out, 1] (the gain's work dtype) from the output `y = g ⊙ z + b`: `(Σ dy ⊙ y − b ⊙ Σ dy) / g`.
    fn dy_z_from_output(&self, y: &Tensor, dy2: &Tensor, gain: &Tensor) -> Result<Tensor> {
        let work = gain.dtype();
        let y2 = y.flatten_to(candle_core::D::Minus2)?;
        let (dy_y, dy_sum) = column_sums(&y2, dy2, self.bias.is_some(), work)?;
        let centred = match (self.bias.as_ref(), dy_sum) {
            (Some(b), Some(dy_sum)) => {
                let b = b.detach().to_dtype(work)?.reshape(dy_y.shape())?;
                (dy_y - (b * dy_sum)?)?
            }
            _ => dy_y,
        };
        centred.div(gain)
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

/// `z ⊙ g + b` [m, out] in `z`'s dtype for the row scale `g` [out, 1] and an optional bias [out]: on CUDA one
/// pass with `g` and `b` in f32 (the gate kernel `z · g`, or with a bias the modulation kernel
/// `z · (1 + (g − 1)) + b`); elsewhere in `z`'s dtype.
fn scale_rows(z: &Tensor, gain: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let dtype = z.dtype();
    if !z.device().is_cuda() {
        let y = z.broadcast_mul(&row(gain, dtype)?)?;
        return match bias {
            Some(b) => y.broadcast_add(&b.detach().to_dtype(dtype)?),
            None => Ok(y),
        };
    }
    let (m, out) = z.dims2()?;
    let z3 = z.reshape((1, m, out))?;
    let gain = gain.to_dtype(DType::F32)?.reshape((1, out))?;
    let y = match bias {
        Some(b) => {
            let shift = b.detach().to_dtype(DType::F32)?.reshape((1, out))?;
            crate::ops::modulate_to(&z3, &(gain - 1.0)?, &shift, dtype)?
        }
        None => crate::ops::gate_backward(&z3, &gain, dtype)?,
    };
    y.reshape((m, out))
}

/// `Σ_rows a ⊙ g` [out, 1] in `work` for `a`, `g` [m, out], and with `with_sum` also `Σ_rows g`: on CUDA one
/// fused pass summing in f32, elsewhere in `work`.
fn column_sums(
    a: &Tensor,
    g: &Tensor,
    with_sum: bool,
    work: DType,
) -> Result<(Tensor, Option<Tensor>)> {
    let (m, out) = a.dims2()?;
    let col = |t: Tensor| t.to_dtype(work)?.reshape((out, 1));
    if a.device().is_cuda() && a.dtype() == g.dtype() {
        let (a3, g3) = (a.reshape((1, m, out))?, g.reshape((1, m, out))?);
        let (ga, sum) = crate::ops::token_sums(&a3, &g3, with_sum)?;
        return Ok((col(ga)?, sum.map(col).transpose()?));
    }
    let g = g.to_dtype(work)?;
    let ga = (a.to_dtype(work)? * &g)?.sum(0)?;
    let sum = with_sum.then(|| g.sum(0)).transpose()?;
    Ok((col(ga)?, sum.map(col).transpose()?))
}

/// A per-row scale [out, 1] as a row vector [1, out] in `dtype`, to broadcast over the outputs.
fn row(gain: &Tensor, dtype: DType) -> Result<Tensor> {
    gain.to_dtype(dtype)?.t()
}
