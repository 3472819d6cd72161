//! Encoder and decoder of the Wan 2.1 VAE (`Encoder3d` / `Decoder3d` of `wan/modules/vae.py`): residual stages
//! with optional attention, 2× spatial resampling per stage (temporal where configured), a middle block with
//! attention, and an RMS norm + SiLU + conv head.

use candle_core::{Result, Tensor};

use super::layers::{
    AttentionBlock, CausalConv3d, FeatCache, Resample, ResampleMode, ResidualBlock, RmsNorm,
};
use super::VaeConfig;
use framesmith_nn::vb::Vb;

/// One entry of a `downsamples` / `upsamples` sequence.
enum Layer {
    Residual(ResidualBlock),
    Attention(AttentionBlock),
    Resample(Resample),
}

impl Layer {
    fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        match self {
            Layer::Residual(r) => r.forward(xs, cache),
            Layer::Attention(a) => a.forward(xs),
            Layer::Resample(r) => r.forward(xs, cache),
        }
    }
}

/// `middle`: residual, attention, residual at the lowest resolution.
pub(super) struct Middle {
    res0: ResidualBlock,
    attn: AttentionBlock,
    res2: ResidualBlock,
}

impl Middle {
    pub(super) fn new(vb: &Vb, dim: usize) -> Result<Self> {
        Ok(Self {
            res0: ResidualBlock::new(&vb.pp(0), dim, dim)?,
            attn: AttentionBlock::new(&vb.pp(1), dim)?,
            res2: ResidualBlock::new(&vb.pp(2), dim, dim)?,
        })
    }

    pub(super) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let xs = self.res0.forward(xs, cache)?;
        let xs = self.attn.forward(&xs)?;
        self.res2.forward(&xs, cache)
    }
}

/// `head`: RMS norm (`head.0`), SiLU, causal 3×3×3 conv (`head.2`).
pub(super) struct Head {
    norm: RmsNorm,
    conv: CausalConv3d,
}

impl Head {
    pub(super) fn new(vb: &Vb, c_in: usize, c_out: usize) -> Result<Self> {
        Ok(Self {
            norm: RmsNorm::new(&vb.pp(0), c_in, false)?,
            conv: CausalConv3d::cube(&vb.pp(2), c_in, c_out, 3)?,
        })
    }

    pub(super) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        self.conv
            .forward_cached(&self.norm.forward(xs)?.silu()?, cache)
    }
}

/// Wan 2.1 `Encoder3d` producing `2·z_dim` channels (mean and log-variance).
pub(super) struct Encoder {
    conv1: CausalConv3d,
    downsamples: Vec<Layer>,
    middle: Middle,
    head: Head,
}

impl Encoder {
    pub(super) fn new(cfg: &VaeConfig, vb: &Vb) -> Result<Self> {
        let dims: Vec<usize> = std::iter::once(1)
            .chain(cfg.dim_mult.iter().copied())
            .map(|u| cfg.dim * u)
            .collect();
        let mut layers = Vec::new();
        let mut scale = 1.0f64;
        let down = vb.pp("downsamples");
        for (i, pair) in dims.windows(2).enumerate() {
            let (mut c_in, c_out) = (pair[0], pair[1]);
            for _ in 0..cfg.num_res_blocks {
                layers.push(Layer::Residual(ResidualBlock::new(
                    &down.pp(layers.len()),
                    c_in,
                    c_out,
                )?));
                if cfg.attn_scales.contains(&scale) {
                    layers.push(Layer::Attention(AttentionBlock::new(
                        &down.pp(layers.len()),
                        c_out,
                    )?));
                }
                c_in = c_out;
            }
            if i != cfg.dim_mult.len() - 1 {
                let mode = if cfg.temporal_downsample.get(i).copied().unwrap_or(false) {
                    ResampleMode::Downsample3d
                } else {
                    ResampleMode::Downsample2d
                };
                layers.push(Layer::Resample(Resample::new(
                    &down.pp(layers.len()),
                    c_out,
                    mode,
                    c_out,
                )?));
                scale /= 2.0;
            }
        }
        let out = dims[dims.len() - 1];
        Ok(Self {
            conv1: CausalConv3d::cube(&vb.pp("conv1"), 3, dims[0], 3)?,
            downsamples: layers,
            middle: Middle::new(&vb.pp("middle"), out)?,
            head: Head::new(&vb.pp("head"), out, cfg.z_dim * 2)?,
        })
    }

    /// One chunk of frames through the encoder, updating `cache`.
    pub(super) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let mut xs = self.conv1.forward_cached(xs, cache)?;
        for layer in &self.downsamples {
            xs = layer.forward(&xs, cache)?;
        }
        let xs = self.middle.forward(&xs, cache)?;
        self.head.forward(&xs, cache)
    }
}

/// Wan 2.1 `Decoder3d` from `z_dim` channels to RGB.
pub(super) struct Decoder {
    conv1: CausalConv3d,
    middle: Middle,
    upsamples: Vec<Layer>,
    head: Head,
}

impl Decoder {
    pub(super) fn new(cfg: &VaeConfig, vb: &Vb) -> Result<Self> {
        let n = cfg.dim_mult.len();
        let mults = std::iter::once(cfg.dim_mult[n - 1]).chain(cfg.dim_mult.iter().rev().copied());
        let dims: Vec<usize> = mults.map(|u| cfg.dec_dim * u).collect();
        let temporal_upsample: Vec<bool> = cfg.temporal_downsample.iter().rev().copied().collect();
        let mut scale = 1.0 / 2f64.powi(n as i32 - 2);
        let mut layers = Vec::new();
        let up = vb.pp("upsamples");
        for (i, pair) in dims.windows(2).enumerate() {
            let (mut c_in, c_out) = (pair[0], pair[1]);
            // The official code halves the input width of stages 1..=3 (the width after each upsampling conv).
            if (1..=3).contains(&i) {
                c_in /= 2;
            }
            for _ in 0..cfg.num_res_blocks + 1 {
                layers.push(Layer::Residual(ResidualBlock::new(
                    &up.pp(layers.len()),
                    c_in,
                    c_out,
                )?));
                if cfg.attn_scales.contains(&scale) {
                    layers.push(Layer::Attention(AttentionBlock::new(
                        &up.pp(layers.len()),
                        c_out,
                    )?));
                }
                c_in = c_out;
            }
            if i != n - 1 {
                let mode = if temporal_upsample.get(i).copied().unwrap_or(false) {
                    ResampleMode::Upsample3d
                } else {
                    ResampleMode::Upsample2d
                };
                layers.push(Layer::Resample(Resample::new(
                    &up.pp(layers.len()),
                    c_out,
                    mode,
                    c_out / 2,
                )?));
                scale *= 2.0;
            }
        }
        let out = dims[dims.len() - 1];
        Ok(Self {
            conv1: CausalConv3d::cube(&vb.pp("conv1"), cfg.z_dim, dims[0], 3)?,
            middle: Middle::new(&vb.pp("middle"), dims[0])?,
            upsamples: layers,
            head: Head::new(&vb.pp("head"), out, 3)?,
        })
    }

    /// One latent frame through the decoder, updating `cache`.
    pub(super) fn forward(&self, xs: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let xs = self.conv1.forward_cached(xs, cache)?;
        let mut xs = self.middle.forward(&xs, cache)?;
        for layer in &self.upsamples {
            xs = layer.forward(&xs, cache)?;
        }
        self.head.forward(&xs, cache)
    }
}
