//! What an image family's cache passes share: each image's latents (resized to its bucket, encoded by the family's
//! autoencoder, written in the family's cache layout, with an edit model's control images encoded beside them) and
//! each caption's text-encoder outputs, one caption at a time (with the item's control images for a family whose
//! text encoder sees them), with caches already there kept (a text cache only while its caption, and the control
//! images it was made from, are unchanged) and stale ones of the family removed unless asked not to. The family
//! gives its cache layout ([`ImageCacheArch`]), its encoders and what it writes; other families' caches in the same
//! folder are left alone.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles};
use crate::prep::{
    cache_image_latents, frames_to_video, header, images_only, scan_all, CacheOptions,
    CacheProgress, CacheSummary, Expected, ItemOutcome,
};
use framesmith_data::cache::media_stem;
use framesmith_data::control::{
    control_stamp, load_controls, read_controls, ControlError, DatasetControls,
};
use framesmith_data::image_cache::{ImageCacheArch, CONTROLS_METADATA};
use framesmith_data::probe::image_size;
use framesmith_data::samples::{cache_dir, image_sample};
use framesmith_data::{ResolvedDataset, ValidConfig};

/// The start of an image family's latent pass: Wan's video options refused (`who` caches images as they are, e.g.
/// "FLUX.1's autoencoder"), the DiT it names checked by `check_dit`, the dataset loaded and the device opened.
pub(crate) fn start_latent_pass(
    (request, files): (&CacheRequest<'_>, &LatentFiles),
    who: &str,
    check_dit: &dyn Fn(&Path) -> anyhow::Result<()>,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<(ValidConfig, Device, DType)> {
    if files.i2v || files.clip.is_some() || files.tiled {
        anyhow::bail!(
            "--i2v, --clip and --tiled are for Wan VAEs; {who} caches images as they are: drop them"
        );
    }
    if let Some(dit) = &files.dit {
        check_dit(dit)?;
    }
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    Ok((valid, device, dtype))
}

/// Whether `path` holds a complete cache of `arch` with tensors starting with `prefixes`.
fn is_cached(path: &Path, arch: &ImageCacheArch, prefixes: &[&str]) -> bool {
    header::complete_cache(path, prefixes, arch.architecture).is_some()
}

/// How an image family's autoencoder makes one image's latents.
pub(crate) struct ImageLatents<'a> {
    /// The family's cache layout.
    pub arch: &'a ImageCacheArch,
    /// Pixel multiple of every bucket side (the autoencoder's down-sampling × the DiT's 2×2 packing).
    pub bucket_step: u32,
    /// Where the autoencoder's weights are.
    pub device: &'a Device,
    /// Dtype the images are fed and the latents stored in.
    pub dtype: DType,
    /// The latents `[C, 1, h, w]` of an image `[1, 3, H, W]`.
    pub encode: &'a dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
}

/// Writes the latents of every image of the dataset config (the family's `images_only` check first).
pub(crate) fn cache_latents(
    valid: &ValidConfig,
    latents: &ImageLatents,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    images_only(valid, latents.arch.family)?;
    let mut controls: HashMap<usize, DatasetControls> = HashMap::new();
    cache_image_latents(
        valid,
        (options, latents.arch.suffix),
        progress,
        &mut |ds, media, expected| {
            let found = match controls.entry(ds.index) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(DatasetControls::find(ds)?),
            };
            cache_image(ds, (media, found), latents, expected)
        },
    )
}

/// Caches one image: its latents resized to its bucket, as the family's DiT takes them, and its control images'
/// latents (an edit model's source images) beside them.
fn cache_image(
    ds: &ResolvedDataset,
    (media, controls): (&Path, &DatasetControls),
    latents: &ImageLatents,
    expected: &mut Expected,
) -> anyhow::Result<ItemOutcome> {
    let arch = latents.arch;
    let dir = cache_dir(ds, media);
    let stem = media_stem(media);
    let prefixes: &[&str] = if controls.any() {
        &["latents_", "latents_control_"]
    } else {
        &["latents_"]
    };
    if let Ok(size) = image_size(media) {
        let path = dir.join(arch.latent_cache_name(&stem, size));
        expected.file(&path);
        if is_cached(&path, arch, prefixes) {
            return Ok(ItemOutcome::Skipped);
        }
    }
    // A file that does not decode (the image or a control image) is the item's failure; anything later (the
    // autoencoder, the disk) stops the run.
    let decoded = image_sample(ds, media, latents.bucket_step)
        .map_err(|e| e.reason())
        .and_then(|sample| {
            let paths = controls.of(media).map_err(|e| e.to_string())?;
            let step = (sample.bucket, latents.bucket_step);
            let images = load_controls(ds, media, paths, step).map_err(|e| e.to_string())?;
            Ok((sample, images))
        });
    let (sample, control_images) = match decoded {
        Ok(decoded) => decoded,
        Err(reason) => {
            expected.failed(ds, media);
            return Ok(ItemOutcome::Failed(reason));
        }
    };
    let path = dir.join(arch.latent_cache_name(&stem, sample.original_size));
    expected.file(&path);
    let encoded = encode_frames(&sample.frames, latents)?;
    let control = control_images
        .iter()
        .map(|image| encode_frames(std::slice::from_ref(image), latents))
        .collect::<anyhow::Result<Vec<_>>>()?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
    arch.write_latent_cache_with_controls(&path, &encoded, &control, sample.original_size)?;
    Ok(ItemOutcome::Written(1))
}

/// The latents `[C, 1, h, w]` (on the CPU, in the cache's dtype) of one RGB image.
fn encode_frames(frames: &[RgbImage], latents: &ImageLatents) -> anyhow::Result<Tensor> {
    let image = frames_to_video(frames, latents.device)?
        .squeeze(2)?
        .to_dtype(latents.dtype)?;
    Ok((latents.encode)(&image)?
        .to_dtype(latents.dtype)?
        .to_device(&Device::Cpu)?)
}

/// One caption's text cache to write: the caption, the image it describes (for messages), the cache's path and,
/// for a family whose text encoder sees an edit item's control images, those images (decoded at their own size)
/// and what the cache records of them.
pub(crate) struct CaptionCache<'a> {
    pub caption: &'a str,
    pub media: &'a Path,
    pub path: &'a Path,
    /// The item's control images, in order (none for a text-only item or encoder).
    pub controls: &'a [RgbImage],
    /// The encoding's tag and the control images' stamp, for [`CONTROLS_METADATA`] (`None`: no control image).
    pub stamp: Option<&'a str>,
}

/// How a family's text caches depend on their items' control images: `None` when its text encoder never sees
/// them; else the tag of its encoding of them (e.g. the edit pipeline's version), recorded with their contents.
pub(crate) type ControlEncoding<'a> = Option<&'a str>;

/// Writes the text cache of every caption of the dataset config through `write` (which encodes the caption and
/// writes the family's tensors), one caption at a time, so a caption's cache does not depend on which others were
/// cached with it; a cache of `arch` already holding tensors starting with `prefixes` for the same caption (and,
/// under `edit`, the same control images) is kept.
pub(crate) fn cache_text(
    valid: &ValidConfig,
    (arch, prefixes, edit): (&ImageCacheArch, &[&str], ControlEncoding<'_>),
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
    write: &mut dyn FnMut(CaptionCache<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<CacheSummary> {
    images_only(valid, arch.family)?;
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, None, &mut summary, progress);
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        let controls = match edit {
            Some(_) => DatasetControls::find(ds)?,
            None => DatasetControls::default(),
        };
        for item in &scan.items {
            let media = &item.media;
            let path = cache_dir(ds, media).join(arch.text_cache_name(&media_stem(media)));
            expected.file(&path);
            let outcome = match &item.caption {
                None => Err("no caption".to_owned()),
                Some(caption) => {
                    let item = (caption.as_str(), media.as_path(), path.as_path());
                    let edit = edit.map(|tag| (tag, &controls));
                    caption_outcome(item, (arch, prefixes), edit, write)?
                }
            };
            let outcome = outcome.unwrap_or_else(|reason| {
                expected.failed(ds, media);
                ItemOutcome::Failed(reason)
            });
            progress.item_done(media, &outcome);
            summary.record(media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&format!("_{}_te.safetensors", arch.suffix))?;
    }
    Ok(summary)
}

/// One caption's cache: kept when complete and made from the same caption (and control images), else encoded and
/// written by `write`. `Ok(Err(reason))` when the item's control images cannot be found or read (the item's
/// failure); `Err` when writing fails (the pass stops).
fn caption_outcome(
    (caption, media, path): (&str, &Path, &Path),
    (arch, prefixes): (&ImageCacheArch, &[&str]),
    edit: Option<(&str, &DatasetControls)>,
    write: &mut dyn FnMut(CaptionCache<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<Result<ItemOutcome, String>> {
    let stamped = || -> Result<(&[PathBuf], Option<String>), ControlError> {
        let Some((tag, controls)) = edit else {
            return Ok((&[], None));
        };
        let paths = controls.of(media)?;
        if paths.is_empty() {
            return Ok((paths, None));
        }
        Ok((
            paths,
            Some(format!("{tag} {}", control_stamp(media, paths)?)),
        ))
    };
    let (paths, stamp) = match stamped() {
        Ok(stamped) => stamped,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let fresh = header::complete_cache(path, prefixes, arch.architecture).is_some_and(|meta| {
        meta.get("caption1").map(String::as_str) == Some(caption)
            && (edit.is_none() || meta.get(CONTROLS_METADATA) == stamp.as_ref())
    });
    if fresh {
        return Ok(Ok(ItemOutcome::Skipped));
    }
    let images = match read_controls(media, paths) {
        Ok(images) => images,
        Err(e) => return Ok(Err(e.to_string())),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
    }
    write(CaptionCache {
        caption,
        media,
        path,
        controls: &images,
        stamp: stamp.as_deref(),
    })?;
    Ok(Ok(ItemOutcome::Written(1)))
}
