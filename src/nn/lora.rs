//! LoRA adapters: trainable `down` [rank, in] and `up` [out, rank] with `alpha` and a multiplier.

use candle_core::{DType, Device, Result, Tensor, Var};

/// A LoRA pair. `up` starts at zero so a fresh adapter leaves the model unchanged.
#[derive(Clone)]
pub struct Lora {
    pub down: Var,
    pub up: Var,
    pub alpha: f64,
    pub multiplier: f64,
}

impl Lora {
    /// A fresh adapter: `down` Kaiming-uniform like musubi-tuner (bound 1/sqrt(in)), `up` zero.
    pub fn new(
        in_dim: usize,
        out_dim: usize,
        rank: usize,
        alpha: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let bound = 1.0 / (in_dim as f64).sqrt();
        let down = Tensor::rand(-bound, bound, (rank, in_dim), device)?.to_dtype(dtype)?;
        let up = Tensor::zeros((out_dim, rank), dtype, device)?;
        Ok(Self {
            down: Var::from_tensor(&down)?,
            up: Var::from_tensor(&up)?,
            alpha,
            multiplier: 1.0,
        })
    }

    /// The rank (rows of `down`).
    pub fn rank(&self) -> usize {
        self.down.dims()[0]
    }

    /// The factor applied to `up(down(x))`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank() as f64 * self.multiplier
    }

    /// `up(down(x)) · scale` for `xs` [m, in], in `xs`' dtype.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dtype = xs.dtype();
        let down = self.down.as_tensor().to_dtype(dtype)?;
        let up = self.up.as_tensor().to_dtype(dtype)?;
        xs.matmul(&down.t()?)?.matmul(&up.t()?)? * self.scale()
    }
}
