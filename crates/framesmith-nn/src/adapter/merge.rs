//! Folding an adapter into its layer's weight (`framesmith lora merge`): the dense weight the layer's forward with
//! the adapter computes with, so a merged model computes what the adapted one does (up to the file's rounding).

use candle_core::{DType, Result, Tensor};

use super::{work_tensor, Adapter};

impl Adapter {
    /// `W'` [out, in] f32 for a frozen weight `weight` [out, in] (any float dtype): LoRA `W + s·up·down`, LoKr
    /// and LoHa `W + ΔW` (scale and multiplier included), DoRA `g ⊙ (W + s·up·down)` with the row gain
    /// `1 + multiplier · (m / ‖W + s·up·down‖ − 1)` as its forward computes it.
    pub fn merged_weight(&self, weight: &Tensor) -> Result<Tensor> {
        let w = weight.to_dtype(DType::F32)?;
        let (out_dim, in_dim) = w.dims2()?;
        if (out_dim, in_dim) != (self.out_dim(), self.in_dim()) {
            candle_core::bail!(
                "a {} adapter of in {}, out {} does not fit a weight of in {in_dim}, out {out_dim}",
                self.kind_name(),
                self.in_dim(),
                self.out_dim()
            );
        }
        match self {
            Self::Lora(l) => {
                let (down, up) = (work_tensor(&l.down)?, work_tensor(&l.up)?);
                w + (up.matmul(&down)? * l.scale())?.to_dtype(DType::F32)?
            }
            Self::Lokr(_) | Self::Loha(_) => {
                let delta = self
                    .delta(false)?
                    .ok_or_else(|| candle_core::Error::msg("no weight update"))?;
                w + delta.to_dtype(DType::F32)?
            }
            Self::Dora(d) => {
                let (down, up) = (work_tensor(&d.lora.down)?, work_tensor(&d.lora.up)?);
                let z = (w + (up.matmul(&down)? * d.lora.scale())?.to_dtype(DType::F32)?)?;
                let norms = (z.sqr()?.sum_keepdim(1)?.sqrt()? + f64::from(f32::EPSILON))?;
                let magnitude = work_tensor(&d.magnitude)?.to_dtype(DType::F32)?;
                let gain = d.gain(&norms, &magnitude)?;
                z.broadcast_mul(&gain)
            }
        }
    }
}
