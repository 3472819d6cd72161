//! What an image family's cache passes share: each image's latents (resized to its bucket, encoded by the family's
//! autoencoder, written in the family's cache layout, with an edit model's control images encoded beside them) and
//! each caption's text-encoder outputs, one caption at a time, with caches already there kept (a text cache only
//! while its caption is unchanged) and stale ones of the family removed unless asked not to. The family gives its cache layout ([`ImageCacheArch`]), its encoders and
//! what it writes; other families' caches in the same folder are left alone.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles};
use crate::prep::{
    cache_image_latents, frames_to_video, header, images_only, scan_all, CacheOptions,
    CacheProgress, CacheSummary, Expected, ItemOutcome,
};
use framesmith_data::cache::media_stem;
use framesmith_data::control::{load_controls, DatasetControls};
use framesmith_data::image_cache::ImageCacheArch;
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

/// Whether `path` holds a complete cache of `arch` with tensors starting with `prefixes` and, for a text cache,
/// made from this `caption`.
fn is_cached(path: &Path, arch: &ImageCacheArch, prefixes: &[&str], caption: Option<&str>) -> bool {
    header::complete_cache(path, prefixes, arch.architecture).is_some_and(|meta| {
        caption.is_none_or(|c| meta.get("caption1").map(String::as_str) == Some(c))
    })
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
        if is_cached(&path, arch, prefixes, None) {
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

/// One caption's text cache to write: the caption, the image it describes (for messages) and the cache's path.
pub(crate) struct CaptionCache<'a> {
    pub caption: &'a str,
    pub media: &'a Path,
    pub path: &'a Path,
}

/// Writes the text cache of every caption of the dataset config through `write` (which encodes the caption and
/// writes the family's tensors), one caption at a time, so a caption's cache does not depend on which others were
/// cached with it; a cache of `arch` already holding tensors starting with `prefixes` for the same caption is
/// kept.
pub(crate) fn cache_text(
    valid: &ValidConfig,
    (arch, prefixes): (&ImageCacheArch, &[&str]),
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
        for item in &scan.items {
            let media = &item.media;
            let path = cache_dir(ds, media).join(arch.text_cache_name(&media_stem(media)));
            expected.file(&path);
            let outcome = match &item.caption {
                None => {
                    expected.failed(ds, media);
                    ItemOutcome::Failed("no caption".into())
                }
                Some(caption) if is_cached(&path, arch, prefixes, Some(caption)) => {
                    ItemOutcome::Skipped
                }
                Some(caption) => {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir).with_context(|| {
                            format!("cannot create the cache directory {}", dir.display())
                        })?;
                    }
                    write(CaptionCache {
                        caption,
                        media,
                        path: &path,
                    })?;
                    ItemOutcome::Written(1)
                }
            };
            progress.item_done(media, &outcome);
            summary.record(media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&format!("_{}_te.safetensors", arch.suffix))?;
    }
    Ok(summary)
}
