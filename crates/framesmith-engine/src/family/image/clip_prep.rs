//! The latent pass of a video family whose caches are musubi-tuner's per-clip files (`{stem}_{start}-{frames}_
//! {w}x{h}_{suffix}.safetensors`): every image and clip of the dataset config bucketed at the family's step,
//! clips cut at its frame rate, each sample encoded and written by the family, caches already complete kept,
//! stale ones removed.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::prep::{scan_all, CacheOptions, CacheProgress, CacheSummary, Expected, ItemOutcome};
use framesmith_data::cache::media_stem;
use framesmith_data::frames::{select_frames, FrameWindow};
use framesmith_data::media::MediaTools;
use framesmith_data::probe::{image_size, probe_video};
use framesmith_data::samples::{cache_dir, image_sample, video_samples_at, Sample};
use framesmith_data::{DatasetKind, ResolvedDataset, ValidConfig};

/// A family's per-clip latent caches: their names, the bucket step and frame rate its VAE takes, whether a file
/// is already a complete cache, and how one sample is encoded and written to its path.
pub(crate) struct ClipLatents<'a> {
    /// The caches' suffix without the underscore (`ltx2`, `hv15`).
    pub suffix: &'a str,
    /// The cache file name of a media stem, a clip's window (none for an image) and the media's original size.
    pub name: fn(&str, Option<FrameWindow>, (u32, u32)) -> String,
    /// Bucket sides in steps of this many pixels.
    pub step: u32,
    /// The frame rate clips are cut at.
    pub fps: f64,
    /// Whether an item's caches are complete, from the media and its latent cache file.
    pub cached: &'a dyn Fn(&Path, &Path) -> bool,
    pub write: &'a dyn Fn(&Sample, &Path) -> anyhow::Result<()>,
}

/// Writes the latent cache of every image and clip of the dataset config.
pub(crate) fn cache_clip_latents(
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    latents: &ClipLatents,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, tools, &mut summary, progress);
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let outcome = cache_item(ds, tools, &item.media, latents, &mut expected)
                .with_context(|| format!("caching {}", item.media.display()))?;
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&format!("_{}.safetensors", latents.suffix))?;
    }
    Ok(summary)
}

/// The cache file of a sample, beside where the sample's own name would go.
fn cache_path(sample: &Sample, latents: &ClipLatents) -> PathBuf {
    let dir = sample
        .latent_cache
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    dir.join((latents.name)(
        &media_stem(&sample.media),
        sample.window,
        sample.original_size,
    ))
}

/// The cache files of an item from headers and a probe only; `None` when the media cannot be measured so.
fn planned_caches(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    media: &Path,
    latents: &ClipLatents,
) -> Option<Vec<PathBuf>> {
    let dir = cache_dir(ds, media);
    let stem = media_stem(media);
    match ds.kind() {
        DatasetKind::Image => {
            let size = image_size(media).ok()?;
            Some(vec![dir.join((latents.name)(&stem, None, size))])
        }
        DatasetKind::Video => {
            let params = ds.video.as_ref()?;
            let info = probe_video(tools, media).ok()?;
            let frames = info.frame_count? as usize;
            let size = (info.width, info.height);
            let names = select_frames(frames, params, latents.fps)
                .into_iter()
                .map(|c| dir.join((latents.name)(&stem, Some(c.window), size)))
                .collect();
            Some(names)
        }
    }
}

/// Caches one image or video.
fn cache_item(
    ds: &ResolvedDataset,
    tools: Option<&MediaTools>,
    media: &Path,
    latents: &ClipLatents,
    expected: &mut Expected,
) -> anyhow::Result<ItemOutcome> {
    if let Some(planned) = planned_caches(ds, tools, media, latents) {
        planned.iter().for_each(|p| expected.file(p));
        if !planned.is_empty() && planned.iter().all(|p| (latents.cached)(media, p)) {
            return Ok(ItemOutcome::Skipped);
        }
    }
    // A file that does not decode is the item's failure; anything later (the VAE, the disk) stops the pass.
    let decoded = match ds.kind() {
        DatasetKind::Image => image_sample(ds, media, latents.step)
            .map(|s| vec![s])
            .map_err(|e| e.reason()),
        DatasetKind::Video => {
            video_samples_at(ds, tools, media, latents.step, latents.fps).map_err(|e| e.reason())
        }
    };
    let samples = match decoded {
        Ok(samples) if !samples.is_empty() => samples,
        failed => {
            expected.failed(ds, media);
            let reason = failed
                .err()
                .unwrap_or_else(|| "the video is too short for any clip of target_frames".into());
            return Ok(ItemOutcome::Failed(reason));
        }
    };
    let mut written = 0;
    for sample in &samples {
        let path = cache_path(sample, latents);
        expected.file(&path);
        if (latents.cached)(media, &path) {
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
        }
        (latents.write)(sample, &path)?;
        written += 1;
    }
    Ok(if written == 0 {
        ItemOutcome::Skipped
    } else {
        ItemOutcome::Written(written)
    })
}
