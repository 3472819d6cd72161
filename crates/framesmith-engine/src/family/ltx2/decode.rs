//! Decoding an LTX-2 clip, for samples and `framesmith generate`: the DiT's latents (normalised, as the encoder
//! gives them) through the video VAE, which un-normalises them with its per-channel statistics and, when its
//! decoder is timestep-conditioned (LTX-2.3), mixes in noise at the official scale 0.025 and decodes at timestep
//! 0.05 — the noise seeded, so a seed gives one clip. A clip larger than one of ltx-core's default tiles (80
//! frames with 24 shared, 768 pixels with 64) decodes in those tiles; the frames are the official
//! `((video + 1) / 2).clamp(0, 1)` in RGB8. The written clip ([`Ltx2Clip`]) is the MP4 with its PNG frames: the
//! one place both write it, with its sound muxed in when it has one.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::sound::mux_sound;
use crate::generate::frames::video_to_frames;
use crate::generate::run::write_clip;
use framesmith_data::media::audio::AudioClip;
use framesmith_data::video::encode::RgbFrame;
use framesmith_models::ltx2::vae::{load_ltx2_vae, DecodeConditioning, Ltx2Vae, VaeTiling};
use framesmith_nn::init::randn;

/// Added to a clip's seed for its decode noise, so that it is not the start noise again.
const DECODE_NOISE_SEED: u64 = 0x5eed_dec0;

/// The VAE that turns the DiT's latents into frames.
pub struct Ltx2Decoder {
    pub vae: Ltx2Vae,
    /// Where the VAE's weights are.
    pub device: Device,
}

/// A decoded clip and how it is played.
pub struct Ltx2Clip {
    pub frames: Vec<RgbFrame>,
    pub fps: f64,
    /// Its sound, when the audio stream was sampled.
    pub sound: Option<AudioClip>,
}

impl Ltx2Clip {
    /// Writes the clip as the MP4 `path` with its PNG frames beside it (see [`write_clip`]) and its sound muxed in
    /// (ffmpeg); returns the frames' folder.
    pub fn write(&self, path: &Path) -> anyhow::Result<PathBuf> {
        let frames = write_clip(path, &self.frames, self.fps)?;
        if let Some(sound) = &self.sound {
            mux_sound(path, sound)?;
        }
        Ok(frames)
    }
}

impl Ltx2Decoder {
    /// The video VAE of `path` (an official checkpoint, or a file holding its `vae.*` and the `config` metadata)
    /// on `device` in `dtype`.
    pub fn load(path: &Path, (dtype, device): (DType, &Device)) -> anyhow::Result<Self> {
        Ok(Self {
            vae: load_ltx2_vae(path, dtype, device)?,
            device: device.clone(),
        })
    }

    /// The tiles a clip of latent `[f, h, w]` decodes in: `None` when one tile holds it.
    pub fn tiling(&self, [f, h, w]: [usize; 3]) -> Option<VaeTiling> {
        let official = VaeTiling::official();
        let (space, time) = self.vae.config().decoder_factors();
        let fits = |axis: Option<framesmith_models::ltx2::vae::AxisTiles>, pixels: usize| {
            axis.is_none_or(|a| pixels <= a.tile)
        };
        let whole = fits(official.frames, (f.max(1) - 1) * time + 1)
            && fits(official.height, h * space)
            && fits(official.width, w * space);
        (!whole).then_some(official)
    }

    /// RGB frames of the DiT's latents `[C, F, H, W]` (normalised), a timestep-conditioned decoder's noise drawn
    /// from `seed`.
    pub fn decode(&self, latents: &Tensor, seed: u64) -> anyhow::Result<Vec<RgbFrame>> {
        let z = framesmith_nn::ops::to_device(latents, &self.device)?
            .to_dtype(DType::F32)?
            .unsqueeze(0)?;
        let (_, _, f, h, w) = z.dims5()?;
        let rng = &mut StdRng::seed_from_u64(seed.wrapping_add(DECODE_NOISE_SEED));
        let cond = DecodeConditioning {
            noise: Some(randn(rng, z.shape(), 0.0, 1.0, &self.device)?),
            ..DecodeConditioning::default()
        };
        let video = match self.tiling([f, h, w]) {
            Some(tiles) => self.vae.decode_tiled(&z, &tiles, &cond),
            None => self.vae.decode(&z, &cond),
        }
        .context("decoding the clip with the LTX-2 video VAE")?;
        video_to_frames(&video.squeeze(0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use framesmith_models::ltx2::vae::AxisTiles;

    fn fixture_vae() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/ltx2/vae_ltx23/weights.safetensors")
    }

    #[test]
    fn latents_decode_to_frames_the_seed_fixes_the_noise() -> anyhow::Result<()> {
        let device = Device::Cpu;
        let decoder = Ltx2Decoder::load(&fixture_vae(), (DType::F32, &device))?;
        let (space, time) = decoder.vae.config().decoder_factors();
        let z = Tensor::randn(0f32, 1.0, (4, 2, 2, 3), &device)?;
        let frames = decoder.decode(&z, 7)?;
        assert_eq!(frames.len(), time + 1);
        assert_eq!((frames[0].width, frames[0].height), (3 * space, 2 * space));
        // The same seed gives the same clip; another seed other decode noise (the decoder is timestep-conditioned).
        assert_eq!(decoder.decode(&z, 7)?[0].data, frames[0].data);
        assert_ne!(decoder.decode(&z, 8)?[0].data, frames[0].data);
        // The direct decode with that noise is what the decoder gives.
        let rng = &mut StdRng::seed_from_u64(7u64.wrapping_add(DECODE_NOISE_SEED));
        let z5 = z.unsqueeze(0)?;
        let cond = DecodeConditioning {
            noise: Some(randn(rng, z5.shape(), 0.0, 1.0, &device)?),
            ..DecodeConditioning::default()
        };
        let direct = video_to_frames(&decoder.vae.decode(&z5, &cond)?.squeeze(0)?)?;
        assert_eq!(direct[1].data, frames[1].data);
        Ok(())
    }

    #[test]
    fn clips_larger_than_a_tile_decode_in_the_official_tiles() -> anyhow::Result<()> {
        let decoder = Ltx2Decoder::load(&fixture_vae(), (DType::F32, &Device::Cpu))?;
        let (space, time) = decoder.vae.config().decoder_factors();
        assert_eq!(decoder.tiling([2, 2, 3]), None);
        let wide = 768 / space + 1;
        assert_eq!(decoder.tiling([2, 2, wide]), Some(VaeTiling::official()));
        let long = 80 / time + 1;
        let tiles = decoder.tiling([long, 2, 2]);
        assert_eq!(
            tiles.and_then(|t| t.frames),
            Some(AxisTiles {
                tile: 80,
                overlap: 24
            })
        );
        Ok(())
    }
}
