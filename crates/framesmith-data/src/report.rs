//! `framesmith dataset check`: reads a dataset config (or takes a bare folder as one dataset), scans every
//! dataset and sums it up: counts, sizes, frame counts, buckets and every problem, as data and as text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use super::bucket::BucketSelector;
use super::config::{
    ConfigError, DatasetConfig, DatasetKind, DatasetSection, GeneralSection, ResolvedDataset,
};
use super::frames::{select_frames, FrameWindow, WAN_TARGET_FPS};
use super::keys::without_follow_ups;
use super::probe::{is_image, is_video, list_files, IMAGE_EXTENSIONS, VIDEO_EXTENSIONS};
use super::problem::{summary_lines, Problem, Severity, Unreadable};
use super::scan::{scan_dataset, DatasetScan, ScanOptions};
use super::validate::validate;

/// One training bucket: items of this size (and clip length) are batched together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketKey {
    /// Bucket width in pixels.
    pub width: u32,
    /// Bucket height in pixels.
    pub height: u32,
    /// Clip length; 1 for images.
    pub frames: u32,
}

/// Smallest, largest and mean of a set of numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// Smallest value.
    pub min: u32,
    /// Largest value.
    pub max: u32,
    /// Mean.
    pub mean: f64,
}

impl Spread {
    fn of(values: &[u32]) -> Option<Self> {
        let min = *values.iter().min()?;
        let max = *values.iter().max()?;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
        Some(Self { min, max, mean })
    }
}

/// What one dataset holds.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetSummary {
    /// Position in `[[datasets]]`.
    pub index: usize,
    /// Image or video.
    pub kind: DatasetKind,
    /// Directory or JSONL file.
    pub source: PathBuf,
    /// Configured `(width, height)`.
    pub resolution: (u32, u32),
    /// Media files found (images or videos), including images left out for lack of a caption.
    pub media_found: usize,
    /// Media that take part in training: readable, captioned and (for videos) long enough for a clip.
    pub items: usize,
    /// Why the other media found take no part.
    pub left_out: LeftOut,
    /// Captions read.
    pub captions: usize,
    /// Media with no caption.
    pub missing_captions: Vec<PathBuf>,
    /// Media or caption files that could not be read.
    pub unreadable: Vec<PathBuf>,
    /// How many items have each `(width, height)`.
    pub sizes: BTreeMap<(u32, u32), usize>,
    /// Frame counts of the videos, before frame dropping.
    pub frame_counts: Option<Spread>,
    /// Training samples (images, or clips cut from videos) in each bucket, before `num_repeats`.
    pub buckets: BTreeMap<BucketKey, usize>,
    /// Samples per epoch: the bucket counts times `num_repeats`.
    pub samples_per_epoch: usize,
}

/// How many media files of a dataset are left out of training, by reason (an item is counted once, under the
/// first reason that applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeftOut {
    /// The media file cannot be read.
    pub unreadable: usize,
    /// No caption, or a caption that cannot be read.
    pub uncaptioned: usize,
    /// A video too short for any clip of `target_frames`.
    pub too_short: usize,
}

impl LeftOut {
    /// Items left out in all.
    pub fn total(&self) -> usize {
        self.unreadable + self.uncaptioned + self.too_short
    }
}

impl fmt::Display for LeftOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            (self.unreadable, "unreadable"),
            (self.uncaptioned, "without a usable caption"),
            (self.too_short, "too short for a clip"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        f.write_str(&parts.join(", "))
    }
}

/// The result of checking a dataset config or folder.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetReport {
    /// The config file or folder checked.
    pub checked: PathBuf,
    /// One summary per dataset that could be scanned.
    pub datasets: Vec<DatasetSummary>,
    /// Every problem, errors first.
    pub problems: Vec<Problem>,
}

impl DatasetReport {
    /// Number of errors.
    pub fn error_count(&self) -> usize {
        self.problems.iter().filter(|p| p.is_error()).count()
    }

    /// Number of warnings.
    pub fn warning_count(&self) -> usize {
        self.problems.len() - self.error_count()
    }

    /// No errors: training can start.
    pub fn is_ok(&self) -> bool {
        self.error_count() == 0
    }

    /// The report with the errors about entries that cannot be read made warnings (`Skip`) or told how to leave
    /// such entries out (`Refuse`), as training will treat them ([`Unreadable`]).
    pub fn with_unreadable(mut self, unreadable: Unreadable) -> Self {
        self.problems = unreadable.apply(self.problems);
        self.problems.sort_by_key(|p| p.severity);
        self
    }
}

/// Checks a dataset config file, or a folder taken as one dataset with musubi-tuner's defaults (captions in
/// `.txt` files; a folder with both images and videos becomes one image and one video dataset).
pub fn check_path(path: &Path, options: &ScanOptions) -> Result<DatasetReport, ConfigError> {
    let (config, base, mut problems) = if path.is_dir() {
        // The folder's config names the folder itself, so its paths start from the current folder.
        (folder_config(path), PathBuf::new(), Vec::new())
    } else {
        let parsed = DatasetConfig::read(path)?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        (parsed.config, base, parsed.problems)
    };
    let validated = validate(&config, path, &base);
    let validated = without_follow_ups(&problems, validated);
    problems.extend(validated);
    let scans: Vec<DatasetScan> = config
        .resolve(&base)
        .iter()
        .filter(|ds| ds.source.path().exists())
        .map(|ds| scan_dataset(ds, options))
        .collect();
    Ok(build_report(path, problems, scans))
}

/// A config for a bare folder: one dataset for its images and/or one for its videos, captions in `.txt` files.
pub fn folder_config(dir: &Path) -> DatasetConfig {
    let has_images = list_files(dir, is_image).is_ok_and(|f| !f.is_empty());
    let has_videos = list_files(dir, is_video).is_ok_and(|f| !f.is_empty());
    let both = has_images && has_videos;
    let mut datasets = Vec::new();
    if has_images || !has_videos {
        datasets.push(DatasetSection {
            image_directory: Some(dir.to_path_buf()),
            // Two datasets may not share a cache directory, and each would default to the folder itself.
            cache_directory: both.then(|| dir.join("cache_images")),
            ..Default::default()
        });
    }
    if has_videos {
        datasets.push(DatasetSection {
            video_directory: Some(dir.to_path_buf()),
            cache_directory: both.then(|| dir.join("cache_videos")),
            ..Default::default()
        });
    }
    DatasetConfig {
        general: GeneralSection {
            caption_extension: Some(".txt".into()),
            ..Default::default()
        },
        datasets,
        validation_datasets: Vec::new(),
    }
}

/// Sums up scans and puts the problems in order, errors first.
pub fn build_report(
    checked: &Path,
    mut problems: Vec<Problem>,
    scans: Vec<DatasetScan>,
) -> DatasetReport {
    let mut datasets = Vec::new();
    for mut scan in scans {
        let summary = summarize(&scan, &mut problems);
        problems.append(&mut scan.problems);
        datasets.push(summary);
    }
    problems.sort_by_key(|p| p.severity);
    DatasetReport {
        checked: checked.to_path_buf(),
        datasets,
        problems,
    }
}

fn summarize(scan: &DatasetScan, problems: &mut Vec<Problem>) -> DatasetSummary {
    let ds = &scan.dataset;
    let kind = ds.kind();
    let media_found = scan.items.len()
        + if kind == DatasetKind::Image {
            scan.missing_captions.len()
        } else {
            0
        };
    if media_found == 0 {
        problems.push(no_media_problem(ds));
    }
    let mut sizes = BTreeMap::new();
    let mut frame_counts = Vec::new();
    let mut buckets = BTreeMap::new();
    let selector = BucketSelector::for_latent_caching(ds);
    let mut upscaled = Upscaled::default();
    // Images without a caption never became items (musubi-tuner skips them).
    let mut left_out = LeftOut {
        uncaptioned: media_found - scan.items.len(),
        ..LeftOut::default()
    };
    let mut used = 0;
    let unreadable: std::collections::HashSet<&PathBuf> = scan.unreadable.iter().collect();
    for item in &scan.items {
        if unreadable.contains(&item.media) {
            left_out.unreadable += 1;
            continue;
        }
        if item.caption.is_none() {
            left_out.uncaptioned += 1;
            continue;
        }
        let Some(info) = &item.info else {
            // Not measured (probing off, or no ffprobe): nothing says it cannot be used.
            used += 1;
            continue;
        };
        *sizes.entry((info.width, info.height)).or_insert(0) += 1;
        frame_counts.extend(info.frame_count);
        let clips = clip_lengths(ds, info.frame_count, &item.media, problems);
        if clips.is_empty() {
            left_out.too_short += 1;
            continue;
        }
        used += 1;
        let (width, height) = selector.bucket_for((info.width, info.height));
        upscaled.note(&item.media, (info.width, info.height), (width, height));
        for frames in clips {
            *buckets
                .entry(BucketKey {
                    width,
                    height,
                    frames,
                })
                .or_insert(0) += 1;
        }
    }
    if let Some(problem) = upscaled.warning(ds.source.path(), used) {
        problems.push(problem);
    }
    problems.extend(batch_size_problem(ds, &buckets));
    let samples: usize = buckets.values().sum();
    DatasetSummary {
        index: ds.index,
        kind,
        source: ds.source.path().to_path_buf(),
        resolution: ds.resolution,
        media_found,
        items: used,
        left_out,
        captions: scan.captions,
        missing_captions: scan.missing_captions.clone(),
        unreadable: scan.unreadable.clone(),
        sizes,
        frame_counts: Spread::of(&frame_counts),
        buckets,
        samples_per_epoch: samples * ds.num_repeats as usize,
    }
}

/// The error of a dataset in which no media were found.
fn no_media_problem(ds: &ResolvedDataset) -> Problem {
    let kind = ds.kind();
    let exts = match kind {
        DatasetKind::Image => IMAGE_EXTENSIONS,
        DatasetKind::Video => VIDEO_EXTENSIONS,
    };
    Problem::error(
        ds.source.path(),
        format!("has no {kind}s (looked for {})", exts.join(", ")),
    )
}

/// Batches hold samples of one bucket, so a batch can never be larger than the largest bucket (its samples times
/// `num_repeats`): a larger `batch_size` would silently train on smaller batches than asked.
fn batch_size_problem(
    ds: &ResolvedDataset,
    buckets: &BTreeMap<BucketKey, usize>,
) -> Option<Problem> {
    let largest = buckets.values().max()? * ds.num_repeats as usize;
    (largest > 0 && ds.batch_size as usize > largest).then(|| {
        Problem::error(
            ds.source.path(),
            format!(
                "datasets[{}]: batch_size = {} but its largest bucket holds {largest} sample(s) per epoch (with \
                 num_repeats), and a batch takes samples of one bucket, so no batch could be that large; set \
                 batch_size to {largest} or less",
                ds.index, ds.batch_size
            ),
        )
    })
}

/// Enlargement beyond which a source is reported as upscaled to its bucket (small enlargements are harmless).
const UPSCALE_WARN_FACTOR: f64 = 1.5;

/// Media whose bucket is much larger than they are: the cache stores them upscaled, so the LoRA learns blur.
#[derive(Default)]
struct Upscaled {
    count: usize,
    /// The most enlarged item.
    worst: Option<Enlarged>,
}

/// One item's enlargement to its bucket.
struct Enlarged {
    media: PathBuf,
    size: (u32, u32),
    bucket: (u32, u32),
    factor: f64,
}

impl Upscaled {
    fn note(&mut self, media: &Path, size: (u32, u32), bucket: (u32, u32)) {
        if size.0 == 0 || size.1 == 0 {
            return;
        }
        // Resizing covers the bucket, so the larger of the two ratios is the enlargement.
        let factor =
            (f64::from(bucket.0) / f64::from(size.0)).max(f64::from(bucket.1) / f64::from(size.1));
        if factor <= UPSCALE_WARN_FACTOR {
            return;
        }
        self.count += 1;
        if self.worst.as_ref().is_none_or(|w| factor > w.factor) {
            self.worst = Some(Enlarged {
                media: media.to_path_buf(),
                size,
                bucket,
                factor,
            });
        }
    }

    fn warning(&self, source: &Path, items: usize) -> Option<Problem> {
        let Enlarged {
            media,
            size,
            bucket,
            factor,
        } = self.worst.as_ref()?;
        Some(Problem::warning(
            source,
            format!(
                "{} of {items} item(s) are smaller than their bucket and will be upscaled more than \
                 {UPSCALE_WARN_FACTOR}× (the most: {} at {}x{} → {}x{}, {factor:.1}×), which trains blur; use larger \
                 sources, a lower resolution, or bucket_no_upscale = true",
                self.count,
                media.display(),
                size.0,
                size.1,
                bucket.0,
                bucket.1
            ),
        ))
    }
}

/// Clip lengths taken from one item (one entry per distinct clip; `[1]` for an image), with a warning when a
/// video is too short to give any.
fn clip_lengths(
    ds: &ResolvedDataset,
    frame_count: Option<u32>,
    media: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<u32> {
    let (Some(video), Some(count)) = (&ds.video, frame_count) else {
        return vec![1];
    };
    // Uniform sampling can repeat a window; repeats share one cache file, so count each once.
    let windows: BTreeSet<FrameWindow> = select_frames(count as usize, video, WAN_TARGET_FPS)
        .into_iter()
        .map(|s| s.window)
        .collect();
    if windows.is_empty() {
        let shortest = video.target_frames.first().copied().unwrap_or(1);
        let fps_note = if video.source_fps.is_some() {
            " after frame dropping to 16 fps"
        } else {
            ""
        };
        problems.push(Problem::warning(
            media,
            format!("gives no clip: {count} frames{fps_note} is shorter than the shortest target_frames ({shortest})"),
        ));
    }
    windows.into_iter().map(|w| w.frames).collect()
}

impl fmt::Display for DatasetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} dataset(s), {} error(s), {} warning(s): {}",
            self.datasets.len(),
            self.error_count(),
            self.warning_count(),
            self.checked.display()
        )?;
        for ds in &self.datasets {
            writeln!(f)?;
            write!(f, "{ds}")?;
        }
        for severity in [Severity::Error, Severity::Warning] {
            let list: Vec<Problem> = self
                .problems
                .iter()
                .filter(|p| p.severity == severity)
                .cloned()
                .collect();
            if !list.is_empty() {
                writeln!(f)?;
                writeln!(f, "{}s:", capitalized(severity))?;
                for line in summary_lines(&list) {
                    writeln!(f, "  {line}")?;
                }
            }
        }
        Ok(())
    }
}

fn capitalized(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "Error",
        Severity::Warning => "Warning",
    }
}

impl fmt::Display for DatasetSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (w, h) = self.resolution;
        writeln!(
            f,
            "datasets[{}]: {} dataset at {}x{}: {}",
            self.index,
            self.kind,
            w,
            h,
            self.source.display()
        )?;
        let left_out = if self.left_out.total() > 0 {
            format!(" ({} left out: {})", self.left_out.total(), self.left_out)
        } else {
            String::new()
        };
        writeln!(
            f,
            "  {} {}s found, {} used{left_out}; captions: {} read, {} missing; {} unreadable file(s)",
            self.media_found,
            self.kind,
            self.items,
            self.captions,
            self.missing_captions.len(),
            self.unreadable.len()
        )?;
        if !self.sizes.is_empty() {
            writeln!(
                f,
                "  sizes: {}",
                top_entries(
                    self.sizes
                        .iter()
                        .map(|(&(w, h), &n)| (format!("{w}x{h}"), n))
                )
            )?;
        }
        if let Some(s) = self.frame_counts {
            writeln!(f, "  frames: {} to {} (mean {:.1})", s.min, s.max, s.mean)?;
        }
        if !self.buckets.is_empty() {
            let video = self.kind == DatasetKind::Video;
            let entries = self.buckets.iter().map(|(k, &n)| {
                let clip = if video {
                    format!(" x{}f", k.frames)
                } else {
                    String::new()
                };
                (format!("{}x{}{clip}", k.width, k.height), n)
            });
            writeln!(f, "  buckets: {}", top_entries(entries))?;
        }
        writeln!(f, "  samples per epoch: {}", self.samples_per_epoch)
    }
}

/// The most common entries as `name (count)`, and how many more there are.
fn top_entries(entries: impl Iterator<Item = (String, usize)>) -> String {
    const SHOWN: usize = 6;
    let mut all: Vec<(String, usize)> = entries.collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut text: Vec<String> = all
        .iter()
        .take(SHOWN)
        .map(|(name, n)| format!("{name} ({n})"))
        .collect();
    if all.len() > SHOWN {
        text.push(format!("and {} more", all.len() - SHOWN));
    }
    text.join(", ")
}
