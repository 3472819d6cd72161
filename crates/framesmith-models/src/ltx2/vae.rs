//! LTX-2's and LTX-2.3's video VAE as ltx-core defines it (`model/video_vae`: `VideoEncoder`,
//! `ConvVideoDecoder`), built from the block lists of the checkpoint's `config` metadata ([`config`]): pixels in
//! [−1, 1] [b, 3, 8k + 1, 32h, 32w] to latents [b, 128, k + 1, h, w] normalised by the per-channel statistics
//! (what the DiT and the trainer's caches hold), and back. The encoder pads time causally; the decoder as the
//! config says (the releases: symmetrically), and a timestep-conditioned decoder mixes noise into the latents and
//! runs at the official decode timestep 0.05 with noise 0.025. Large clips run in overlapping tiles blended with
//! ltx-core's trapezoidal masks ([`tiled`]). Files: [`weights`].

pub mod config;
mod layers;
pub mod tiled;
pub mod weights;

use candle_core::{DType, Result, Tensor};

use framesmith_nn::vb::Vb;
use layers::{
    modulate, patchify, pixel_norm, unpatchify, CausalConv, Downsample, ResStack, ResnetBlock,
    ResnetOptions, TimeEmbedder, Upsample,
};

pub use config::{DecoderBlock, EncoderBlock, LogVariance, Ltx2VaeConfig, Padding};
pub use tiled::{AxisTiles, VaeTiling};
pub use weights::{identify_vae, load_ltx2_vae, vae_from_tensors, Ltx2VaeError, Ltx2VaeFile};

/// The official decode defaults of a timestep-conditioned decoder (`ConvVideoDecoder.decode_timestep`,
/// `decode_noise_scale`).
pub const DECODE_TIMESTEP: f32 = 0.05;
pub const DECODE_NOISE_SCALE: f32 = 0.025;

/// `PerChannelStatistics` (`per_channel_statistics.{mean-of-means,std-of-means}` [latent]), kept in f32.
struct Statistics {
    mean: Tensor,
    std: Tensor,
}

impl Statistics {
    fn new(vb: &Vb, c: usize) -> Result<Self> {
        let shape = (1, c, 1, 1, 1);
        Ok(Self {
            mean: vb
                .get(c, "mean-of-means")?
                .to_dtype(DType::F32)?
                .reshape(shape)?,
            std: vb
                .get(c, "std-of-means")?
                .to_dtype(DType::F32)?
                .reshape(shape)?,
        })
    }

    fn normalize(&self, xs: &Tensor) -> Result<Tensor> {
        let x = xs.to_dtype(DType::F32)?;
        x.broadcast_sub(&self.mean)?.broadcast_div(&self.std)
    }

    fn un_normalize(&self, xs: &Tensor) -> Result<Tensor> {
        let x = xs.to_dtype(DType::F32)?;
        x.broadcast_mul(&self.std)?.broadcast_add(&self.mean)
    }
}

enum Down {
    Res(ResStack),
    Widen(ResnetBlock),
    Sample(Downsample),
}

/// `VideoEncoder` (keys `encoder.*`).
struct Encoder {
    conv_in: CausalConv,
    down_blocks: Vec<Down>,
    conv_out: CausalConv,
    latent_channels: usize,
    patch_size: usize,
}

impl Encoder {
    fn new(cfg: &Ltx2VaeConfig, vb: &Vb) -> Result<Self> {
        let pad = cfg.encoder_padding;
        let opts = ResnetOptions {
            padding: pad,
            timestep_conditioning: false,
            inject_noise: false,
        };
        let mut c = cfg.latent_channels;
        let c_first = cfg.in_channels * cfg.patch_size * cfg.patch_size;
        let mut down_blocks = Vec::with_capacity(cfg.encoder_blocks.len());
        for (i, block) in cfg.encoder_blocks.iter().enumerate() {
            let vb = vb.pp("down_blocks").pp(i);
            down_blocks.push(match *block {
                EncoderBlock::Res { layers } => Down::Res(ResStack::new(&vb, c, layers, opts)?),
                EncoderBlock::ResWiden { multiplier } => {
                    let out = c * multiplier;
                    let b = ResnetBlock::new(&vb, c, out, opts)?;
                    c = out;
                    Down::Widen(b)
                }
                EncoderBlock::Downsample { stride, multiplier } => {
                    let out = c * multiplier;
                    let d = Downsample::new(&vb, (c, out), stride, pad)?;
                    c = out;
                    Down::Sample(d)
                }
            });
        }
        let extra = match cfg.log_variance {
            LogVariance::Shared => 1,
            LogVariance::PerChannel => cfg.latent_channels,
        };
        Ok(Self {
            conv_in: CausalConv::new(&vb.pp("conv_in"), c_first, cfg.latent_channels, pad)?,
            down_blocks,
            conv_out: CausalConv::new(&vb.pp("conv_out"), c, cfg.latent_channels + extra, pad)?,
            latent_channels: cfg.latent_channels,
            patch_size: cfg.patch_size,
        })
    }

    /// The latent means, unnormalised.
    fn forward(&self, video: &Tensor) -> Result<Tensor> {
        let mut h = self
            .conv_in
            .forward(&patchify(video, self.patch_size)?, true)?;
        for block in &self.down_blocks {
            h = match block {
                Down::Res(s) => s.forward(&h, true, None)?,
                Down::Widen(b) => b.forward(&h, true, None)?,
                Down::Sample(d) => d.forward(&h)?,
            };
        }
        let h = self.conv_out.forward(&pixel_norm(&h)?.silu()?, true)?;
        h.narrow(1, 0, self.latent_channels)
    }
}

enum Up {
    Res(ResStack),
    Narrow(ResnetBlock),
    Sample(Upsample),
}

/// The timestep conditioning of the decoder's head: `timestep_scale_multiplier`, `last_time_embedder`,
/// `last_scale_shift_table` [2, c].
struct DecoderTimestep {
    multiplier: f32,
    last_time_embedder: TimeEmbedder,
    last_scale_shift_table: Tensor,
}

/// `ConvVideoDecoder` (keys `decoder.*`).
struct Decoder {
    conv_in: CausalConv,
    up_blocks: Vec<Up>,
    conv_out: CausalConv,
    timestep: Option<DecoderTimestep>,
    causal: bool,
    patch_size: usize,
}

impl Decoder {
    fn new(cfg: &Ltx2VaeConfig, vb: &Vb) -> Result<Self> {
        let pad = cfg.decoder_padding;
        let tc = cfg.timestep_conditioning;
        let mut c = cfg.decoder_bottleneck();
        let conv_in = CausalConv::new(&vb.pp("conv_in"), cfg.latent_channels, c, pad)?;
        let mut up_blocks = Vec::with_capacity(cfg.decoder_blocks.len());
        for (i, block) in cfg.decoder_blocks.iter().rev().enumerate() {
            let vb = vb.pp("up_blocks").pp(i);
            up_blocks.push(match *block {
                DecoderBlock::Res {
                    layers,
                    inject_noise,
                } => {
                    let opts = ResnetOptions {
                        padding: pad,
                        timestep_conditioning: tc,
                        inject_noise,
                    };
                    Up::Res(ResStack::new(&vb, c, layers, opts)?)
                }
                DecoderBlock::ResNarrow {
                    multiplier,
                    inject_noise,
                } => {
                    let opts = ResnetOptions {
                        padding: pad,
                        timestep_conditioning: false,
                        inject_noise,
                    };
                    let out = c / multiplier.max(1);
                    let b = ResnetBlock::new(&vb, c, out, opts)?;
                    c = out;
                    Up::Narrow(b)
                }
                DecoderBlock::Upsample {
                    stride,
                    multiplier,
                    residual,
                } => {
                    let u = Upsample::new(&vb, c, (stride, multiplier, residual), pad)?;
                    c /= multiplier.max(1);
                    Up::Sample(u)
                }
            });
        }
        let timestep = if tc {
            Some(DecoderTimestep {
                multiplier: vb
                    .get((), "timestep_scale_multiplier")?
                    .to_dtype(DType::F32)?
                    .to_scalar::<f32>()?,
                last_time_embedder: TimeEmbedder::new(&vb.pp("last_time_embedder"), 2 * c)?,
                last_scale_shift_table: vb.get((2, c), "last_scale_shift_table")?,
            })
        } else {
            None
        };
        let out = cfg.out_channels * cfg.patch_size * cfg.patch_size;
        Ok(Self {
            conv_in,
            up_blocks,
            conv_out: CausalConv::new(&vb.pp("conv_out"), c, out, pad)?,
            timestep,
            causal: cfg.causal_decoder,
            patch_size: cfg.patch_size,
        })
    }

    /// Video from unnormalised latents `z` (already noised when timestep-conditioned) at `timestep`.
    fn forward(&self, z: &Tensor, timestep: f32) -> Result<Tensor> {
        let b = z.dim(0)?;
        let scaled: Option<Vec<f32>> = self
            .timestep
            .as_ref()
            .map(|t| vec![timestep * t.multiplier; b]);
        let mut h = self.conv_in.forward(z, self.causal)?;
        for block in &self.up_blocks {
            h = match block {
                Up::Res(s) => s.forward(&h, self.causal, scaled.as_deref())?,
                Up::Narrow(r) => r.forward(&h, self.causal, None)?,
                Up::Sample(u) => u.forward(&h, self.causal)?,
            };
        }
        let mut h = pixel_norm(&h)?;
        if let (Some(t), Some(scaled)) = (&self.timestep, &scaled) {
            let emb = t.last_time_embedder.forward(scaled, h.dtype())?;
            let (_, c) = t.last_scale_shift_table.dims2()?;
            let rows = emb.reshape((b, 2, c))?.broadcast_add(
                &t.last_scale_shift_table
                    .to_dtype(emb.dtype())?
                    .unsqueeze(0)?,
            )?;
            let shift = rows.narrow(1, 0, 1)?.squeeze(1)?;
            let scale = rows.narrow(1, 1, 1)?.squeeze(1)?;
            h = modulate(&h, &shift, &scale)?;
        }
        unpatchify(
            &self.conv_out.forward(&h.silu()?, self.causal)?,
            self.patch_size,
        )
    }
}

/// How a timestep-conditioned decoder is called: the timestep, and the noise mixed into the latents (`None`:
/// drawn here from a standard normal) at `noise_scale`.
#[derive(Debug, Clone)]
pub struct DecodeConditioning {
    pub timestep: f32,
    pub noise_scale: f32,
    pub noise: Option<Tensor>,
}

impl Default for DecodeConditioning {
    /// The official inference call (`decode_timestep` 0.05, `decode_noise_scale` 0.025, fresh noise).
    fn default() -> Self {
        Self {
            timestep: DECODE_TIMESTEP,
            noise_scale: DECODE_NOISE_SCALE,
            noise: None,
        }
    }
}

/// LTX-2's video VAE (frozen; inference only).
pub struct Ltx2Vae {
    cfg: Ltx2VaeConfig,
    encoder: Encoder,
    decoder: Decoder,
    statistics: Statistics,
    dtype: DType,
}

impl Ltx2Vae {
    /// Builds the VAE from ltx-core's key names under `vb` (`encoder.*`, `decoder.*`, `per_channel_statistics.*`).
    pub fn new(cfg: &Ltx2VaeConfig, vb: &Vb) -> Result<Self> {
        Ok(Self {
            cfg: cfg.clone(),
            encoder: Encoder::new(cfg, &vb.pp("encoder"))?,
            decoder: Decoder::new(cfg, &vb.pp("decoder"))?,
            statistics: Statistics::new(&vb.pp("per_channel_statistics"), cfg.latent_channels)?,
            dtype: vb.dtype(),
        })
    }

    /// The architecture.
    pub fn config(&self) -> &Ltx2VaeConfig {
        &self.cfg
    }

    /// Normalised latents [b, latent, (t − 1)/ft + 1, h/fs, w/fs] of `video` [b, 3, t, h, w] in [−1, 1], `t` one
    /// more than a multiple of the temporal factor and `h`, `w` multiples of the spatial one; f32.
    pub fn encode(&self, video: &Tensor) -> Result<Tensor> {
        let (_, c, t, h, w) = video.dims5()?;
        let (fs, ft) = self.cfg.encoder_factors();
        if c != self.cfg.in_channels || t == 0 || (t - 1) % ft != 0 || h % fs != 0 || w % fs != 0 {
            candle_core::bail!(
                "LTX-2 VAE encode: video must be [b, {}, {ft}k + 1, h, w] with h and w multiples of {fs}, got {:?}",
                self.cfg.in_channels,
                video.dims()
            );
        }
        let means = self.encoder.forward(&video.to_dtype(self.dtype)?)?;
        self.statistics.normalize(&means)
    }

    /// Video [b, 3, ft(f − 1) + 1, fs·h, fs·w] (not clamped) from normalised latents `z` [b, latent, f, h, w];
    /// a timestep-conditioned decoder is called as `cond` says (ignored otherwise).
    pub fn decode(&self, z: &Tensor, cond: &DecodeConditioning) -> Result<Tensor> {
        let (_, c, f, _, _) = z.dims5()?;
        if c != self.cfg.latent_channels || f == 0 {
            candle_core::bail!(
                "LTX-2 VAE decode: latents must be [b, {}, f ≥ 1, h, w], got {:?}",
                self.cfg.latent_channels,
                z.dims()
            );
        }
        let z = if self.decoder.timestep.is_some() {
            let z32 = z.to_dtype(DType::F32)?;
            let noise = match &cond.noise {
                Some(n) => n.to_dtype(DType::F32)?,
                None => z32.randn_like(0.0, 1.0)?,
            };
            let s = f64::from(cond.noise_scale);
            ((noise * s)? + (z32 * (1.0 - s))?)?
        } else {
            z.clone()
        };
        let z = self.statistics.un_normalize(&z)?.to_dtype(self.dtype)?;
        self.decoder
            .forward(&z, cond.timestep)?
            .to_dtype(DType::F32)
    }

    /// The dtype the weights (and so the activations) are in.
    pub fn weights_dtype(&self) -> DType {
        self.dtype
    }
}

#[cfg(test)]
mod tests;
