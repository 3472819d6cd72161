//! The head of the FLUX.1 DiT (`LastLayer` of `modules/layers.py`): LayerNorm without parameters (`norm_final`),
//! modulation by `adaLN_modulation` (SiLU → Linear to shift and scale), then `linear` to the packed latent width.

use candle_core::{DType, Result, Tensor};

use super::block::LAYER_NORM_EPS;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::layer_norm;
use framesmith_nn::ops::modulate_to;
use framesmith_nn::vb::Vb;

/// `final_layer`.
#[derive(Clone)]
pub struct LastLayer {
    pub linear: Linear,
    /// `adaLN_modulation.1`.
    pub ada_ln_modulation: Linear,
}

impl LastLayer {
    pub fn new(hidden_size: usize, out_channels: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            linear: Linear::load(&vb.pp("linear"), hidden_size, out_channels)?,
            ada_ln_modulation: Linear::load(
                &vb.pp("adaLN_modulation").pp(1),
                hidden_size,
                2 * hidden_size,
            )?,
        })
    }

    /// `xs` [b, l, dim] (image rows only), `vec` [b, dim] → [b, l, out_channels] in the compute dtype.
    pub fn forward(&self, xs: &Tensor, vec: &Tensor) -> Result<Tensor> {
        let m = self
            .ada_ln_modulation
            .forward(&vec.silu()?)?
            .to_dtype(DType::F32)?
            .unsqueeze(1)?;
        let chunks = m.chunk(2, 2)?;
        let (shift, scale) = (&chunks[0], &chunks[1]);
        let normed = layer_norm(xs, None, None, LAYER_NORM_EPS)?;
        self.linear
            .forward(&modulate_to(&normed, scale, shift, vec.dtype())?)
    }
}
