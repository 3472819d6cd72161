//! DoRA: a LoRA whose layer output is rescaled per output row, `W' = m · (W + ΔW) / ‖W + ΔW‖`, with the magnitude
//! `m` [out, 1] trained (`dora_scale`, LyCORIS' `wd_on_output` layout) and the norm taken from the frozen base
//! (dequantised for FP8) and the LoRA's update, held constant in the backward as the DoRA paper and PEFT do.
//! The norms never form `W + ΔW`: with `ΔW = s·B·A`, `‖W_o + ΔW_o‖² = ‖W_o‖² + 2s·B_o·(W Aᵀ)_o + s²·B_o (A Aᵀ) B_oᵀ`,
//! where `‖W_o‖²` is a constant of the frozen base and the rest is a product of `A` with the base and rank-sized
//! terms.

use candle_core::{DType, Result, Tensor, Var};
use rand::Rng;

use super::{work_dtype, work_tensor, AdapterShape};
use crate::linear::BaseWeight;
use crate::lora::Lora;

/// A DoRA adapter.
#[derive(Clone)]
pub struct Dora {
    /// The direction's update `up(down(x)) · alpha / rank` (its own multiplier stays 1).
    pub lora: Lora,
    /// `m` [out, 1], f32 or the factors' dtype.
    pub magnitude: Var,
    /// The strength: the output rows are scaled by `1 + multiplier · (m / ‖W + ΔW‖ − 1)` (LyCORIS' rule).
    pub multiplier: f64,
}

/// `‖W_o‖²` per output row [out, 1] of a frozen weight, in `dtype` (the factors' work dtype): the constant term of
/// [`Dora::norms`].
pub fn base_row_squares(base: &BaseWeight, dtype: DType) -> Result<Tensor> {
    base.dense(dtype)?.sqr()?.sum_keepdim(1)
}

impl Dora {
    /// A fresh adapter: a fresh LoRA (`up` zero) and `m` = the row norms of `W` computed exactly as the forward
    /// computes them (with `up` zero every other term of [`Dora::norms`] is an exact zero), so the layer is
    /// unchanged (bit for bit) until the first step.
    pub(super) fn new(shape: AdapterShape, base: &BaseWeight, rng: &mut impl Rng) -> Result<Self> {
        let lora = Lora::new(
            [shape.in_dim, shape.out_dim, shape.rank],
            shape.alpha,
            shape.dtype,
            base.device(),
            rng,
        )?;
        let work = work_dtype(&lora.down);
        let squares = base_row_squares(base, work)?;
        // The terms with `up` are exact zeros whatever `A Wᵀ` and `A Aᵀ` are: zeros stand for them.
        let (r, out) = (shape.rank, shape.out_dim);
        let up = work_tensor(&lora.up)?;
        let norms = crate::ops::dora_row_norms(
            &squares,
            &up,
            &Tensor::zeros((r, out), work, up.device())?,
            &Tensor::zeros((r, r), work, up.device())?,
            lora.scale(),
            NORM_EPS,
        )?;
        Ok(Self {
            magnitude: Var::from_tensor(&norms.to_dtype(shape.dtype)?)?,
            lora,
            multiplier: 1.0,
        })
    }

    /// `‖W + ΔW‖ + ε` per output row, [out, 1] in the factors' work dtype (f32), detached (ε = f32's epsilon, as
    /// LyCORIS adds), from `base_squares` = [`base_row_squares`] of `base`: `W Aᵀ` is computed in `dtype` (the
    /// layer's compute dtype) on the weight dequantised as the layer's own product dequantises it, the rest in
    /// the work dtype.
    pub fn norms(&self, base: &BaseWeight, base_squares: &Tensor, dtype: DType) -> Result<Tensor> {
        let (down, up) = (work_tensor(&self.lora.down)?, work_tensor(&self.lora.up)?);
        // A Wᵀ [r, out], left in the compute dtype: the norms' op reads it as it is.
        let wa = down.to_dtype(dtype)?.matmul(&base.dense(dtype)?.t()?)?;
        let gram = down.matmul(&down.t()?)?;
        let squares = base_squares.to_device(up.device())?;
        crate::ops::dora_row_norms(&squares, &up, &wa, &gram, self.lora.scale(), NORM_EPS)
    }

    /// The row scale `1 + multiplier · (m / norms − 1)` [out, 1] f32 for the magnitude `m` (tracked or not).
    pub fn gain(&self, norms: &Tensor, magnitude: &Tensor) -> Result<Tensor> {
        let ratio = magnitude.to_dtype(norms.dtype())?.div(norms)?;
        if self.multiplier == 1.0 {
            return Ok(ratio);
        }
        (ratio - 1.0)?.affine(self.multiplier, 1.0)
    }

    /// A DoRA adapter from a LoRA and a file's `dora_scale` ([out], [out, 1]; the input-axis [1, in] is refused).
    pub(super) fn from_parts(lora: Lora, magnitude: &Tensor) -> Result<Self> {
        let out = lora.out_dim();
        let fits = matches!(magnitude.dims(), [n] if *n == out) || magnitude.dims() == [out, 1];
        if !fits {
            candle_core::bail!(
                "dora_scale has shape {:?}; only the magnitude per output row ([{out}] or [{out}, 1], LyCORIS' \
                 wd_on_output) is supported",
                magnitude.dims()
            );
        }
        Ok(Self {
            magnitude: Var::from_tensor(&magnitude.reshape((out, 1))?)?,
            lora,
            multiplier: 1.0,
        })
    }
}

/// ε added to every row norm: f32's epsilon, as LyCORIS adds.
const NORM_EPS: f64 = f32::EPSILON as f64;
