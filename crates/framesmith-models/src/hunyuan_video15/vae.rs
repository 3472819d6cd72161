//! HunyuanVideo 1.5's 3-D causal VAE (official `AutoencoderKLConv3D`, `hyvideo/models/autoencoders/
//! hunyuanvideo_15_vae.py`; diffusers' `AutoencoderKLHunyuanVideo15` is the same network under other key names):
//! 32 latent channels, 16× spatial and 4× temporal compression, a frame-causal attention in the middle of encoder
//! and decoder. The official code runs a clip whole (spatially tiled with blending, [`tiled`]); here a clip also
//! runs in temporal chunks carrying each layer's causal context, which gives the whole-clip result with the memory
//! of a chunk. Latents are the posterior's mean, unscaled (musubi-tuner's caches hold them so); the DiT works on
//! them × [`Hv15VaeConfig::scaling_factor`]. Files and key layouts: [`weights`].

mod layers;
pub mod tiled;
pub mod weights;

use candle_core::{Result, Tensor};
use serde::Deserialize;

use crate::wan::vae::layers::RmsNorm;
use framesmith_nn::vb::Vb;
use layers::{
    group_mean, repeat_channels, AttnBlock, CausalConv, Downsample, ResnetBlock, Stream, Upsample,
};

pub use tiled::SpatialTiles;
pub use weights::{load_hv15_vae, Hv15VaeLayout};

/// Constructor arguments of the official `AutoencoderKLConv3D` (its `config.json`; diffusers' names are accepted
/// as aliases).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Hv15VaeConfig {
    /// Image channels in (3).
    pub in_channels: usize,
    /// Image channels out (3).
    pub out_channels: usize,
    /// Latent channels (32).
    pub latent_channels: usize,
    /// Encoder widths per level; the decoder runs them reversed.
    pub block_out_channels: Vec<usize>,
    /// Residual blocks per encoder level (the decoder has one more).
    pub layers_per_block: usize,
    /// Pixels per latent pixel (16).
    #[serde(alias = "spatial_compression_ratio")]
    pub ffactor_spatial: usize,
    /// Frames per latent frame after the first (4).
    #[serde(alias = "temporal_compression_ratio")]
    pub ffactor_temporal: usize,
    /// The factor the DiT's latents carry over the VAE's (1.03682).
    #[serde(default = "released_scaling_factor")]
    pub scaling_factor: f64,
}

/// The released VAE's `scaling_factor` (its `config.json`; musubi-tuner's `VAE_SCALING_FACTOR`).
pub const HV15_VAE_SCALING_FACTOR: f64 = 1.03682;

fn released_scaling_factor() -> f64 {
    HV15_VAE_SCALING_FACTOR
}

impl Hv15VaeConfig {
    /// The released VAE (`tencent/HunyuanVideo-1.5` `vae/config.json`).
    pub fn released() -> Self {
        Self {
            in_channels: 3,
            out_channels: 3,
            latent_channels: 32,
            block_out_channels: vec![128, 256, 512, 1024, 1024],
            layers_per_block: 2,
            ffactor_spatial: 16,
            ffactor_temporal: 4,
            scaling_factor: HV15_VAE_SCALING_FACTOR,
        }
    }

    /// Reads the constructor arguments from a `config.json` text.
    pub fn from_json(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }

    fn log2(n: usize) -> usize {
        n.max(1).trailing_zeros() as usize
    }

    /// Whether encoder level `i` halves space, and whether it halves time too.
    fn encoder_downsample(&self, i: usize) -> (bool, bool) {
        let spatial = i < Self::log2(self.ffactor_spatial);
        let temporal =
            spatial && i >= Self::log2(self.ffactor_spatial / self.ffactor_temporal.max(1));
        (spatial, temporal)
    }

    /// Whether decoder level `i` upsamples, and whether it doubles time.
    fn decoder_upsample(&self, i: usize) -> (bool, bool) {
        let temporal = i < Self::log2(self.ffactor_temporal);
        (i < Self::log2(self.ffactor_spatial) || temporal, temporal)
    }

    /// Latent frames of a clip of `frames` (4n + 1) frames.
    pub fn latent_frames(&self, frames: usize) -> usize {
        frames.saturating_sub(1) / self.ffactor_temporal.max(1) + 1
    }
}

/// One encoder or decoder level: residual blocks, then an optional resampler.
struct Level<S> {
    blocks: Vec<ResnetBlock>,
    sample: Option<S>,
}

/// The middle of encoder and decoder: `block_1`, `attn_1`, `block_2`.
struct Mid {
    block_1: ResnetBlock,
    attn_1: AttnBlock,
    block_2: ResnetBlock,
}

impl Mid {
    fn new(vb: &Vb, c: usize) -> Result<Self> {
        Ok(Self {
            block_1: ResnetBlock::new(&vb.pp("block_1"), c, c)?,
            attn_1: AttnBlock::new(&vb.pp("attn_1"), c)?,
            block_2: ResnetBlock::new(&vb.pp("block_2"), c, c)?,
        })
    }

    fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let xs = self.block_1.forward(xs, stream)?;
        let xs = self.attn_1.forward(&xs, stream)?;
        self.block_2.forward(&xs, stream)
    }
}

/// The encoder (keys `encoder.*`): video [b, 3, t, h, w] → moments [b, 2·latent, f, h/16, w/16].
pub(crate) struct Encoder {
    conv_in: CausalConv,
    down: Vec<Level<Downsample>>,
    mid: Mid,
    norm_out: RmsNorm,
    conv_out: CausalConv,
    group: usize,
}

impl Encoder {
    fn new(cfg: &Hv15VaeConfig, vb: &Vb) -> Result<Self> {
        let widths = &cfg.block_out_channels;
        let (Some(&first), Some(&last)) = (widths.first(), widths.last()) else {
            candle_core::bail!("VAE config: block_out_channels is empty");
        };
        let moments = 2 * cfg.latent_channels;
        if moments == 0 || last % moments != 0 {
            candle_core::bail!("VAE config: {last} channels do not fold into {moments} moments");
        }
        let mut c_in = first;
        let mut down = Vec::with_capacity(widths.len());
        for (i, &c) in widths.iter().enumerate() {
            let vb = vb.pp("down").pp(i);
            let mut blocks = Vec::with_capacity(cfg.layers_per_block);
            for j in 0..cfg.layers_per_block {
                blocks.push(ResnetBlock::new(&vb.pp("block").pp(j), c_in, c)?);
                c_in = c;
            }
            let sample = match cfg.encoder_downsample(i) {
                (true, temporal) => {
                    let Some(&next) = widths.get(i + 1) else {
                        candle_core::bail!("VAE config: level {i} downsamples but is the last");
                    };
                    let d = Downsample::new(&vb.pp("downsample"), c_in, next, temporal)?;
                    c_in = next;
                    Some(d)
                }
                (false, _) => None,
            };
            down.push(Level { blocks, sample });
        }
        Ok(Self {
            conv_in: CausalConv::new(&vb.pp("conv_in"), cfg.in_channels, first)?,
            down,
            mid: Mid::new(&vb.pp("mid"), c_in)?,
            norm_out: RmsNorm::new(&vb.pp("norm_out"), c_in, false)?,
            conv_out: CausalConv::new(&vb.pp("conv_out"), c_in, moments)?,
            group: last / moments,
        })
    }

    fn forward(&self, xs: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let mut h = self.conv_in.forward(xs, stream)?;
        for level in &self.down {
            for block in &level.blocks {
                h = block.forward(&h, stream)?;
            }
            if let Some(d) = &level.sample {
                h = d.forward(&h, stream)?;
            }
        }
        let h = self.mid.forward(&h, stream)?;
        let shortcut = group_mean(&h, self.group)?;
        let h = self.norm_out.forward(&h)?.silu()?;
        self.conv_out.forward(&h, stream)? + shortcut
    }
}

/// The decoder (keys `decoder.*`): latents [b, latent, f, h, w] → video [b, 3, 4(f − 1) + 1, 16h, 16w].
pub(crate) struct Decoder {
    conv_in: CausalConv,
    mid: Mid,
    up: Vec<Level<Upsample>>,
    norm_out: RmsNorm,
    conv_out: CausalConv,
    repeats: usize,
}

impl Decoder {
    fn new(cfg: &Hv15VaeConfig, vb: &Vb) -> Result<Self> {
        let widths: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
        let Some(&first) = widths.first() else {
            candle_core::bail!("VAE config: block_out_channels is empty");
        };
        if cfg.latent_channels == 0 || first % cfg.latent_channels != 0 {
            candle_core::bail!(
                "VAE config: {first} channels are not a multiple of {} latent channels",
                cfg.latent_channels
            );
        }
        let mut c_in = first;
        let mid = Mid::new(&vb.pp("mid"), c_in)?;
        let mut up = Vec::with_capacity(widths.len());
        for (i, &c) in widths.iter().enumerate() {
            let vb = vb.pp("up").pp(i);
            let mut blocks = Vec::with_capacity(cfg.layers_per_block + 1);
            for j in 0..=cfg.layers_per_block {
                blocks.push(ResnetBlock::new(&vb.pp("block").pp(j), c_in, c)?);
                c_in = c;
            }
            let sample = match cfg.decoder_upsample(i) {
                (true, temporal) => {
                    let Some(&next) = widths.get(i + 1) else {
                        candle_core::bail!("VAE config: level {i} upsamples but is the last");
                    };
                    let u = Upsample::new(&vb.pp("upsample"), c_in, next, temporal)?;
                    c_in = next;
                    Some(u)
                }
                (false, _) => None,
            };
            up.push(Level { blocks, sample });
        }
        Ok(Self {
            conv_in: CausalConv::new(&vb.pp("conv_in"), cfg.latent_channels, first)?,
            mid,
            up,
            norm_out: RmsNorm::new(&vb.pp("norm_out"), c_in, false)?,
            conv_out: CausalConv::new(&vb.pp("conv_out"), c_in, cfg.out_channels)?,
            repeats: first / cfg.latent_channels,
        })
    }

    fn forward(&self, z: &Tensor, stream: &mut Stream) -> Result<Tensor> {
        let h = (self.conv_in.forward(z, stream)? + repeat_channels(z, self.repeats)?)?;
        let mut h = self.mid.forward(&h, stream)?;
        for level in &self.up {
            for block in &level.blocks {
                h = block.forward(&h, stream)?;
            }
            if let Some(u) = &level.sample {
                h = u.forward(&h, stream)?;
            }
        }
        let h = self.norm_out.forward(&h)?.silu()?;
        self.conv_out.forward(&h, stream)
    }
}

/// HunyuanVideo 1.5's VAE (frozen; inference only), built from the official key names.
pub struct Hv15Vae {
    cfg: Hv15VaeConfig,
    encoder: Encoder,
    decoder: Decoder,
}

impl Hv15Vae {
    /// Builds the VAE from official key names under `vb` (`encoder.*`, `decoder.*`).
    pub fn new(cfg: &Hv15VaeConfig, vb: &Vb) -> Result<Self> {
        Ok(Self {
            cfg: cfg.clone(),
            encoder: Encoder::new(cfg, &vb.pp("encoder"))?,
            decoder: Decoder::new(cfg, &vb.pp("decoder"))?,
        })
    }

    /// The tensors (official names, shapes) of a checkpoint of this architecture, in the order the model reads them.
    pub fn tensor_shapes(cfg: &Hv15VaeConfig) -> Result<Vec<(String, Vec<usize>)>> {
        let recorder = std::sync::Arc::new(framesmith_nn::vb::ShapeRecorder::default());
        let vb = Vb::from_source(
            recorder.clone(),
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        );
        Self::new(cfg, &vb)?;
        Ok(recorder.shapes())
    }

    /// The architecture.
    pub fn config(&self) -> &Hv15VaeConfig {
        &self.cfg
    }

    /// The encoder's moments (mean, then log-variance, along channels) of `video` [b, 3, t, h, w] in [−1, 1],
    /// `t` = 4n + 1 and `h`, `w` multiples of 16, run in chunks of `chunk_latents` latent frames (the whole clip
    /// when `None`); every chunking gives the whole clip's result.
    pub fn encode_moments(&self, video: &Tensor, chunk_latents: Option<usize>) -> Result<Tensor> {
        let (_, c, t, h, w) = video.dims5()?;
        let (fs, ft) = (self.cfg.ffactor_spatial, self.cfg.ffactor_temporal);
        if c != self.cfg.in_channels || t == 0 || (t - 1) % ft != 0 || h % fs != 0 || w % fs != 0 {
            candle_core::bail!(
                "VAE encode: video must be [b, {}, {ft}n + 1, h, w] with h and w multiples of {fs}, got {:?}",
                self.cfg.in_channels,
                video.dims()
            );
        }
        let latents = self.cfg.latent_frames(t);
        let mut stream = Stream::new();
        let mut outs = Vec::new();
        for (start, n) in chunks(latents, chunk_latents) {
            let (from, len) = if start == 0 {
                (0, (n - 1) * ft + 1)
            } else {
                ((start - 1) * ft + 1, n * ft)
            };
            stream.start_chunk(start == 0);
            outs.push(
                self.encoder
                    .forward(&video.narrow(2, from, len)?, &mut stream)?,
            );
        }
        Tensor::cat(&outs, 2)
    }

    /// The latents of `video` (the posterior's mean, unscaled: what musubi-tuner caches), run as
    /// [`Hv15Vae::encode_moments`].
    pub fn encode(&self, video: &Tensor, chunk_latents: Option<usize>) -> Result<Tensor> {
        let moments = self.encode_moments(video, chunk_latents)?;
        moments.narrow(1, 0, self.cfg.latent_channels)
    }

    /// Video [b, 3, 4(f − 1) + 1, 16h, 16w] (not clamped) from unscaled latents `z` [b, latent, f, h, w], run in
    /// chunks of `chunk_latents` latent frames (the whole clip when `None`).
    pub fn decode(&self, z: &Tensor, chunk_latents: Option<usize>) -> Result<Tensor> {
        let (_, c, f, _, _) = z.dims5()?;
        if c != self.cfg.latent_channels || f == 0 {
            candle_core::bail!(
                "VAE decode: latents must be [b, {}, f ≥ 1, h, w], got {:?}",
                self.cfg.latent_channels,
                z.dims()
            );
        }
        let mut stream = Stream::new();
        let mut outs = Vec::new();
        for (start, n) in chunks(f, chunk_latents) {
            stream.start_chunk(start == 0);
            outs.push(self.decoder.forward(&z.narrow(2, start, n)?, &mut stream)?);
        }
        Tensor::cat(&outs, 2)
    }
}

/// `(first latent frame, count)` of each chunk of `chunk` latent frames (one chunk when `None` or 0).
fn chunks(frames: usize, chunk: Option<usize>) -> Vec<(usize, usize)> {
    let step = chunk.filter(|&c| c > 0).unwrap_or(frames).max(1);
    (0..frames)
        .step_by(step)
        .map(|s| (s, step.min(frames - s)))
        .collect()
}

#[cfg(test)]
mod tests;
