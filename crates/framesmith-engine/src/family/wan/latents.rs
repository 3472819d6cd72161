//! Wan's latent caching, as musubi-tuner's `wan_cache_latents.py` does and in its file format: the VAE latents of
//! every image and clip, with the first-frame conditioning and CLIP features of image-to-video models.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use crate::prep::{
    frames_to_video, header, scan_all, CacheOptions, CacheProgress, CacheSummary, Expected,
    ItemOutcome,
};
use framesmith_data::cache::{
    image_latent_cache_name, media_stem, video_latent_cache_name, write_wan_latent_cache,
    LatentCacheMetadata, WanLatentCache, WAN_ARCHITECTURE,
};
use framesmith_data::frames::{select_frames, WAN_TARGET_FPS};
use framesmith_data::media::MediaTools;
use framesmith_data::probe::{image_size, probe_video};
use framesmith_data::samples::{cache_dir, image_sample, video_samples, Sample};
use framesmith_data::{DatasetKind, ResolvedDataset, ValidConfig};
use framesmith_models::wan::clip::ClipVision;
use framesmith_models::wan::vae::{LatentStats, TileConfig, WanVae};

/// The image-to-video parts a latent cache holds beside the latents (musubi-tuner's `--i2v` and `--clip`).
#[derive(Clone, Copy, Default)]
pub enum ImageParts<'a> {
    /// Latents only (text-to-video models, TI2V-5B).
    #[default]
    None,
    /// The first-frame mask and image latents (`latents_image`): Wan2.2 I2V-A14B.
    Latents,
    /// Those and the first frame's CLIP vision features (`clip`): Wan2.1 I2V. The encoder runs on the VAE's
    /// device.
    LatentsAndClip(&'a ClipVision),
}

impl ImageParts<'_> {
    /// Key prefixes a complete cache of these parts holds.
    fn key_prefixes(&self) -> &'static [&'static str] {
        match self {
            ImageParts::None => &["latents_"],
            ImageParts::Latents => &["latents_", "latents_image_"],
            ImageParts::LatentsAndClip(_) => &["latents_", "latents_image_", "clip_"],
        }
    }
}

/// The VAE side of latent caching.
pub struct LatentEncoder<'a> {
    pub vae: &'a WanVae,
    pub stats: &'a LatentStats,
    /// Where the VAE's weights are.
    pub device: Device,
    /// Dtype the frames are fed and the latents stored in (musubi-tuner stores the VAE's dtype).
    pub dtype: DType,
    /// Spatial tiles, for frames too large to encode at once.
    pub tiles: Option<TileConfig>,
    /// Image-to-video conditioning to cache beside the latents.
    pub image: ImageParts<'a>,
}

/// Side of the Wan DiTs' square spatial patches: bucket sides are multiples of the VAE's stride times this.
const PATCH_SIDE: usize = 2;

impl LatentEncoder<'_> {
    /// Pixel multiple of every bucket side: the VAE's spatial stride × the DiT's patch (16 for the Wan2.1 VAE,
    /// musubi-tuner's step; 32 for the Wan2.2 VAE of TI2V-5B).
    pub fn bucket_step(&self) -> u32 {
        (self.vae.config().spatial_factor() * PATCH_SIDE) as u32
    }

    /// Whether the cache at `path` is complete for this encoder: every part it writes, latents of its channels,
    /// and sizes the DiT's patches divide (a cache made with the other VAE, or at 16-pixel steps for the Wan2.2
    /// VAE, is made again).
    fn cached(&self, path: &Path) -> bool {
        header::complete_cache(path, self.image.key_prefixes(), WAN_ARCHITECTURE).is_some()
            && framesmith_data::cache::read_latent_shape(path).is_ok_and(|[c, _, h, w]| {
                c == self.vae.config().z_dim && h % PATCH_SIDE == 0 && w % PATCH_SIDE == 0
            })
    }

    /// Normalised latents `[C, F, H, W]` of bucket-sized RGB frames, on the CPU in `self.dtype`.
    pub fn encode_frames(&self, frames: &[RgbImage]) -> anyhow::Result<Tensor> {
        let video = frames_to_video(frames, &self.device)?.to_dtype(self.dtype)?;
        self.encode_video(&video)
    }

    /// Normalised latents `[C, F, H, W]` of a video `[1, 3, T, H, W]` in [−1, 1], on the CPU in `self.dtype`.
    fn encode_video(&self, video: &Tensor) -> anyhow::Result<Tensor> {
        let latents = match &self.tiles {
            Some(tiles) => self.vae.encode_tiled(video, self.stats, tiles)?,
            None => self.vae.encode(video, self.stats)?,
        };
        Ok(latents
            .squeeze(0)?
            .to_dtype(self.dtype)?
            .to_device(&Device::Cpu)?)
    }

    /// One sample's latent cache, made as musubi-tuner's `wan_cache_latents.py` makes it: the latents of the
    /// frames and, for image-to-video models (`self.image`), `latents_image` = [mask; latents of the first frame
    /// followed by black (zero) frames] with the mask 1 on the first latent frame's 4 channels and 0 elsewhere, and
    /// for Wan2.1 I2V the first frame's CLIP vision features [tokens, dim], stored in float16.
    pub fn encode_cache(&self, frames: &[RgbImage]) -> anyhow::Result<WanLatentCache> {
        let video = frames_to_video(frames, &self.device)?.to_dtype(self.dtype)?;
        let latents = self.encode_video(&video)?;
        let (latents_image, clip) = match self.image {
            ImageParts::None => (None, None),
            parts => {
                let first = video.narrow(2, 0, 1)?;
                let clip = match parts {
                    ImageParts::LatentsAndClip(encoder) => {
                        let image = first.squeeze(0)?.squeeze(1)?.to_dtype(DType::F32)?;
                        let features = encoder
                            .encode_image(&image)
                            .context("encoding the first frame with CLIP")?;
                        Some(
                            features
                                .squeeze(0)?
                                .to_dtype(DType::F16)?
                                .to_device(&Device::Cpu)?,
                        )
                    }
                    _ => None,
                };
                (Some(self.image_latents(&video, &first, &latents)?), clip)
            }
        };
        Ok(WanLatentCache {
            latents,
            latents_image,
            latents_control: None,
            clip,
            f_indices: None,
        })
    }

    /// `[mask (4); latents of [first frame, zeros]]` `[4 + C, F, H, W]` beside `latents` of `video`.
    fn image_latents(
        &self,
        video: &Tensor,
        first: &Tensor,
        latents: &Tensor,
    ) -> anyhow::Result<Tensor> {
        let (_, _, t, height, width) = video.dims5()?;
        // A single frame (an image) is its own first frame: its latents are the image latents.
        let image = if t == 1 {
            latents.clone()
        } else {
            let zeros = Tensor::zeros((1, 3, t - 1, height, width), self.dtype, &self.device)?;
            self.encode_video(&Tensor::cat(&[first, &zeros], 2)?)?
        };
        let (_, f, h, w) = latents.dims4()?;
        let ones = Tensor::ones((4, 1, h, w), self.dtype, &Device::Cpu)?;
        let mask = if f > 1 {
            Tensor::cat(
                &[
                    ones,
                    Tensor::zeros((4, f - 1, h, w), self.dtype, &Device::Cpu)?,
                ],
                1,
            )?
        } else {
            ones
        };
        Ok(Tensor::cat(&[&mask, &image], 0)?)
    }
}

/// Suffix of latent cache files (text caches end in `_wan_te.safetensors` and do not match).
fn latent_suffix() -> String {
    format!("_{WAN_ARCHITECTURE}.safetensors")
}

/// Writes the VAE latents of every image and clip of the dataset config.
pub fn cache_latents(
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    encoder: &LatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    check_resolutions(valid, encoder)?;
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, tools, &mut summary, progress);
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let (outcome, nan_keys) = cache_item(ds, tools, &item.media, encoder, &mut expected)
                .with_context(|| format!("caching {}", item.media.display()))?;
            if !nan_keys.is_empty() {
                summary.warnings.push(format!(
                    "warning: NaN in {} (stored as 0, as musubi-tuner does): {}",
                    nan_keys.join(", "),
                    item.media.display()
                ));
            }
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&latent_suffix())?;
    }
    Ok(summary)
}

/// Refuses, before anything is encoded, datasets whose items all go to a resolution the encoder's bucket step does
/// not divide (images without `enable_bucket`; videos are always bucketed), naming each with the nearest fix.
fn check_resolutions(valid: &ValidConfig, encoder: &LatentEncoder) -> anyhow::Result<()> {
    let step = encoder.bucket_step();
    let bad: Vec<String> = valid
        .all_datasets()
        .filter(|ds| !framesmith_data::bucket::BucketSelector::for_latent_caching(ds).bucketed())
        .filter(|ds| ds.resolution.0 % step != 0 || ds.resolution.1 % step != 0)
        .map(|ds| {
            let (w, h) = ds.resolution;
            let fix = |v: u32| (v / step).max(1) * step;
            format!(
                "{} resolution [{w}, {h}] (use [{}, {}], or enable_bucket = true)",
                ds.source.path().display(),
                fix(w),
                fix(h)
            )
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "this VAE ({} latent channels, {}x in space) with the DiT's {PATCH_SIDE}x{PATCH_SIDE} patches needs sides that \
         are multiples of {step} pixels: {}",
        encoder.vae.config().z_dim,
        encoder.vae.config().spatial_factor(),
        bad.join("; ")
    )
}

/// The latent cache files of an item, from headers and a probe only (no decoding); `None` when the media
/// cannot be measured that way.
fn planned_caches(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    media: &Path,
) -> Option<Vec<PathBuf>> {
    let dir = cache_dir(ds, media);
    let stem = media_stem(media);
    match ds.kind() {
        DatasetKind::Image => {
            let size = image_size(media).ok()?;
            Some(vec![dir.join(image_latent_cache_name(&stem, size))])
        }
        DatasetKind::Video => {
            let params = ds.video.as_ref()?;
            let info = probe_video(tools, media).ok()?;
            let frames = info.frame_count? as usize;
            let names = select_frames(frames, params, WAN_TARGET_FPS)
                .into_iter()
                .map(|c| {
                    dir.join(video_latent_cache_name(
                        &stem,
                        c.window,
                        (info.width, info.height),
                    ))
                })
                .collect();
            Some(names)
        }
    }
}

/// Caches one image or video; returns what happened and the names of tensors that held NaN.
fn cache_item(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    media: &Path,
    encoder: &LatentEncoder,
    expected: &mut Expected,
) -> anyhow::Result<(ItemOutcome, Vec<String>)> {
    if let Some(planned) = planned_caches(ds, tools, media) {
        planned.iter().for_each(|p| expected.file(p));
        if !planned.is_empty() && planned.iter().all(|p| encoder.cached(p)) {
            return Ok((ItemOutcome::Skipped, Vec::new()));
        }
    }
    // A file that does not decode is the item's failure; anything later (the VAE, the disk) stops the run.
    let decoded = match ds.kind() {
        DatasetKind::Image => image_sample(ds, media, encoder.bucket_step())
            .map(|s| vec![s])
            .map_err(|e| e.reason()),
        DatasetKind::Video => {
            video_samples(ds, tools, media, encoder.bucket_step()).map_err(|e| e.reason())
        }
    };
    let samples: Vec<Sample> = match decoded {
        Ok(samples) if !samples.is_empty() => samples,
        failed => {
            expected.failed(ds, media);
            let reason = failed
                .err()
                .unwrap_or_else(|| "the video is too short for any clip of target_frames".into());
            return Ok((ItemOutcome::Failed(reason), Vec::new()));
        }
    };
    let (mut written, mut nan_keys) = (0, Vec::new());
    for sample in &samples {
        expected.file(&sample.latent_cache);
        if encoder.cached(&sample.latent_cache) {
            continue;
        }
        let cache = encoder.encode_cache(&sample.frames)?;
        let meta = LatentCacheMetadata::wan(sample.original_size, sample.window.map(|w| w.frames));
        if let Some(dir) = sample.latent_cache.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
        }
        nan_keys.extend(write_wan_latent_cache(&sample.latent_cache, &cache, &meta)?);
        written += 1;
    }
    let outcome = if written == 0 {
        ItemOutcome::Skipped
    } else {
        ItemOutcome::Written(written)
    };
    Ok((outcome, nan_keys))
}

// Tests may unwrap (STYLE.md: no unwrap outside tests).
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
