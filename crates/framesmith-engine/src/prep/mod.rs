//! Caching a musubi-tuner dataset for training, as `wan_cache_latents.py` and `wan_cache_text_encoder_outputs.py`
//! do and in their file format: VAE latents of every image and clip (with the first-frame conditioning and CLIP
//! features of image-to-video models), umT5 embeddings of every caption. Caches
//! already on disk are kept (a text cache only while its caption is unchanged), caches of items no longer in the
//! dataset are removed unless asked not to, and a file that cannot be decoded is reported and skipped.

pub(crate) mod header;
pub mod pass;
mod text;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use framesmith_data::cache::{
    image_latent_cache_name, media_stem, video_latent_cache_name, write_wan_latent_cache,
    LatentCacheMetadata, WanLatentCache, WAN_ARCHITECTURE,
};
use framesmith_data::frames::{select_frames, WAN_TARGET_FPS};
use framesmith_data::media::MediaTools;
use framesmith_data::probe::{image_size, probe_video};
use framesmith_data::samples::{cache_dir, image_sample, video_samples, Sample};
use framesmith_data::scan::{scan_dataset, DatasetScan, ScanOptions};
use framesmith_data::{DatasetKind, ResolvedDataset, ValidConfig};
use framesmith_models::wan::clip::ClipVision;
use framesmith_models::wan::vae::{LatentStats, TileConfig, WanVae};

pub use text::cache_text;

/// What caching does with files already in the cache directories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheOptions {
    /// Keep cache files of items that are no longer in the dataset (musubi-tuner's `--keep_cache`).
    pub keep_stale: bool,
}

/// What happened to one dataset item.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemOutcome {
    /// Cache files written (a video gives one per clip).
    Written(usize),
    /// Every cache of the item was already there.
    Skipped,
    /// The item could not be cached; the reason names no path (the item is reported with it).
    Failed(String),
}

/// Progress of a caching pass, for a progress bar.
pub trait CacheProgress {
    /// Caching of `items` items starts.
    fn begin(&mut self, _items: usize) {}
    /// One item is done.
    fn item_done(&mut self, _media: &Path, _outcome: &ItemOutcome) {}
}

/// No progress reporting.
impl CacheProgress for () {}

/// What a caching pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheSummary {
    /// Items looked at.
    pub items: usize,
    /// Cache files written.
    pub written: usize,
    /// Items whose caches were all there already.
    pub skipped: usize,
    /// Items that could not be cached, with why.
    pub failed: Vec<(PathBuf, String)>,
    /// Stale cache files removed.
    pub removed: Vec<PathBuf>,
    /// Dataset problems found on the way (missing captions, unreadable files), and tensors that held NaN.
    pub warnings: Vec<String>,
}

impl CacheSummary {
    pub(crate) fn record(&mut self, media: &Path, outcome: &ItemOutcome) {
        self.items += 1;
        match outcome {
            ItemOutcome::Written(n) => self.written += n,
            ItemOutcome::Skipped => self.skipped += 1,
            ItemOutcome::Failed(reason) => self.failed.push((media.to_path_buf(), reason.clone())),
        }
    }
}

impl fmt::Display for CacheSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} items: {} cache files written, {} already cached, {} failed, {} stale caches removed",
            self.items,
            self.written,
            self.skipped,
            self.failed.len(),
            self.removed.len()
        )
    }
}

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
        header::complete_cache(path, self.image.key_prefixes()).is_some()
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

/// `[1, 3, F, H, W]` f32 in [−1, 1] from RGB frames of one size (`v / 127.5 − 1`, as musubi-tuner scales them).
pub fn frames_to_video(frames: &[RgbImage], device: &Device) -> anyhow::Result<Tensor> {
    let first = frames.first().context("no frames to encode")?;
    let (w, h) = first.dimensions();
    let mut data = Vec::with_capacity(frames.len() * (w * h * 3) as usize);
    for frame in frames {
        if frame.dimensions() != (w, h) {
            anyhow::bail!("frames of one clip differ in size");
        }
        data.extend(frame.as_raw().iter().map(|&v| f32::from(v) / 127.5 - 1.0));
    }
    let (f, h, w) = (frames.len(), h as usize, w as usize);
    Ok(Tensor::from_vec(data, (f, h, w, 3), device)?
        .permute((3, 0, 1, 2))?
        .unsqueeze(0)?)
}

/// Every dataset's items ([`scan_items`]), their count told to `progress`.
pub(crate) fn scan_all(
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    summary: &mut CacheSummary,
    progress: &mut dyn CacheProgress,
) -> Vec<DatasetScan> {
    let scans: Vec<DatasetScan> = valid
        .all_datasets()
        .map(|ds| scan_items(ds, tools, summary))
        .collect();
    progress.begin(scans.iter().map(|s| s.items.len()).sum());
    scans
}

/// One dataset's items, listed without probing (decoding comes later, item by item).
pub(crate) fn scan_items(
    dataset: &ResolvedDataset,
    tools: Option<&MediaTools>,
    summary: &mut CacheSummary,
) -> DatasetScan {
    let options = ScanOptions {
        probe_media: false,
        tools: tools.cloned(),
        decode_check: false,
    };
    let scan = scan_dataset(dataset, &options);
    // Thousands of unreadable files of one kind become one line.
    summary
        .warnings
        .extend(framesmith_data::problem::summary_lines(&scan.problems));
    scan
}

/// The cache files a run expects, and the items that failed (whose old caches are left alone), per folder.
#[derive(Default)]
pub(crate) struct Expected {
    /// Folder → file names that belong to the dataset.
    files: BTreeMap<PathBuf, BTreeSet<String>>,
    /// Folder → stems of items that failed.
    failed_stems: BTreeMap<PathBuf, BTreeSet<String>>,
    /// Folders not to clean: JSONL datasets without a cache directory keep caches beside arbitrary media.
    unowned: BTreeSet<PathBuf>,
}

impl Expected {
    pub(crate) fn file(&mut self, path: &Path) {
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
            self.files
                .entry(dir.to_path_buf())
                .or_default()
                .insert(name.to_string_lossy().into_owned());
        }
    }

    pub(crate) fn failed(&mut self, ds: &ResolvedDataset, media: &Path) {
        self.failed_stems
            .entry(cache_dir(ds, media))
            .or_default()
            .insert(media_stem(media));
    }

    pub(crate) fn dataset(&mut self, ds: &ResolvedDataset, scan: &DatasetScan) {
        let listing_failed = scan.items.is_empty() && !scan.problems.is_empty();
        match &ds.cache_directory {
            Some(dir) if !listing_failed => {
                self.files.entry(dir.clone()).or_default();
            }
            Some(dir) => {
                self.unowned.insert(dir.clone());
            }
            None => self
                .unowned
                .extend(scan.items.iter().map(|i| cache_dir(ds, &i.media))),
        }
    }

    /// Removes files ending in `suffix` that no item expects, except those of failed items, in every folder a
    /// dataset owns.
    pub(crate) fn remove_stale(&self, suffix: &str) -> anyhow::Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for (dir, keep) in &self.files {
            if self.unowned.contains(dir) || !dir.is_dir() {
                continue;
            }
            let failed = self.failed_stems.get(dir);
            let entries = std::fs::read_dir(dir)
                .with_context(|| format!("cannot list the cache directory {}", dir.display()))?;
            let mut stale: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|name| name.ends_with(suffix) && !keep.contains(name))
                .filter(|name| {
                    !failed.is_some_and(|f| f.iter().any(|s| name.starts_with(&format!("{s}_"))))
                })
                .map(|name| dir.join(name))
                .collect();
            stale.sort();
            for path in stale {
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot remove the stale cache {}", path.display()))?;
                removed.push(path);
            }
        }
        Ok(removed)
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
                    "NaN in {} (stored as 0, as musubi-tuner does): {}",
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

#[cfg(test)]
mod i2v_tests;
#[cfg(test)]
#[path = "tests.rs"]
mod tests;
