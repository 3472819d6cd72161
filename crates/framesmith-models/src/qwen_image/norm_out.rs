//! The head's normalisation of the Qwen-Image transformer (`norm_out`, diffusers' `AdaLayerNormContinuous`
//! without affine parameters): `linear(silu(temb))` split into (scale, shift) — scale first — applied to a
//! parameter-free LayerNorm (eps 1e-6) of the image tokens.

use candle_core::{DType, Result, Tensor};

use framesmith_nn::linear::Linear;
use framesmith_nn::norm::layer_norm;
use framesmith_nn::ops::modulate_to;
use framesmith_nn::vb::Vb;

/// Epsilon of the LayerNorm.
pub const NORM_OUT_EPS: f64 = 1e-6;

/// `norm_out`.
#[derive(Clone)]
pub struct AdaNormOut {
    /// `norm_out.linear` [2·dim, dim].
    pub linear: Linear,
}

impl AdaNormOut {
    pub fn new(dim: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            linear: Linear::load(&vb.pp("linear"), dim, 2 * dim)?,
        })
    }

    /// `xs` [b, l, dim], `temb` [b, dim] → [b, l, dim] in `temb`'s dtype.
    pub fn forward(&self, xs: &Tensor, temb: &Tensor) -> Result<Tensor> {
        let m = self
            .linear
            .forward(&temb.silu()?)?
            .to_dtype(DType::F32)?
            .unsqueeze(1)?;
        let chunks = m.chunk(2, 2)?;
        let (scale, shift) = (&chunks[0], &chunks[1]);
        let normed = layer_norm(xs, None, None, NORM_OUT_EPS)?;
        modulate_to(&normed, scale, shift, temb.dtype())
    }
}
