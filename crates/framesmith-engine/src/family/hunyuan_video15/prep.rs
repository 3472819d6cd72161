//! HunyuanVideo 1.5's latent pass, as musubi-tuner's `hv_1_5_cache_latents.py` makes its `_hv15` caches: the VAE's
//! unscaled latents (the posterior's mean) of every image and clip (clips thinned to 24 fps when the dataset gives
//! `source_fps`, sides in steps of 16 pixels), and for image-to-video (`--clip` with the SigLIP image encoder,
//! musubi-tuner's `--image_encoder`; `--i2v` alone is refused, naming it) the first frame's latents and mask
//! (`latents_image`, float32) and the first frame's SigLIP `last_hidden_state` (`siglip_float16`, [729, 1152]), as
//! musubi-tuner stores them. The VAE runs on the pass's device, a clip in chunks of [`CHUNK_LATENTS`] latent frames
//! (the whole clip's result with a chunk's memory) and, with `--tiled`, in musubi-tuner's 128-pixel tiles; SigLIP
//! beside it in the pass's dtype. A pass is HunyuanVideo 1.5's when `--dit` names its transformer or `--vae` its
//! VAE.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::train::is_hv15_file;
use crate::family::image::clip_prep::{cache_clip_latents, ClipLatents};
use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles};
use crate::prep::{frames_to_video, header, CacheOptions, CacheProgress, CacheSummary};
use framesmith_data::family::hunyuan_video15::cache::{
    hv15_latent_cache_name, write_hv15_latent_cache, Hv15LatentCache, HV15_ARCHITECTURE,
    HV15_SUFFIX, HV15_TARGET_FPS,
};

use framesmith_data::media::{MediaTools, FFMPEG_INSTALL_HINT};
use framesmith_data::samples::Sample;
use framesmith_data::{DatasetKind, ValidConfig};
use framesmith_models::hunyuan_video15::vae::weights::is_hv15_vae_file;
use framesmith_models::hunyuan_video15::vae::{load_hv15_vae, Hv15Vae, SpatialTiles};
use framesmith_models::siglip::{load_siglip, siglip_weights_file, SiglipVision, SIGLIP_FILES};

/// Latent frames per chunk of a clip's encode (16 frames of 480p: a few GiB in bf16).
pub const CHUNK_LATENTS: usize = 4;
/// Pixel multiple of every bucket side (musubi-tuner's `RESOLUTION_STEPS_HUNYUAN_VIDEO_1_5`).
pub const BUCKET_STEP: u32 = 16;

/// Whether the latent pass `files` caches for HunyuanVideo 1.5.
pub(super) fn is_hv15_latent_pass(files: &LatentFiles) -> bool {
    files.dit.as_deref().is_some_and(is_hv15_file) || is_hv15_vae_file(&files.vae)
}

/// The VAE side of the pass.
pub struct Hv15LatentEncoder<'a> {
    pub vae: &'a Hv15Vae,
    /// Where the VAE's weights are.
    pub device: Device,
    /// Dtype the frames are fed and the latents stored in.
    pub dtype: DType,
    /// Spatial tiles, for frames larger than a tile.
    pub tiles: Option<SpatialTiles>,
    /// For image-to-video: SigLIP, whose features of the first frame are cached with its latents and mask
    /// (`siglip`, `latents_image`).
    pub image_encoder: Option<&'a SiglipVision>,
}

impl Hv15LatentEncoder<'_> {
    fn key_prefixes(&self) -> &'static [&'static str] {
        if self.image_encoder.is_some() {
            &["latents_", "latents_image_", "siglip_"]
        } else {
            &["latents_"]
        }
    }

    /// Whether the cache at `path` is complete for this encoder.
    fn cached(&self, path: &Path) -> bool {
        header::complete_cache(path, self.key_prefixes(), HV15_ARCHITECTURE).is_some()
    }

    /// Unscaled latents `[1, C, F, H, W]` of a video `[1, 3, T, H, W]` in [−1, 1], on the VAE's device.
    fn encode_video(&self, video: &Tensor) -> anyhow::Result<Tensor> {
        Ok(self
            .vae
            .encode_tiled(video, self.tiles, Some(CHUNK_LATENTS))?)
    }

    /// One sample's cache: the latents `[C, F, H, W]` in `self.dtype` and, with an image encoder,
    /// `latents_image` = [the first frame's own latents then zeros; mask 1 on the first latent frame]
    /// `[C + 1, F, H, W]` in f32 and the first frame's SigLIP features `[tokens, width]` in f16.
    pub fn encode_cache(&self, frames: &[RgbImage]) -> anyhow::Result<Hv15LatentCache> {
        let video = frames_to_video(frames, &self.device)?.to_dtype(self.dtype)?;
        let latents = self.encode_video(&video)?;
        let (latents_image, siglip) = match (self.image_encoder, frames.first()) {
            (Some(siglip), Some(frame)) => {
                let first = if video.dim(2)? == 1 {
                    latents.clone()
                } else {
                    self.encode_video(&video.narrow(2, 0, 1)?)?
                };
                let features = siglip
                    .encode_image(frame)?
                    .squeeze(0)?
                    .to_dtype(DType::F16)?
                    .to_device(&Device::Cpu)?;
                (
                    Some(image_latents(&first.squeeze(0)?, latents.dims5()?.2)?),
                    Some(features),
                )
            }
            _ => (None, None),
        };
        Ok(Hv15LatentCache {
            latents: latents
                .squeeze(0)?
                .to_dtype(self.dtype)?
                .to_device(&Device::Cpu)?,
            latents_image,
            siglip,
        })
    }
}

/// `[first frame's latents, zeros; mask]` `[C + 1, frames, H, W]` in f32 on the CPU from the first frame's latents
/// `first` `[C, 1, H, W]` (musubi-tuner's `latents_concat` and `mask_concat`).
pub fn image_latents(first: &Tensor, frames: usize) -> anyhow::Result<Tensor> {
    let first = first.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
    let (c, _, h, w) = first.dims4()?;
    let mut latent = vec![first];
    let mut mask = vec![Tensor::ones((1, 1, h, w), DType::F32, &Device::Cpu)?];
    if frames > 1 {
        latent.push(Tensor::zeros(
            (c, frames - 1, h, w),
            DType::F32,
            &Device::Cpu,
        )?);
        mask.push(Tensor::zeros(
            (1, frames - 1, h, w),
            DType::F32,
            &Device::Cpu,
        )?);
    }
    Ok(Tensor::cat(
        &[Tensor::cat(&latent, 1)?, Tensor::cat(&mask, 1)?],
        0,
    )?)
}

/// The latent pass with HunyuanVideo 1.5's VAE.
pub(super) fn latents(
    request: &CacheRequest<'_>,
    files: &LatentFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let siglip_file = image_encoder_file(files)?;
    let valid = load_dataset(request, log)?;
    let tools = MediaTools::locate().ok();
    if tools.is_none()
        && valid
            .datasets
            .iter()
            .any(|d| d.kind() == DatasetKind::Video)
    {
        log(&format!(
            "warning: ffmpeg was not found, so video files cannot be decoded; {FFMPEG_INSTALL_HINT}"
        ));
    }
    let (device, dtype) = (request.open)()?;
    let vae = load_hv15_vae(&files.vae, dtype, &device)?;
    log(&format!(
        "VAE: HunyuanVideo 1.5, {} latent channels, on {device:?} in {dtype:?}{}",
        vae.config().latent_channels,
        if files.tiled { ", 128-pixel tiles" } else { "" }
    ));
    let siglip = match &siglip_file {
        Some(path) => {
            let tower = load_siglip(path, dtype, &device)
                .with_context(|| format!("--clip {}", path.display()))?;
            log(&format!(
                "image-to-video: caching each first frame's latents and mask (latents_image) and SigLIP features \
                 ({} tokens of width {}, {})",
                tower.config().tokens(),
                tower.config().hidden_size,
                path.display()
            ));
            Some(tower)
        }
        None => None,
    };
    let encoder = Hv15LatentEncoder {
        vae: &vae,
        device,
        dtype,
        tiles: files.tiled.then(SpatialTiles::small),
        image_encoder: siglip.as_ref(),
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_hv15_latents(&valid, tools.as_ref(), &encoder, &options, progress)
}

/// The SigLIP weights file of an image-to-video pass (`--clip`, which `--i2v` needs), checked before anything
/// loads; `None` for text-to-video.
fn image_encoder_file(files: &LatentFiles) -> anyhow::Result<Option<PathBuf>> {
    match &files.clip {
        Some(clip) => Ok(Some(
            siglip_weights_file(clip).context("--clip: the SigLIP image encoder")?,
        )),
        None if files.i2v => anyhow::bail!(
            "--i2v: HunyuanVideo 1.5's image-to-video caches hold each first frame's SigLIP features too; give the \
             SigLIP image encoder with --clip: {SIGLIP_FILES}"
        ),
        None => Ok(None),
    }
}

/// Writes the `_hv15` latent cache of every image and clip of the dataset config.
pub fn cache_hv15_latents(
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    encoder: &Hv15LatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let write = |sample: &Sample, path: &Path| -> anyhow::Result<()> {
        let cache = encoder.encode_cache(&sample.frames)?;
        let frames = sample.window.map(|w| w.frames);
        Ok(write_hv15_latent_cache(
            path,
            &cache,
            sample.original_size,
            frames,
        )?)
    };
    let latents = ClipLatents {
        suffix: HV15_SUFFIX,
        name: hv15_latent_cache_name,
        step: BUCKET_STEP,
        fps: HV15_TARGET_FPS,
        cached: &|_: &Path, path: &Path| encoder.cached(path),
        write: &write,
    };
    cache_clip_latents(valid, tools, &latents, options, progress)
}

// Tests may unwrap (STYLE.md: no unwrap outside tests).
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
