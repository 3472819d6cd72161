//! [`Linear`]'s forward and backward for the adapters other than plain LoRA, the one place their updates and
//! gradients are computed for every model family. LoHa runs as a LoRA of rank `rank²` and LoKr by the Kronecker
//! reshape identity (`kinds/lokr.rs`), neither forming `ΔW`, unless running on `W + ΔW` costs less
//! ([`crate::adapter::UpdateShape::path`]): then the layer runs on `W + ΔW` (summed in f32, rounded once to the
//! compute dtype, as LyCORIS merges) and turns `∂L/∂ΔW = dyᵀ x` into the factors' gradients. LoHa at many rows
//! and a large rank runs its forward and its input gradient on `W + ΔW` built in the compute dtype, and its factors'
//! gradients through the factors; LoKr at many rows its forward alone (its `[m, out]` update and half-applied
//! input cost more than building the weight), the rest through the factors. DoRA
//! (`kinds/dora.rs`) keeps the LoRA's low-rank path and scales each output row by `m / ‖W + ΔW‖`, the norm held
//! constant. The autograd forward runs on `W + ΔW` always: it is the reference the tests hold these to.

use candle_core::{DType, Result, Tensor};

use super::grad::{
    add_matmul, add_matmul_bias, matmul_bias, InputGrad, InputShare, LinearTape, LowRank, ParamGrad,
};
use super::{FrozenMatmul, Linear};
use crate::adapter::{work_dtype, Adapter, Loha, UpdatePath};

mod dora;
mod lokr;
#[cfg(test)]
mod tests;

impl Linear {
    /// The untracked forward of a LoKr, LoHa or DoRA layer on the flattened input `x2`, shaped `out_dims`.
    pub(super) fn forward_kind_untracked(
        &self,
        x2: &Tensor,
        adapter: &Adapter,
        out_dims: Vec<usize>,
    ) -> Result<(Tensor, LinearTape)> {
        let path = self.update_path(adapter, x2)?;
        self.forward_kind_on(x2, adapter, out_dims, path)
    }

    /// [`Linear::forward_kind_untracked`] the way `path` says (DoRA has one way).
    fn forward_kind_on(
        &self,
        x2: &Tensor,
        adapter: &Adapter,
        out_dims: Vec<usize>,
        path: UpdatePath,
    ) -> Result<(Tensor, LinearTape)> {
        let dtype = x2.dtype();
        let (y, tape) = match (adapter, path) {
            (Adapter::Loha(loha), UpdatePath::Factored) => {
                // The scale rides on `down`: `mid` is the scaled activation without a pass of its own.
                let (down_t, up) = loha.low_rank(dtype)?;
                let mid = x2.matmul(&down_t)?;
                return self.finish_forward(x2, LowRank::Scaled { mid, up }, out_dims);
            }
            (Adapter::Lokr(lokr), UpdatePath::Factored | UpdatePath::MergedForward) => {
                let kron = lokr::Kron::new(lokr, dtype)?;
                let tape = LinearTape {
                    factors: Some(kron.factors()),
                    ..LinearTape::default()
                };
                let bias = self
                    .bias
                    .as_ref()
                    .map(|b| b.detach().to_dtype(dtype))
                    .transpose()?;
                let y = if path == UpdatePath::MergedForward {
                    let w = kron.merged_in(&self.base.dense(dtype)?)?;
                    matmul_bias(x2, &w, bias.as_ref())?
                } else {
                    self.base_plus(x2, kron.apply(x2)?, bias.as_ref())?
                };
                return Ok((y.reshape(out_dims)?, tape));
            }
            (Adapter::Loha(loha), UpdatePath::MergedForward) => {
                let w = loha.merged_in(&self.base.dense(dtype)?, dtype)?;
                (x2.matmul(&w.t()?)?, LinearTape::default())
            }
            (Adapter::Dora(dora), _) => {
                // The bias is added with the row scale.
                let (y, tape) = self.dora_forward_untracked(dora, x2)?;
                return Ok((y.reshape(out_dims)?, tape));
            }
            _ => {
                let w = self.merged_weight(adapter, dtype)?;
                (x2.matmul(&w.t()?)?, LinearTape::default())
            }
        };
        let y = match self.bias.as_ref() {
            Some(b) => crate::ops::add_row(&y, &b.detach())?,
            None => y,
        };
        Ok((y.reshape(out_dims)?, tape))
    }

    /// `x Wᵀ + c + bias` for `c` [m, out] the caller owns and a `bias` in `x2`'s dtype: the base product
    /// accumulates onto `c` where that runs in place, adding the bias in the same product where it can
    /// ([`add_matmul_bias`]).
    fn base_plus(&self, x2: &Tensor, c: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        if self.low_rank_first(x2) {
            return add_matmul_bias(c, x2, &self.base.dense(x2.dtype())?, bias);
        }
        let y = (x2.apply_op1_no_bwd(&FrozenMatmul {
            base: self.base.clone(),
        })? + c)?;
        match bias {
            Some(b) => crate::ops::add_row(&y, b),
            None => Ok(y),
        }
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
        let path = self.update_path(adapter, x2)?;
        self.backward_kind_on(adapter, (x2, tape, dy2), input, path)
    }

    /// [`Linear::backward_kind`] the way `path` says, for the input, tape and output gradient `(x2, tape, dy2)`.
    fn backward_kind_on(
        &self,
        adapter: &Adapter,
        (x2, tape, dy2): (&Tensor, &LinearTape, &Tensor),
        input: InputGrad,
        path: UpdatePath,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        match (adapter, path) {
            (Adapter::Dora(dora), _) => return self.dora_backward(dora, x2, tape, dy2, input),
            (Adapter::Loha(loha), UpdatePath::Factored | UpdatePath::MergedForward) => {
                let merged = path == UpdatePath::MergedForward;
                return self.loha_backward(loha, (x2, tape, dy2), input, merged);
            }
            (Adapter::Lokr(lokr), UpdatePath::Factored | UpdatePath::MergedForward) => {
                return self.lokr_backward(lokr, (x2, tape, dy2), input)
            }
            _ => {}
        }
        let w = self.merged_weight(adapter, x2.dtype())?;
        let work = adapter
            .named_vars()
            .first()
            .map_or(DType::F32, |(_, v)| work_dtype(v));
        let grad = dy2.t()?.matmul(x2)?.to_dtype(work)?;
        let params = adapter.delta_backward(&grad)?;
        Ok((merged_input_grad(dy2, &w, input)?, params))
    }

    /// LoHa's backward as a LoRA of rank `rank²` ([`Loha::low_rank`], the scale `s` on `down`): `t = dy up`,
    /// `∂downᵀ = xᵀ t`, `∂up = dyᵀ mid` with `mid = x downᵀ` from the tape (recomputed without one), folded into
    /// the factors. The input gradient is `dy W + t down`, or with `merged` (the forward ran on `W + ΔW`, where
    /// building the weight costs less than the rank-`r²` product `t down`) `dy (W + ΔW)`.
    fn loha_backward(
        &self,
        loha: &Loha,
        (x2, tape, dy2): (&Tensor, &LinearTape, &Tensor),
        input: InputGrad,
        merged: bool,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        let dtype = x2.dtype();
        let (down_t, up) = loha.low_rank(dtype)?;
        let (t, params) = {
            let mid = match &tape.mid {
                Some(m) => m.clone(),
                None => x2.matmul(&down_t)?,
            };
            let t = dy2.matmul(&up)?;
            let d_up = dy2.t()?.matmul(&mid)?;
            let d_down_t = x2.t()?.matmul(&t)?;
            (t, loha.low_rank_backward(&d_down_t, &d_up)?)
        };
        if merged && !matches!(input, InputGrad::Skip) {
            // The rank-r² terms go before the weight-sized ones come.
            drop((t, down_t, up));
            let w = loha.merged_in(&self.base.dense(dtype)?, dtype)?;
            return Ok((merged_input_grad(dy2, &w, input)?, params));
        }
        let share = InputShare {
            t,
            down: down_t.t()?,
        };
        let dx = self.input_grad(dy2, Some(share), input)?;
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
}

/// The input gradient `dy2 w` [m, in] on a merged weight `w` [out, in], as `input` says.
fn merged_input_grad(dy2: &Tensor, w: &Tensor, input: InputGrad) -> Result<Option<Tensor>> {
    Ok(match input {
        InputGrad::Skip => None,
        InputGrad::New => Some(dy2.matmul(w)?),
        InputGrad::Add(acc) => Some(add_matmul(
            acc.flatten_to(candle_core::D::Minus2)?,
            dy2,
            w,
            false,
        )?),
    })
}

impl Linear {
    /// How the layer applies `adapter`'s update to the rows of `x2` (LoRA and DoRA: factored, their only way). A
    /// base whose products run on FP8 tensor cores has no merged weight for them: LoKr's forward stays factored.
    fn update_path(&self, adapter: &Adapter, x2: &Tensor) -> Result<UpdatePath> {
        let path = match adapter.update_shape()? {
            Some(shape) => shape.path(x2.dim(0)?),
            None => UpdatePath::Factored,
        };
        let fp8_products = matches!(&self.base, super::BaseWeight::Fp8(w) if w.fp8_products());
        Ok(match (adapter, path) {
            (Adapter::Lokr(_), UpdatePath::MergedForward) if fp8_products => UpdatePath::Factored,
            _ => path,
        })
    }
}
