//! Adaptive modulation of the FLUX.1 blocks (`Modulation` of `modules/layers.py`): `lin(silu(vec))` split into
//! (shift, scale, gate) triples — two for a double-stream block's attention and MLP, one for a single-stream
//! block. The vectors are kept in f32; the residual arithmetic that uses them runs in f32 too.

use candle_core::{DType, Result, Tensor};

use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

/// One (shift, scale, gate) triple, each [b, 1, dim] f32.
#[derive(Clone, Debug)]
pub struct ModulationOut {
    pub shift: Tensor,
    pub scale: Tensor,
    pub gate: Tensor,
}

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
        let out = self
            .lin
            .forward(&vec.silu()?)?
            .to_dtype(DType::F32)?
            .unsqueeze(1)?;
        let n = if self.double { 6 } else { 3 };
        let chunks = out.chunk(n, 2)?;
        let triple = |i: usize| ModulationOut {
            shift: chunks[i].clone(),
            scale: chunks[i + 1].clone(),
            gate: chunks[i + 2].clone(),
        };
        let second = self.double.then(|| triple(3));
        Ok((triple(0), second))
    }
}
