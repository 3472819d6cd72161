//! The embedders before LTX-2's blocks, with ltx-core's key names: the AdaLN-single timestep embedding
//! (`adaln_single`, `prompt_adaln_single`: a 256-wide sinusoid, cosines first, through
//! `emb.timestep_embedder.linear_1` → SiLU → `linear_2`, then SiLU → `linear` to the blocks' modulation rows) and
//! LTX-2's caption projection (`caption_projection`: `linear_1` → GELU-tanh → `linear_2`).

use candle_core::{DType, Device, Result, Tensor};

use framesmith_nn::linear::Linear;
use framesmith_nn::ops::gelu_tanh;
use framesmith_nn::vb::Vb;

/// Width of the sinusoidal timestep features.
pub const TIMESTEP_CHANNELS: usize = 256;

/// The sinusoidal features of `timesteps` (already scaled, e.g. σ · 1000), [n, 256] f32: `cos(t·fᵢ)` then
/// `sin(t·fᵢ)` with `fᵢ = exp(−ln(10⁴) · i / 128)`, in f32 as ltx-core's `get_timestep_embedding` computes them.
pub fn timestep_sinusoid(timesteps: &[f32], device: &Device) -> Result<Tensor> {
    let half = TIMESTEP_CHANNELS / 2;
    let scale = -(10000f64.ln()) as f32;
    let freqs: Vec<f32> = (0..half)
        .map(|i| (scale * i as f32 / half as f32).exp())
        .collect();
    let mut out = Vec::with_capacity(timesteps.len() * TIMESTEP_CHANNELS);
    for &t in timesteps {
        out.extend(freqs.iter().map(|&f| (t * f).cos()));
        out.extend(freqs.iter().map(|&f| (t * f).sin()));
    }
    Tensor::from_vec(out, (timesteps.len(), TIMESTEP_CHANNELS), device)
}

/// `AdaLayerNormSingle`: the timestep embedding and the modulation rows the blocks read.
#[derive(Clone)]
pub struct AdaLayerNormSingle {
    /// `emb.timestep_embedder.linear_1` [dim, 256].
    pub linear_1: Linear,
    /// `emb.timestep_embedder.linear_2` [dim, dim].
    pub linear_2: Linear,
    /// `linear` [coefficient · dim, dim].
    pub linear: Linear,
}

impl AdaLayerNormSingle {
    /// Reads the embedder of width `dim` giving `coefficient` rows under `vb`.
    pub fn load(vb: &Vb, dim: usize, coefficient: usize) -> Result<Self> {
        let emb = vb.pp("emb").pp("timestep_embedder");
        Ok(Self {
            linear_1: Linear::load(&emb.pp("linear_1"), TIMESTEP_CHANNELS, dim)?,
            linear_2: Linear::load(&emb.pp("linear_2"), dim, dim)?,
            linear: Linear::load(&vb.pp("linear"), dim, coefficient * dim)?,
        })
    }

    /// For scaled `timesteps` (one per sample): the modulation rows [n, coefficient · dim] and the embedded
    /// timestep [n, dim] (what the output head modulates with), in `dtype`.
    pub fn forward(&self, timesteps: &[f32], dtype: DType) -> Result<(Tensor, Tensor)> {
        let device = self.linear.base().device().clone();
        let proj = timestep_sinusoid(timesteps, &device)?.to_dtype(dtype)?;
        let embedded = self
            .linear_2
            .forward(&self.linear_1.forward(&proj)?.silu()?)?;
        let rows = self.linear.forward(&embedded.silu()?)?;
        Ok((rows, embedded))
    }
}

/// LTX-2's `caption_projection` (PixArt's text projection): the connector's output to the model width.
#[derive(Clone)]
pub struct CaptionProjection {
    pub linear_1: Linear,
    pub linear_2: Linear,
}

impl CaptionProjection {
    /// Reads the projection from `in_dim` channels to `dim` under `vb`.
    pub fn load(vb: &Vb, in_dim: usize, dim: usize) -> Result<Self> {
        Ok(Self {
            linear_1: Linear::load(&vb.pp("linear_1"), in_dim, dim)?,
            linear_2: Linear::load(&vb.pp("linear_2"), dim, dim)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.linear_2
            .forward(&gelu_tanh(&self.linear_1.forward(xs)?)?)
    }
}
