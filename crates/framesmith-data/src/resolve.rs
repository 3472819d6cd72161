//! A dataset after `[general]` and musubi-tuner's defaults apply: its source, sizes, bucket settings and
//! video settings, with relative paths made absolute.

use std::path::{Path, PathBuf};

use super::config::{
    DatasetConfig, DatasetKind, DatasetSection, FrameExtraction, GeneralSection, Resolution,
    DEFAULT_MAX_FRAMES, DEFAULT_RESOLUTION,
};

/// Where a dataset's items are listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetSource {
    /// `image_directory`: images with caption files beside them.
    ImageDirectory(PathBuf),
    /// `image_jsonl_file`: one `{"image_path", "caption"}` object per line.
    ImageJsonl(PathBuf),
    /// `video_directory`: videos with caption files beside them.
    VideoDirectory(PathBuf),
    /// `video_jsonl_file`: one `{"video_path", "caption"}` object per line.
    VideoJsonl(PathBuf),
}

impl DatasetSource {
    /// The directory or JSONL file.
    pub fn path(&self) -> &Path {
        match self {
            DatasetSource::ImageDirectory(p)
            | DatasetSource::ImageJsonl(p)
            | DatasetSource::VideoDirectory(p)
            | DatasetSource::VideoJsonl(p) => p,
        }
    }

    /// Image or video.
    pub fn kind(&self) -> DatasetKind {
        match self {
            DatasetSource::ImageDirectory(_) | DatasetSource::ImageJsonl(_) => DatasetKind::Image,
            DatasetSource::VideoDirectory(_) | DatasetSource::VideoJsonl(_) => DatasetKind::Video,
        }
    }

    /// The directory, for directory datasets.
    pub fn directory(&self) -> Option<&Path> {
        match self {
            DatasetSource::ImageDirectory(p) | DatasetSource::VideoDirectory(p) => Some(p),
            _ => None,
        }
    }
}

/// Video-only settings after defaults, as musubi-tuner applies them.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoParams {
    /// Clip lengths: sorted, without repeats, each rounded down to N*4+1 (musubi-tuner's rounding).
    pub target_frames: Vec<u32>,
    /// `uniform` with `frame_sample = 1` has become `head`, as in musubi-tuner.
    pub frame_extraction: FrameExtraction,
    /// Step between `slide` windows.
    pub frame_stride: u32,
    /// Number of `uniform` windows.
    pub frame_sample: u32,
    /// Longest `full` clip.
    pub max_frames: u32,
    /// Frame rate the videos are taken to have; `None` uses every frame.
    pub source_fps: Option<f64>,
}

/// One dataset with `[general]` and musubi-tuner's defaults applied and relative paths made absolute.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedDataset {
    /// Position in `[[datasets]]`.
    pub index: usize,
    /// Where the items are listed.
    pub source: DatasetSource,
    /// `(width, height)`.
    pub resolution: (u32, u32),
    /// `None` is only valid for JSONL datasets.
    pub caption_extension: Option<String>,
    /// Items per batch.
    pub batch_size: u32,
    /// Repeats per epoch.
    pub num_repeats: u32,
    /// Aspect-ratio buckets on.
    pub enable_bucket: bool,
    /// Forced off when `enable_bucket` is off, as in musubi-tuner.
    pub bucket_no_upscale: bool,
    /// `cache_directory`, else the image/video directory; `None` for a JSONL dataset without one.
    pub cache_directory: Option<PathBuf>,
    /// Control images/videos (edit models' source images; not used by the Wan T2V trainer).
    pub control_directory: Option<PathBuf>,
    /// `control_resolution` (`qwen_image_edit_control_resolution`): the area control images are bucketed to
    /// instead of their target's bucket; `(width, height)`.
    pub control_resolution: Option<(u32, u32)>,
    /// `no_resize_control`: control images keep their size (rounded down to the bucket step, and no larger than
    /// `control_resolution`'s area when set).
    pub no_resize_control: bool,
    /// Present for video datasets.
    pub video: Option<VideoParams>,
}

impl ResolvedDataset {
    /// Image or video.
    pub fn kind(&self) -> DatasetKind {
        self.source.kind()
    }
}

/// Makes `path` absolute against `base` (the config file's folder); absolute paths are kept. `.` components
/// are dropped so reported paths read cleanly.
pub fn resolve_path(base: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let tidy: PathBuf = joined
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    // `.` relative to the current folder is the current folder, not an empty path (which names nothing).
    if tidy.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        tidy
    }
}

/// musubi-tuner's rounding of a clip length down to N*4+1 (lengths below 1 stay as they are).
pub fn round_down_to_4n1(frames: u32) -> u32 {
    if frames == 0 {
        0
    } else {
        (frames - 1) / 4 * 4 + 1
    }
}

impl DatasetConfig {
    /// Applies `[general]` and the defaults to every dataset that names a source, with relative paths taken
    /// from `base` (the config file's folder; musubi-tuner takes them from its working directory). Datasets
    /// without a source are left out; [`super::validate::validate`] reports them.
    pub fn resolve(&self, base: &Path) -> Vec<ResolvedDataset> {
        self.datasets
            .iter()
            .enumerate()
            .filter_map(|(index, ds)| resolve_one(index, ds, &self.general, base))
            .collect()
    }

    /// [`DatasetConfig::resolve`] for `[[validation_datasets]]` (`index` is the position in that list).
    pub fn resolve_validation(&self, base: &Path) -> Vec<ResolvedDataset> {
        self.validation_datasets
            .iter()
            .enumerate()
            .filter_map(|(index, ds)| resolve_one(index, ds, &self.general, base))
            .collect()
    }
}

fn dataset_source(ds: &DatasetSection, base: &Path) -> Option<DatasetSource> {
    let abs = |p: &PathBuf| resolve_path(base, p);
    // Same precedence as musubi-tuner: directory before JSONL, video before image.
    if let Some(p) = &ds.video_directory {
        Some(DatasetSource::VideoDirectory(abs(p)))
    } else if let Some(p) = &ds.video_jsonl_file {
        Some(DatasetSource::VideoJsonl(abs(p)))
    } else if let Some(p) = &ds.image_directory {
        Some(DatasetSource::ImageDirectory(abs(p)))
    } else {
        ds.image_jsonl_file
            .as_ref()
            .map(|p| DatasetSource::ImageJsonl(abs(p)))
    }
}

fn resolve_one(
    index: usize,
    ds: &DatasetSection,
    general: &GeneralSection,
    base: &Path,
) -> Option<ResolvedDataset> {
    let source = dataset_source(ds, base)?;
    let enable_bucket = ds.enable_bucket.or(general.enable_bucket).unwrap_or(false);
    let cache_directory = ds
        .cache_directory
        .as_ref()
        .map(|p| resolve_path(base, p))
        .or_else(|| source.directory().map(Path::to_path_buf));
    let video = (source.kind() == DatasetKind::Video).then(|| resolve_video(ds));
    Some(ResolvedDataset {
        index,
        resolution: ds
            .resolution
            .or(general.resolution)
            .map_or(DEFAULT_RESOLUTION, Resolution::size),
        caption_extension: ds
            .caption_extension
            .clone()
            .or_else(|| general.caption_extension.clone()),
        batch_size: ds.batch_size.or(general.batch_size).unwrap_or(1),
        num_repeats: ds.num_repeats.or(general.num_repeats).unwrap_or(1),
        enable_bucket,
        bucket_no_upscale: enable_bucket
            && ds
                .bucket_no_upscale
                .or(general.bucket_no_upscale)
                .unwrap_or(false),
        cache_directory,
        control_directory: ds.control_directory.as_ref().map(|p| resolve_path(base, p)),
        control_resolution: ds.control_resolution.map(Resolution::size),
        no_resize_control: ds.no_resize_control.unwrap_or(false),
        video,
        source,
    })
}

fn resolve_video(ds: &DatasetSection) -> VideoParams {
    let mut target_frames: Vec<u32> = ds
        .target_frames
        .clone()
        .unwrap_or_else(|| vec![1])
        .into_iter()
        .map(round_down_to_4n1)
        .collect();
    target_frames.sort_unstable();
    target_frames.dedup();
    let frame_sample = ds.frame_sample.unwrap_or(1);
    let mut frame_extraction = ds.frame_extraction.unwrap_or_default();
    if frame_extraction == FrameExtraction::Uniform && frame_sample == 1 {
        frame_extraction = FrameExtraction::Head;
    }
    VideoParams {
        target_frames,
        frame_extraction,
        frame_stride: ds.frame_stride.unwrap_or(1),
        frame_sample,
        max_frames: ds.max_frames.unwrap_or(DEFAULT_MAX_FRAMES),
        source_fps: ds.source_fps,
    }
}
