//! DoRA: a LoRA whose layer output is rescaled per output row, `W' = m · (W + ΔW) / ‖W + ΔW‖`, with the magnitude
//! `m` [out, 1] trained (`dora_scale`, LyCORIS' `wd_on_output` layout) and the norm taken from the frozen base
//! (dequantised for FP8) and the LoRA's update, held constant in the backward as the DoRA paper and PEFT do.

use candle_core::{Result, Tensor, Var};
use rand::Rng;

use super::{work_tensor, AdapterShape};
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

impl Dora {
    /// A fresh adapter: a fresh LoRA (`up` zero) and `m` = the row norms of `W` computed exactly as the forward
    /// computes them, so the layer is unchanged (bit for bit) until the first step.
    pub(super) fn new(shape: AdapterShape, base: &BaseWeight, rng: &mut impl Rng) -> Result<Self> {
        let lora = Lora::new(
            [shape.in_dim, shape.out_dim, shape.rank],
            shape.alpha,
            shape.dtype,
            base.device(),
            rng,
        )?;
        let norms = row_norms(base, &lora)?;
        Ok(Self {
            magnitude: Var::from_tensor(&norms.to_dtype(shape.dtype)?)?,
            lora,
            multiplier: 1.0,
        })
    }

    /// `‖W + ΔW‖ + ε` per output row, [out, 1] f32, detached (ε = f32's epsilon, as LyCORIS adds).
    pub fn norms(&self, base: &BaseWeight) -> Result<Tensor> {
        row_norms(base, &self.lora)
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

/// `‖W + up · down · s‖ + ε` per row of a layer's frozen weight and a LoRA's detached factors, [out, 1] in the
/// factors' work dtype (f32).
fn row_norms(base: &BaseWeight, lora: &Lora) -> Result<Tensor> {
    let (down, up) = (work_tensor(&lora.down)?, work_tensor(&lora.up)?);
    let w = (base.dense(down.dtype())? + (up.matmul(&down)? * lora.scale())?)?;
    w.sqr()?.sum_keepdim(1)?.sqrt()? + f64::from(f32::EPSILON)
}
