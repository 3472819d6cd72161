//! Conditioning embeddings of the FLUX.1 DiT (`timestep_embedding` of `model.py`'s helpers and `MLPEmbedder` of
//! `modules/layers.py`): the sinusoidal embedding of the timestep and of the guidance strength, and the
//! two-layer SiLU MLP (`in_layer`, `out_layer`) that `time_in`, `guidance_in` and `vector_in` all are.

use candle_core::{DType, Result, Tensor};

use framesmith_nn::linear::Linear;
use framesmith_nn::vb::Vb;

/// Width of the sinusoidal embeddings (`timestep_embedding(t, 256)` officially).
pub const TIMESTEP_DIM: usize = 256;

/// `timestep_embedding(t, dim)`: [cos, sin] of (1000·t)·10000^(−i/half), i < half, with the official float32
/// arguments, each function evaluated in f64 and rounded (an odd `dim` gets a zero column). `t` [b] in [0, 1] →
/// [b, dim] f32.
pub fn timestep_embedding(t: &Tensor, dim: usize) -> Result<Tensor> {
    const TIME_FACTOR: f32 = 1000.0;
    let max_period_ln = 10_000f64.ln() as f32;
    let half = dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| f64::from(-max_period_ln * i as f32 / half as f32).exp() as f32)
        .collect();
    let ts = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut out = Vec::with_capacity(ts.len() * dim);
    for &t in &ts {
        let t = t * TIME_FACTOR;
        out.extend(freqs.iter().map(|f| f64::from(t * f).cos() as f32));
        out.extend(freqs.iter().map(|f| f64::from(t * f).sin() as f32));
        if dim % 2 == 1 {
            out.push(0.0);
        }
    }
    Tensor::from_vec(out, (ts.len(), dim), t.device())
}

/// `MLPEmbedder`: `out_layer(silu(in_layer(x)))`.
#[derive(Clone)]
pub struct MlpEmbedder {
    pub in_layer: Linear,
    pub out_layer: Linear,
}

impl MlpEmbedder {
    pub fn new(in_dim: usize, hidden_dim: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            in_layer: Linear::load(&vb.pp("in_layer"), in_dim, hidden_dim)?,
            out_layer: Linear::load(&vb.pp("out_layer"), hidden_dim, hidden_dim)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.out_layer.forward(&self.in_layer.forward(xs)?.silu()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn zero_time_is_cos_one_sin_zero() -> Result<()> {
        let t = Tensor::new(&[0f32, 0.5], &Device::Cpu)?;
        let emb = timestep_embedding(&t, 7)?;
        assert_eq!(emb.dims(), [2, 7]);
        let row = emb.get(0)?.to_vec1::<f32>()?;
        assert_eq!(row, vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        // First frequency is 1: cos(500), sin(500).
        let row = emb.get(1)?.to_vec1::<f32>()?;
        assert!((row[0] - 500f32.cos()).abs() < 1e-6 && (row[3] - 500f32.sin()).abs() < 1e-6);
        Ok(())
    }
}
