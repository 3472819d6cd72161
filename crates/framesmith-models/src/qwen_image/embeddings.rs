//! The timestep embedding of the Qwen-Image transformer (`time_text_embed`: diffusers' `Timesteps(256,
//! flip_sin_to_cos=True, downscale_freq_shift=0, scale=1000)` then `TimestepEmbedding`, a SiLU MLP of `linear_1`
//! and `linear_2`).

use candle_core::{DType, Result, Tensor};

use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

/// Width of the sinusoidal embedding.
pub const TIMESTEP_DIM: usize = 256;

/// The sinusoidal embedding of `t` [b] in [0, 1] → [b, dim] f32: [cos, sin] of (t·fᵢ)·1000 with
/// fᵢ = exp(−ln(10000)·i / half), i < half (an odd `dim` gets a zero column). Every product is rounded to f32 in
/// the official order; the exponential, cosine and sine are evaluated in f64 and rounded.
pub fn timestep_embedding(t: &Tensor, dim: usize) -> Result<Tensor> {
    const SCALE: f32 = 1000.0;
    let ln_max_period = 10_000f64.ln() as f32;
    let half = dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| f64::from(-ln_max_period * i as f32 / half as f32).exp() as f32)
        .collect();
    let ts = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut out = Vec::with_capacity(ts.len() * dim);
    for &t in &ts {
        let args: Vec<f64> = freqs.iter().map(|f| f64::from(t * f * SCALE)).collect();
        out.extend(args.iter().map(|a| a.cos() as f32));
        out.extend(args.iter().map(|a| a.sin() as f32));
        if dim % 2 == 1 {
            out.push(0.0);
        }
    }
    Tensor::from_vec(out, (ts.len(), dim), t.device())
}

/// `time_text_embed.timestep_embedder`: `linear_2(silu(linear_1(x)))`.
#[derive(Clone)]
pub struct TimestepEmbedding {
    pub linear_1: Linear,
    pub linear_2: Linear,
}

impl TimestepEmbedding {
    /// Reads `linear_1` [dim, 256] and `linear_2` [dim, dim] under `vb`.
    pub fn new(dim: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            linear_1: Linear::load(&vb.pp("linear_1"), TIMESTEP_DIM, dim)?,
            linear_2: Linear::load(&vb.pp("linear_2"), dim, dim)?,
        })
    }

    /// The conditioning vector `temb` [b, dim] for timesteps `t` [b] in [0, 1], in `dtype`.
    pub fn forward(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let proj = timestep_embedding(t, TIMESTEP_DIM)?.to_dtype(dtype)?;
        self.linear_2
            .forward(&self.linear_1.forward(&proj)?.silu()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn cosines_come_first_and_time_is_scaled_by_1000() -> Result<()> {
        let t = Tensor::new(&[0f32, 0.5], &Device::Cpu)?;
        let emb = timestep_embedding(&t, 7)?;
        assert_eq!(emb.dims(), [2, 7]);
        assert_eq!(
            emb.get(0)?.to_vec1::<f32>()?,
            vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
        // The first frequency is 1: cos(500), sin(500).
        let row = emb.get(1)?.to_vec1::<f32>()?;
        assert!((row[0] - 500f32.cos()).abs() < 1e-6 && (row[3] - 500f32.sin()).abs() < 1e-6);
        Ok(())
    }
}
