//! LTX-2's and LTX-2.3's audio VAE and vocoder as ltx-core defines them (`model/audio_vae`: `AudioProcessor`,
//! `AudioEncoder`, `AudioDecoder`, `Vocoder`, `VocoderWithBWE`), built from the `audio_vae` and `vocoder`
//! sections of the checkpoint's `config` metadata ([`config`]). Encode: a stereo waveform at the model's sample
//! rate (16 kHz for the releases) to its log-mel spectrogram ([`mel`]) [b, 2, t, 64], then to latents
//! [b, 8, (t − 1)/4 + 1, 16] normalised by the per-channel statistics (what the DiT's audio stream and the
//! `_ltx2_audio` caches hold). Decode: latents to a spectrogram [b, 2, 4f − 3, 64], then the vocoder
//! ([`vocoder`]) to a waveform at its output rate. Files: [`weights`].

pub mod config;
mod layers;
pub mod mel;
pub mod vocoder;
pub mod weights;

use candle_core::{DType, Device, Result, Tensor};

use framesmith_nn::vb::Vb;
use layers::{pixel_norm, AttnBlock, CausalConv2d, Downsample, ResnetBlock, Upsample};

pub use config::{AudioVaeConfig, Causality, VocoderConfig, LATENT_DOWNSAMPLE_FACTOR};
pub use mel::MelSpectrogram;
pub use vocoder::Vocoder;
pub use weights::{
    audio_from_tensors, identify_audio, load_ltx2_audio, Ltx2AudioError, Ltx2AudioFile,
    Ltx2AudioParts,
};

/// `PerChannelStatistics` over the patchified latents (`b t (c f)`), shaped [1, c, 1, f] in f32.
struct Statistics {
    mean: Tensor,
    std: Tensor,
}

impl Statistics {
    fn new(vb: &Vb, cfg: &AudioVaeConfig) -> Result<Self> {
        let (c, f) = (cfg.z_channels, cfg.latent_mel_bins());
        if c * f != cfg.ch {
            candle_core::bail!(
                "the audio VAE's {} per-channel statistics do not cover {c} latent channels × {f} mel bins",
                cfg.ch
            );
        }
        let get = |name: &str| -> Result<Tensor> {
            vb.get(cfg.ch, name)?
                .to_dtype(DType::F32)?
                .reshape((1, c, 1, f))
        };
        Ok(Self {
            mean: get("mean-of-means")?,
            std: get("std-of-means")?,
        })
    }

    fn normalize(&self, xs: &Tensor) -> Result<Tensor> {
        xs.to_dtype(DType::F32)?
            .broadcast_sub(&self.mean)?
            .broadcast_div(&self.std)
    }

    fn un_normalize(&self, xs: &Tensor) -> Result<Tensor> {
        xs.to_dtype(DType::F32)?
            .broadcast_mul(&self.std)?
            .broadcast_add(&self.mean)
    }
}

/// One resolution level: its residual blocks, each followed by attention at the attention resolutions.
struct Level {
    blocks: Vec<ResnetBlock>,
    attn: Vec<AttnBlock>,
}

impl Level {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut h = xs.clone();
        for (i, block) in self.blocks.iter().enumerate() {
            h = block.forward(&h)?;
            if let Some(a) = self.attn.get(i) {
                h = a.forward(&h)?;
            }
        }
        Ok(h)
    }
}

/// `mid`: `block_1`, `attn_1` (when `mid_block_add_attention`), `block_2`.
struct Mid {
    block_1: ResnetBlock,
    attn_1: Option<AttnBlock>,
    block_2: ResnetBlock,
}

impl Mid {
    fn new(vb: &Vb, c: usize, cfg: &AudioVaeConfig) -> Result<Self> {
        let attn_1 = if cfg.mid_block_add_attention {
            Some(AttnBlock::new(&vb.pp("attn_1"), c)?)
        } else {
            None
        };
        Ok(Self {
            block_1: ResnetBlock::new(&vb.pp("block_1"), c, c, cfg.causality)?,
            attn_1,
            block_2: ResnetBlock::new(&vb.pp("block_2"), c, c, cfg.causality)?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut h = self.block_1.forward(xs)?;
        if let Some(a) = &self.attn_1 {
            h = a.forward(&h)?;
        }
        self.block_2.forward(&h)
    }
}

/// `AudioEncoder` (keys `audio_vae.encoder.*`).
struct Encoder {
    conv_in: CausalConv2d,
    down: Vec<(Level, Option<Downsample>)>,
    mid: Mid,
    conv_out: CausalConv2d,
    z_channels: usize,
}

impl Encoder {
    fn new(cfg: &AudioVaeConfig, vb: &Vb) -> Result<Self> {
        let axis = cfg.causality;
        let mut res = cfg.resolution;
        let mut down = Vec::with_capacity(cfg.ch_mult.len());
        let mut c_in = cfg.ch;
        for (i, &mult) in cfg.ch_mult.iter().enumerate() {
            let vb = vb.pp("down").pp(i);
            let c_out = cfg.ch * mult;
            let mut blocks = Vec::new();
            let mut attn = Vec::new();
            for j in 0..cfg.num_res_blocks {
                blocks.push(ResnetBlock::new(&vb.pp("block").pp(j), c_in, c_out, axis)?);
                c_in = c_out;
                if cfg.attn_resolutions.contains(&res) {
                    attn.push(AttnBlock::new(&vb.pp("attn").pp(j), c_in)?);
                }
            }
            let sample = if i + 1 < cfg.ch_mult.len() {
                res /= 2;
                Some(Downsample::new(&vb.pp("downsample"), c_in, axis)?)
            } else {
                None
            };
            down.push((Level { blocks, attn }, sample));
        }
        let z_out = if cfg.double_z { 2 } else { 1 } * cfg.z_channels;
        Ok(Self {
            conv_in: CausalConv2d::new(&vb.pp("conv_in"), cfg.in_channels, cfg.ch, 3, axis)?,
            down,
            mid: Mid::new(&vb.pp("mid"), c_in, cfg)?,
            conv_out: CausalConv2d::new(&vb.pp("conv_out"), c_in, z_out, 3, axis)?,
            z_channels: cfg.z_channels,
        })
    }

    /// The latent means, unnormalised.
    fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let mut h = self.conv_in.forward(mel)?;
        for (level, sample) in &self.down {
            h = level.forward(&h)?;
            if let Some(s) = sample {
                h = s.forward(&h)?;
            }
        }
        let h = self.mid.forward(&h)?;
        let h = self.conv_out.forward(&pixel_norm(&h)?.silu()?)?;
        h.narrow(1, 0, self.z_channels)
    }
}

/// `AudioDecoder` (keys `audio_vae.decoder.*`; `up` is indexed by level, run from the deepest).
struct Decoder {
    conv_in: CausalConv2d,
    mid: Mid,
    up: Vec<(Level, Option<Upsample>)>,
    conv_out: CausalConv2d,
}

impl Decoder {
    fn new(cfg: &AudioVaeConfig, vb: &Vb) -> Result<Self> {
        let axis = cfg.causality;
        let levels = cfg.ch_mult.len();
        let mut c_in = cfg.ch * cfg.ch_mult[levels - 1];
        let mut res = cfg.resolution >> (levels - 1);
        let conv_in = CausalConv2d::new(&vb.pp("conv_in"), cfg.z_channels, c_in, 3, axis)?;
        let mid = Mid::new(&vb.pp("mid"), c_in, cfg)?;
        let mut up = Vec::with_capacity(levels);
        for level in (0..levels).rev() {
            let vb = vb.pp("up").pp(level);
            let c_out = cfg.ch * cfg.ch_mult[level];
            let mut blocks = Vec::new();
            let mut attn = Vec::new();
            for j in 0..=cfg.num_res_blocks {
                blocks.push(ResnetBlock::new(&vb.pp("block").pp(j), c_in, c_out, axis)?);
                c_in = c_out;
                if cfg.attn_resolutions.contains(&res) {
                    attn.push(AttnBlock::new(&vb.pp("attn").pp(j), c_in)?);
                }
            }
            let sample = if level != 0 {
                res *= 2;
                Some(Upsample::new(&vb.pp("upsample"), c_in, axis)?)
            } else {
                None
            };
            up.push((Level { blocks, attn }, sample));
        }
        Ok(Self {
            conv_in,
            mid,
            up,
            conv_out: CausalConv2d::new(&vb.pp("conv_out"), c_in, cfg.out_ch, 3, axis)?,
        })
    }

    fn forward(&self, z: &Tensor) -> Result<Tensor> {
        let mut h = self.mid.forward(&self.conv_in.forward(z)?)?;
        for (level, sample) in &self.up {
            h = level.forward(&h)?;
            if let Some(s) = sample {
                h = s.forward(&h)?;
            }
        }
        self.conv_out.forward(&pixel_norm(&h)?.silu()?)
    }
}

/// `xs` [b, c, t, f] cropped or zero-padded to `t` frames and `f` bins (`AudioDecoder._adjust_output_shape`).
fn fit(xs: &Tensor, t: usize, f: usize) -> Result<Tensor> {
    let (_, _, ht, hf) = xs.dims4()?;
    let x = xs.narrow(2, 0, ht.min(t))?.narrow(3, 0, hf.min(f))?;
    x.pad_with_zeros(2, 0, t - ht.min(t))?
        .pad_with_zeros(3, 0, f - hf.min(f))
}

/// LTX-2's audio VAE (frozen; inference only): the mel transform, the encoder, the decoder and the shared
/// per-channel statistics.
pub struct AudioVae {
    cfg: AudioVaeConfig,
    mel: MelSpectrogram,
    encoder: Option<Encoder>,
    decoder: Option<Decoder>,
    statistics: Statistics,
    dtype: DType,
}

/// Which halves of the audio VAE to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioVaeParts {
    pub encoder: bool,
    pub decoder: bool,
}

impl AudioVae {
    /// Builds the parts of the VAE `parts` names from ltx-core's key names under `vb` (`encoder.*`, `decoder.*`,
    /// `per_channel_statistics.*`).
    pub fn new(cfg: &AudioVaeConfig, vb: &Vb, parts: AudioVaeParts) -> Result<Self> {
        let encoder = if parts.encoder {
            Some(Encoder::new(cfg, &vb.pp("encoder"))?)
        } else {
            None
        };
        let decoder = if parts.decoder {
            Some(Decoder::new(cfg, &vb.pp("decoder"))?)
        } else {
            None
        };
        Ok(Self {
            cfg: cfg.clone(),
            mel: MelSpectrogram::new(
                cfg.sample_rate,
                cfg.n_fft,
                cfg.hop_length,
                cfg.mel_bins,
                vb.device(),
            )?,
            encoder,
            decoder,
            statistics: Statistics::new(&vb.pp("per_channel_statistics"), cfg)?,
            dtype: vb.dtype(),
        })
    }

    /// The architecture.
    pub fn config(&self) -> &AudioVaeConfig {
        &self.cfg
    }

    /// The device the weights are on.
    pub fn device(&self) -> &Device {
        self.statistics.mean.device()
    }

    /// The log-mel spectrogram [b, c, frames, mel] (f32) of `waveform` [b, c, samples] at the model's sample rate.
    pub fn mel(&self, waveform: &Tensor) -> Result<Tensor> {
        self.mel.forward(waveform)
    }

    /// Normalised latents [b, z, (frames − 1)/4 + 1, mel/4] (f32) of `waveform` [b, in_channels, samples] at the
    /// model's sample rate (`encode_audio`).
    pub fn encode(&self, waveform: &Tensor) -> Result<Tensor> {
        let Some(encoder) = &self.encoder else {
            candle_core::bail!("this audio VAE was loaded without its encoder");
        };
        let (_, c, _) = waveform.dims3()?;
        if c != self.cfg.in_channels {
            candle_core::bail!(
                "the audio VAE encodes {}-channel audio, got {c} channels",
                self.cfg.in_channels
            );
        }
        let mel = self.mel(waveform)?.to_dtype(self.dtype)?;
        self.statistics.normalize(&encoder.forward(&mel)?)
    }

    /// The spectrogram [b, out_ch, 4f − 3, mel] (f32) of normalised latents `z` [b, z_channels, f, mel/4]
    /// (`AudioDecoder.forward`).
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        let Some(decoder) = &self.decoder else {
            candle_core::bail!("this audio VAE was loaded without its decoder");
        };
        let (_, c, f, _) = z.dims4()?;
        if c != self.cfg.z_channels || f == 0 {
            candle_core::bail!(
                "audio latents must be [b, {}, f ≥ 1, mel], got {:?}",
                self.cfg.z_channels,
                z.dims()
            );
        }
        let z = self.statistics.un_normalize(z)?.to_dtype(self.dtype)?;
        let h = decoder.forward(&z)?;
        let h = h.narrow(1, 0, self.cfg.out_ch.min(h.dim(1)?))?;
        fit(&h, self.cfg.decoded_frames(f), self.cfg.mel_bins)?.to_dtype(DType::F32)
    }
}

/// The waveform [b, 2, samples] (f32, at `vocoder.output_sampling_rate()`) of normalised audio latents `z`
/// [b, z_channels, f, mel/4]: the decoder's spectrogram through the vocoder (ltx-core's `decode_audio`).
pub fn decode_audio(vae: &AudioVae, vocoder: &Vocoder, z: &Tensor) -> Result<Tensor> {
    vocoder.forward(&vae.decode(z)?)
}

/// Audio latents [b, c, t, f] from the audio stream's tokens [b, t, c·f] (`AudioPatchifier.unpatchify`).
pub fn unpatchify_audio(tokens: &Tensor, channels: usize) -> Result<Tensor> {
    let (b, t, d) = tokens.dims3()?;
    if channels == 0 || d % channels != 0 {
        candle_core::bail!("audio tokens of width {d} do not split into {channels} channels");
    }
    tokens
        .reshape((b, t, channels, d / channels))?
        .transpose(1, 2)?
        .contiguous()
}

#[cfg(test)]
mod tests;
