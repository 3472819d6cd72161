//! Adaptive modulation of the FLUX.1 blocks (`Modulation` of `modules/layers.py`): `lin(silu(vec))` split into
//! (shift, scale, gate) triples — two for a double-stream block's attention and MLP, one for a single-stream
//! block. The vectors are kept in f32; the residual arithmetic that uses them runs in f32 too.

use candle_core::{Result, Tensor};

use crate::modulated::triples;
use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

pub use crate::modulated::ModulationOut;

/// `Modulation`: `lin` [multiplier·dim, dim] with multiplier 6 (double) or 3 (single).
#[derive(Clone)]
pub struct Modulation {
    pub lin: Linear,
    double: bool,
}

impl Modulation {
    pub fn new(dim: usize, double: bool, vb: &Vb) -> Result<Self> {
        let multiplier = if double { 6 } else { 3 };
        Ok(Self {
            lin: Linear::load(&vb.pp("lin"), dim, multiplier * dim)?,
            double,
        })
    }

    /// The triples for `vec` [b, dim]: the first, and the second for a double-stream block.
    pub fn forward(&self, vec: &Tensor) -> Result<(ModulationOut, Option<ModulationOut>)> {
        let count = if self.double { 2 } else { 1 };
        let mut mods = triples(&self.lin.forward(&vec.silu()?)?, count)?.into_iter();
        let first = mods
            .next()
            .ok_or_else(|| candle_core::Error::Msg("FLUX: no modulation triple".into()))?;
        Ok((first, mods.next()))
    }
}
