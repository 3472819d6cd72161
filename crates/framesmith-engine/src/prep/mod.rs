//! What every family's caching of a musubi-tuner dataset shares: the entry point ([`pass`]), the options, the
//! outcome of each item and the summary, the scan of the datasets, the expected cache files and the removal of stale
//! ones, and the complete-cache check ([`header`]). The encoders and file formats are each family's (`family/`).
//! Caches already on disk are kept, caches of items no longer in the dataset are removed unless asked not to, and a
//! file that cannot be decoded is reported and skipped.

pub(crate) mod header;
pub mod pass;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{Device, Tensor};
use image::RgbImage;

use framesmith_data::cache::media_stem;
use framesmith_data::media::MediaTools;
use framesmith_data::samples::cache_dir;
use framesmith_data::scan::groups::UNUSABLE_ENTRIES;
use framesmith_data::scan::{scan_dataset, DatasetScan, ScanOptions};
use framesmith_data::{DatasetKind, ResolvedDataset, ValidConfig};

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
    /// Dataset problems found on the way (missing captions, unreadable files), and tensors that held NaN, each
    /// line starting with its severity.
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

/// Refuses video datasets before anything is encoded, for a `family` that trains on images.
pub(crate) fn images_only(valid: &ValidConfig, family: &str) -> anyhow::Result<()> {
    let videos: Vec<String> = valid
        .all_datasets()
        .filter(|ds| ds.kind() == DatasetKind::Video)
        .map(|ds| ds.source.path().display().to_string())
        .collect();
    if videos.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{family} trains on images; remove the video datasets from the dataset config or cache them for a video \
         model: {}",
        videos.join(", ")
    )
}

/// The latent pass of an image family: every image of the dataset config through `cache_one` (which writes its
/// cache and names it in `expected`), then the stale caches ending in `_{suffix}.safetensors` removed unless kept.
pub(crate) fn cache_image_latents(
    valid: &ValidConfig,
    (options, suffix): (&CacheOptions, &str),
    progress: &mut dyn CacheProgress,
    cache_one: &mut dyn FnMut(
        &ResolvedDataset,
        &Path,
        &mut Expected,
    ) -> anyhow::Result<ItemOutcome>,
) -> anyhow::Result<CacheSummary> {
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, None, &mut summary, progress);
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let outcome = cache_one(ds, &item.media, &mut expected)
                .with_context(|| format!("caching {}", item.media.display()))?;
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&format!("_{suffix}.safetensors"))?;
    }
    Ok(summary)
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
    let mut scan = scan_dataset(dataset, &options);
    // Entries that are not readable files were refused, or left out with a warning, when the dataset config was
    // loaded ([`framesmith_data::load_valid_with`]): they are neither encoded nor reported again.
    let unusable: BTreeSet<PathBuf> = scan
        .problems
        .iter()
        .filter(|p| p.group == Some(UNUSABLE_ENTRIES))
        .filter_map(|p| p.file.clone())
        .collect();
    scan.items.retain(|item| !unusable.contains(&item.media));
    scan.problems.retain(|p| p.group != Some(UNUSABLE_ENTRIES));
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
