//! The small embedders of the HunyuanVideo 1.5 transformer, with the official release's key names: the timestep
//! embedding (`time_in`: sinusoids of the raw timestep, then a SiLU MLP `mlp.0` / `mlp.2`), the latent patch
//! embedding (`img_in.proj`, a strided Conv3d applied as one matrix product per patch), the glyph projection
//! (`byt5_in`: LayerNorm, then `fc1` → GELU → `fc2` → GELU → `fc3`), the SigLIP image projection (`vision_in.proj`:
//! LayerNorm, linear, GELU, linear, LayerNorm) and the head (`final_layer`).

use candle_core::{DType, Result, Tensor};

use super::config::HunyuanVideo15Config;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::{layer_norm, AffineNorm};
use framesmith_nn::ops::modulate_to;
use framesmith_nn::vb::Vb;

/// Width of the sinusoidal timestep embedding.
pub const TIMESTEP_DIM: usize = 256;
/// Epsilon of PyTorch's default `nn.LayerNorm` (the glyph and image projections).
pub const TORCH_LAYER_NORM_EPS: f64 = 1e-5;
/// Epsilon of the head's parameter-free LayerNorm.
pub const FINAL_NORM_EPS: f64 = 1e-6;

/// The sinusoidal embedding of raw timesteps `t` [b] (the model's scale, 0–1000) → [b, dim] f32: [cos, sin] of
/// t·fᵢ with fᵢ = exp(−ln(10000)·i / half), i < half, rounded to f32 in the official order (the exponential,
/// cosine and sine evaluated in f64 and rounded).
pub fn timestep_embedding(t: &Tensor, dim: usize) -> Result<Tensor> {
    let ln_max_period = 10_000f64.ln() as f32;
    let half = dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| f64::from(-ln_max_period * i as f32 / half as f32).exp() as f32)
        .collect();
    let ts = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut out = Vec::with_capacity(ts.len() * dim);
    for &t in &ts {
        let args: Vec<f64> = freqs.iter().map(|f| f64::from(t * f)).collect();
        out.extend(args.iter().map(|a| a.cos() as f32));
        out.extend(args.iter().map(|a| a.sin() as f32));
        if dim % 2 == 1 {
            out.push(0.0);
        }
    }
    Tensor::from_vec(out, (ts.len(), dim), t.device())
}

/// `time_in` / `txt_in.t_embedder`: `mlp.2(silu(mlp.0(sinusoids(t))))`.
#[derive(Clone)]
pub struct TimestepEmbedder {
    pub mlp_0: Linear,
    pub mlp_2: Linear,
}

impl TimestepEmbedder {
    /// Reads `mlp.0` [dim, 256] and `mlp.2` [dim, dim] under `vb`.
    pub fn new(dim: usize, vb: &Vb) -> Result<Self> {
        let mlp = vb.pp("mlp");
        Ok(Self {
            mlp_0: Linear::load(&mlp.pp(0), TIMESTEP_DIM, dim)?,
            mlp_2: Linear::load(&mlp.pp(2), dim, dim)?,
        })
    }

    /// The conditioning vector [b, dim] for raw timesteps `t` [b], in `dtype`.
    pub fn forward(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let proj = timestep_embedding(t, TIMESTEP_DIM)?.to_dtype(dtype)?;
        self.mlp_2.forward(&self.mlp_0.forward(&proj)?.silu()?)
    }
}

/// `img_in`: the Conv3d of kernel = stride = (patch_size_t, patch_size, patch_size) over the latents, as a linear
/// on each patch's values in the kernel's (channel, frame, row, column) order.
#[derive(Clone)]
pub struct PatchEmbed {
    pub proj: Linear,
    patch: (usize, usize),
}

impl PatchEmbed {
    /// Reads `proj.weight` [dim, in_channels, pt, p, p] and `proj.bias` under `vb`.
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        let (c, pt, p) = (cfg.in_channels, cfg.patch_size_t, cfg.patch_size);
        let vb = vb.pp("proj");
        let weight = vb
            .get((cfg.inner_dim(), c, pt, p, p), "weight")?
            .reshape((cfg.inner_dim(), cfg.patch_dim()))?;
        let bias = vb.get(cfg.inner_dim(), "bias")?;
        Ok(Self {
            proj: Linear::from_weights(weight, Some(bias)),
            patch: (pt, p),
        })
    }

    /// Latents [b, c, f, h, w] → tokens [b, (f/pt)·(h/p)·(w/p), dim], frame-, row-, column-major.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.proj.forward(&patchify(xs, self.patch)?)
    }
}

/// Latents [b, c, f, h, w] as patch rows [b, tokens, c·pt·p·p].
pub fn patchify(xs: &Tensor, (pt, p): (usize, usize)) -> Result<Tensor> {
    let (b, c, f, h, w) = xs.dims5()?;
    if f % pt != 0 || h % p != 0 || w % p != 0 {
        candle_core::bail!(
            "HunyuanVideo 1.5: latents of {f}×{h}×{w} do not divide into patches of {pt}×{p}×{p}"
        );
    }
    let (nf, nh, nw) = (f / pt, h / p, w / p);
    xs.reshape(&[b, c, nf, pt, nh, p, nw, p][..])?
        .permute(vec![0, 2, 4, 6, 1, 3, 5, 7])?
        .reshape((b, nf * nh * nw, c * pt * p * p))
}

/// Predicted tokens [b, nf·nh·nw, c·pt·p·p] back to latents [b, c, nf·pt, nh·p, nw·p].
pub fn unpatchify(
    xs: &Tensor,
    (nf, nh, nw): (usize, usize, usize),
    (pt, p): (usize, usize),
) -> Result<Tensor> {
    let (b, _, width) = xs.dims3()?;
    let c = width / (pt * p * p);
    xs.reshape(&[b, nf, nh, nw, c, pt, p, p][..])?
        .permute(vec![0, 4, 1, 5, 2, 6, 3, 7])?
        .reshape((b, c, nf * pt, nh * p, nw * p))
}

/// `byt5_in`: the glyph encoder's hidden states [b, l, 1472] to the model width.
#[derive(Clone)]
pub struct ByT5Mapper {
    pub layernorm: AffineNorm,
    pub fc1: Linear,
    pub fc2: Linear,
    pub fc3: Linear,
}

impl ByT5Mapper {
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        let (input, hidden) = (cfg.text_embed_2_dim, cfg.byt5_hidden_dim);
        Ok(Self {
            layernorm: AffineNorm::new(input, TORCH_LAYER_NORM_EPS, &vb.pp("layernorm"))?,
            fc1: Linear::load(&vb.pp("fc1"), input, hidden)?,
            fc2: Linear::load(&vb.pp("fc2"), hidden, hidden)?,
            fc3: Linear::load(&vb.pp("fc3"), hidden, cfg.inner_dim())?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let xs = self.fc1.forward(&self.layernorm.forward(xs)?)?.gelu_erf()?;
        let xs = self.fc2.forward(&xs)?.gelu_erf()?;
        self.fc3.forward(&xs)
    }
}

/// `vision_in.proj`: the SigLIP image embeddings [b, n, 1152] of an I2V first frame to the model width.
#[derive(Clone)]
pub struct VisionProjection {
    /// `proj.0`.
    pub norm_in: AffineNorm,
    /// `proj.1`.
    pub linear_1: Linear,
    /// `proj.3`.
    pub linear_2: Linear,
    /// `proj.4`.
    pub norm_out: AffineNorm,
}

impl VisionProjection {
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        let (input, dim) = (cfg.image_embed_dim, cfg.inner_dim());
        let proj = vb.pp("proj");
        Ok(Self {
            norm_in: AffineNorm::new(input, TORCH_LAYER_NORM_EPS, &proj.pp(0))?,
            linear_1: Linear::load(&proj.pp(1), input, input)?,
            linear_2: Linear::load(&proj.pp(3), input, dim)?,
            norm_out: AffineNorm::new(dim, TORCH_LAYER_NORM_EPS, &proj.pp(4))?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let xs = self
            .linear_1
            .forward(&self.norm_in.forward(xs)?)?
            .gelu_erf()?;
        self.norm_out.forward(&self.linear_2.forward(&xs)?)
    }
}

/// `final_layer`: `linear(modulate(LayerNorm(x), shift, scale))` with (shift, scale) = `adaLN_modulation.1(silu(
/// temb))` — shift first, as the official release stores it (diffusers' `norm_out.linear` holds the halves
/// swapped).
#[derive(Clone)]
pub struct FinalLayer {
    /// `adaLN_modulation.1` [2·dim, dim].
    pub ada_ln_modulation: Linear,
    pub linear: Linear,
}

impl FinalLayer {
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        let dim = cfg.inner_dim();
        Ok(Self {
            ada_ln_modulation: Linear::load(&vb.pp("adaLN_modulation").pp(1), dim, 2 * dim)?,
            linear: Linear::load(&vb.pp("linear"), dim, cfg.out_dim())?,
        })
    }

    /// Image tokens [b, l, dim] and `temb` [b, dim] → predicted tokens [b, l, out_dim] in `temb`'s dtype.
    pub fn forward(&self, xs: &Tensor, temb: &Tensor) -> Result<Tensor> {
        let m = self
            .ada_ln_modulation
            .forward(&temb.silu()?)?
            .to_dtype(DType::F32)?
            .unsqueeze(1)?;
        let chunks = m.chunk(2, 2)?;
        let (shift, scale) = (&chunks[0], &chunks[1]);
        let normed = layer_norm(xs, None, None, FINAL_NORM_EPS)?;
        self.linear
            .forward(&modulate_to(&normed, scale, shift, temb.dtype())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn cosines_come_first_and_time_is_not_rescaled() -> Result<()> {
        let t = Tensor::new(&[0f32, 500.0], &Device::Cpu)?;
        let emb = timestep_embedding(&t, 6)?;
        assert_eq!(
            emb.get(0)?.to_vec1::<f32>()?,
            vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
        );
        let row = emb.get(1)?.to_vec1::<f32>()?;
        assert!((row[0] - 500f32.cos()).abs() < 1e-6 && (row[3] - 500f32.sin()).abs() < 1e-6);
        Ok(())
    }

    #[test]
    fn unpatchify_inverts_patchify() -> Result<()> {
        let xs = Tensor::arange(0f32, 2.0 * 3.0 * 2.0 * 4.0 * 6.0, &Device::Cpu)?
            .reshape((2, 3, 2, 4, 6))?;
        let tokens = patchify(&xs, (2, 2))?;
        assert_eq!(tokens.dims(), [2, 6, 24]);
        // Token 0's first values: channel 0, frames 0–1, rows 0–1, columns 0–1.
        assert_eq!(
            tokens.get(0)?.get(0)?.narrow(0, 0, 8)?.to_vec1::<f32>()?,
            vec![0.0, 1.0, 6.0, 7.0, 24.0, 25.0, 30.0, 31.0]
        );
        let back = unpatchify(&tokens, (1, 2, 3), (2, 2))?;
        let diff = (back - &xs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        Ok(())
    }
}
