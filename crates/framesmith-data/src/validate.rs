//! Checks a dataset config for every problem at once: missing sources, bad sizes and frame counts, keys that
//! musubi-tuner would silently ignore or round, and cache directories shared between datasets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::config::{
    resolve_path, round_down_to_4n1, ConfigError, DatasetConfig, DatasetKind, DatasetSection,
    FrameExtraction, GeneralSection, Resolution, ResolvedDataset,
};
use super::keys::without_follow_ups;
use super::problem::{Problem, Unreadable};
use super::scan::entry_problems;

/// Pixel multiple every resolution must be (VAE stride 8 × patch 2).
pub const RESOLUTION_STEP: u32 = 16;

/// Largest side a clip may be trained at: Wan's rotary table covers 1024 positions a side, 16 pixels each.
pub const MAX_RESOLUTION_SIDE: u32 = 16_384;

/// Most frames a clip may have: Wan's rotary table covers 1024 latent frames, 4 frames each after the first.
pub const MAX_CLIP_FRAMES: u32 = 1 + 4 * 1023;

/// A dataset config with no errors, ready for training.
#[derive(Clone, Debug)]
pub struct ValidConfig {
    /// The config as read.
    pub config: DatasetConfig,
    /// Its datasets with `[general]` and the defaults applied.
    pub datasets: Vec<ResolvedDataset>,
    /// Its `[[validation_datasets]]`, resolved the same way.
    pub validation_datasets: Vec<ResolvedDataset>,
    /// Warnings to show the user.
    pub warnings: Vec<Problem>,
}

impl ValidConfig {
    /// Every dataset to cache: `[[datasets]]`, then `[[validation_datasets]]`.
    pub fn all_datasets(&self) -> impl Iterator<Item = &ResolvedDataset> {
        self.datasets.iter().chain(&self.validation_datasets)
    }
}

/// Reads and validates a dataset config file; any error (every one is listed) fails with
/// [`ConfigError::Invalid`]. Relative paths are taken from the file's folder. An entry that cannot be read is an
/// error ([`load_valid_with`] can make it a warning).
pub fn load_valid(path: &Path) -> Result<ValidConfig, ConfigError> {
    load_valid_with(path, Unreadable::Refuse)
}

/// [`load_valid`], with entries that cannot be read (a dangling link, a FIFO, a device) errors or, with
/// [`Unreadable::Skip`], warnings (grouped, so that thousands make one line) and left out.
pub fn load_valid_with(path: &Path, unreadable: Unreadable) -> Result<ValidConfig, ConfigError> {
    let parsed = DatasetConfig::read(path)?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let validated = validate(&parsed.config, path, &base);
    let mut problems = parsed.problems;
    let validated = without_follow_ups(&problems, validated);
    problems.extend(validated);
    let (errors, warnings): (Vec<Problem>, Vec<Problem>) =
        problems.into_iter().partition(Problem::is_error);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid { problems: errors });
    }
    let mut valid = ValidConfig {
        datasets: parsed.config.resolve(&base),
        validation_datasets: parsed.config.resolve_validation(&base),
        config: parsed.config,
        warnings,
    };
    // An entry that cannot be read would otherwise be left out of caching and training without a word.
    let entries: Vec<Problem> = valid
        .all_datasets()
        .flat_map(entry_problems)
        .filter(Problem::is_error)
        .collect();
    let (errors, skipped): (Vec<Problem>, Vec<Problem>) = unreadable
        .apply(entries)
        .into_iter()
        .partition(Problem::is_error);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid { problems: errors });
    }
    valid.warnings.extend(skipped);
    Ok(valid)
}

/// Every problem in `config` (read from `file`, relative paths taken from `base`), errors and warnings.
pub fn validate(config: &DatasetConfig, file: &Path, base: &Path) -> Vec<Problem> {
    let mut out = Vec::new();
    check_general(&config.general, file, &mut out);
    if config.datasets.is_empty() {
        out.push(Problem::key_error(
            file,
            "datasets",
            "the config has no [[datasets]] section: add one with image_directory or video_directory",
        ));
    }
    let lists = [
        ("datasets", &config.datasets),
        ("validation_datasets", &config.validation_datasets),
    ];
    for (i, ds, list) in lists
        .iter()
        .flat_map(|(list, all)| all.iter().enumerate().map(move |(i, ds)| (i, ds, *list)))
    {
        let cx = Cx {
            file,
            base,
            prefix: format!("{list}[{i}]"),
        };
        check_source(ds, &cx, &mut out);
        check_common(ds, &config.general, &cx, &mut out);
        if ds.kind() == DatasetKind::Video {
            check_video(ds, &cx, &mut out);
        }
        check_unused(ds, &cx, &mut out);
    }
    check_cache_directories(config, file, base, &mut out);
    out
}

struct Cx<'a> {
    file: &'a Path,
    base: &'a Path,
    prefix: String,
}

impl Cx<'_> {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }
    fn error(&self, key: &str, message: impl Into<String>) -> Problem {
        Problem::key_error(self.file, self.key(key), message)
    }
    fn warning(&self, key: &str, message: impl Into<String>) -> Problem {
        Problem::key_warning(self.file, self.key(key), message)
    }
}

fn check_general(g: &GeneralSection, file: &Path, out: &mut Vec<Problem>) {
    if let Some(r) = g.resolution {
        if let Some(m) = resolution_problem(r) {
            out.push(Problem::key_error(file, "general.resolution", m));
        }
    }
    if g.batch_size == Some(0) {
        out.push(Problem::key_error(
            file,
            "general.batch_size",
            "must be at least 1",
        ));
    }
    if let Some(ext) = &g.caption_extension {
        if let Some(m) = caption_extension_problem(ext) {
            out.push(Problem::key_warning(file, "general.caption_extension", m));
        }
    }
}

fn resolution_problem(r: Resolution) -> Option<String> {
    let (w, h) = r.size();
    if w > MAX_RESOLUTION_SIDE || h > MAX_RESOLUTION_SIDE {
        return Some(format!(
            "{w}x{h} is more than {MAX_RESOLUTION_SIDE} pixels a side, past what Wan's positions cover; train at \
             a size such as [1280, 720]"
        ));
    }
    let bad = |v: u32| v == 0 || v % RESOLUTION_STEP != 0;
    (bad(w) || bad(h)).then(|| {
        let fix = |v: u32| (v / RESOLUTION_STEP).max(1) * RESOLUTION_STEP;
        format!(
            "{w}x{h} is not a multiple of {RESOLUTION_STEP} pixels on each side; use [{}, {}]",
            fix(w),
            fix(h)
        )
    })
}

fn caption_extension_problem(ext: &str) -> Option<String> {
    (!ext.starts_with('.')).then(|| {
        format!("\"{ext}\" has no leading dot, so captions are looked for as `image1{ext}`; did you mean \".{ext}\"?")
    })
}

fn check_source(ds: &DatasetSection, cx: &Cx, out: &mut Vec<Problem>) {
    let sources = [
        ("image_directory", &ds.image_directory, true),
        ("image_jsonl_file", &ds.image_jsonl_file, false),
        ("video_directory", &ds.video_directory, true),
        ("video_jsonl_file", &ds.video_jsonl_file, false),
    ];
    let set: Vec<_> = sources.iter().filter(|(_, p, _)| p.is_some()).collect();
    match set.as_slice() {
        [] => out.push(Problem::key_error(
            cx.file,
            cx.prefix.clone(),
            "names no images or videos: set image_directory, image_jsonl_file, video_directory or video_jsonl_file",
        )),
        [_] => {}
        [first, rest @ ..] => {
            let others: Vec<&str> = rest.iter().map(|(k, _, _)| *k).collect();
            out.push(cx.error(
                first.0,
                format!("set only one source per dataset; this one also sets {}", others.join(", ")),
            ));
        }
    }
    for (key, path, is_dir) in set {
        let Some(path) = path else { continue };
        let abs = resolve_path(cx.base, path);
        if *is_dir && !abs.is_dir() {
            out.push(cx.error(key, format!("directory {} does not exist", abs.display())));
        } else if !*is_dir && !abs.is_file() {
            out.push(cx.error(key, format!("file {} does not exist", abs.display())));
        }
    }
    if let Some(dir) = &ds.control_directory {
        let abs = resolve_path(cx.base, dir);
        if !abs.is_dir() {
            out.push(cx.error(
                "control_directory",
                format!("directory {} does not exist", abs.display()),
            ));
        }
    }
}

fn check_common(ds: &DatasetSection, g: &GeneralSection, cx: &Cx, out: &mut Vec<Problem>) {
    if let Some(m) = ds.resolution.and_then(resolution_problem) {
        out.push(cx.error("resolution", m));
    }
    if ds.batch_size == Some(0) {
        out.push(cx.error("batch_size", "must be at least 1"));
    }
    if ds.num_repeats.or(g.num_repeats) == Some(0) {
        // One meaning everywhere: musubi-tuner would train on nothing from it, and a silent 1 would train on it.
        let key = if ds.num_repeats.is_some() {
            cx.key("num_repeats")
        } else {
            "general.num_repeats".to_string()
        };
        out.push(Problem::key_error(
            cx.file,
            key,
            format!(
                "is 0 for {}, which would train on nothing from it; set num_repeats = 1 or more, or remove the \
                 dataset",
                cx.prefix
            ),
        ));
    }
    let enable_bucket = ds.enable_bucket.or(g.enable_bucket).unwrap_or(false);
    if !enable_bucket && ds.bucket_no_upscale == Some(true) {
        out.push(cx.warning(
            "bucket_no_upscale",
            "has no effect because enable_bucket is off",
        ));
    }
    let is_jsonl = ds.image_jsonl_file.is_some() || ds.video_jsonl_file.is_some();
    let is_dir = ds.image_directory.is_some() || ds.video_directory.is_some();
    match ds.caption_extension.as_ref().or(g.caption_extension.as_ref()) {
        None if is_dir && !is_jsonl => out.push(cx.error(
            "caption_extension",
            "is not set here or in [general]; captions are read from files beside the media: add caption_extension = \".txt\"",
        )),
        Some(ext) if ds.caption_extension.is_some() => {
            if let Some(m) = caption_extension_problem(ext) {
                out.push(cx.warning("caption_extension", m));
            }
        }
        _ => {}
    }
    if is_jsonl && ds.cache_directory.is_none() {
        out.push(cx.error(
            "cache_directory",
            "is required for a dataset read from a JSONL file",
        ));
    }
    if let Some(dir) = &ds.cache_directory {
        let abs = resolve_path(cx.base, dir);
        if abs.exists() && !abs.is_dir() {
            out.push(cx.error(
                "cache_directory",
                format!("{} exists and is not a directory", abs.display()),
            ));
        }
    }
}

fn check_video(ds: &DatasetSection, cx: &Cx, out: &mut Vec<Problem>) {
    let extraction = ds.frame_extraction.unwrap_or_default();
    match &ds.target_frames {
        None if extraction != FrameExtraction::Full => out.push(cx.warning(
            "target_frames",
            "is not set, so musubi-tuner's default [1] trains on single frames; set e.g. target_frames = [1, 25, 45]",
        )),
        None => {}
        Some(frames) if frames.is_empty() => out.push(cx.error("target_frames", "is empty; list clip lengths such as [1, 25, 45]")),
        Some(frames) => {
            for &f in frames {
                if let Some(m) = frame_count_problem(f) {
                    out.push(cx.error("target_frames", m));
                }
            }
            if extraction == FrameExtraction::Chunk && frames.contains(&1) {
                out.push(cx.warning("target_frames", "contains 1 with frame_extraction = \"chunk\", which extracts every frame as its own clip"));
            }
        }
    }
    for (key, value) in [
        ("frame_stride", ds.frame_stride),
        ("frame_sample", ds.frame_sample),
        ("max_frames", ds.max_frames),
    ] {
        if value == Some(0) {
            out.push(cx.error(key, "must be at least 1"));
        }
    }
    if let Some(max) = ds.max_frames.filter(|&m| m > MAX_CLIP_FRAMES) {
        out.push(cx.error(
            "max_frames",
            format!("{max} is more than {MAX_CLIP_FRAMES} frames, past Wan's 1024 latent frame positions"),
        ));
    }
    let unused = [
        (
            "frame_stride",
            ds.frame_stride.is_some(),
            FrameExtraction::Slide,
        ),
        (
            "frame_sample",
            ds.frame_sample.is_some(),
            FrameExtraction::Uniform,
        ),
        ("max_frames", ds.max_frames.is_some(), FrameExtraction::Full),
    ];
    for (key, set, used_by) in unused {
        if set && extraction != used_by {
            out.push(cx.warning(key, format!("is used only with frame_extraction = \"{used_by}\"; this dataset uses \"{extraction}\"")));
        }
    }
    if extraction == FrameExtraction::Uniform && ds.frame_sample.unwrap_or(1) == 1 {
        out.push(cx.warning(
            "frame_sample",
            "is 1, so frame_extraction = \"uniform\" acts as \"head\"",
        ));
    }
    if let Some(fps) = ds.source_fps {
        if !(fps.is_finite() && fps > 0.0) {
            out.push(cx.error("source_fps", format!("{fps} is not a positive frame rate")));
        }
    }
}

/// The problem with one `target_frames` value, if any.
pub fn frame_count_problem(frames: u32) -> Option<String> {
    if frames == 0 {
        return Some("0 is not a clip length; use N*4+1 frames (1, 5, 9, ..., 81)".into());
    }
    if frames > MAX_CLIP_FRAMES {
        return Some(format!(
            "{frames} frames is more than {MAX_CLIP_FRAMES}, past Wan's 1024 latent frame positions; use clips of \
             at most 81 to 121 frames, as Wan was trained"
        ));
    }
    if frames % 4 == 1 {
        return None;
    }
    let down = round_down_to_4n1(frames);
    Some(format!(
        "{frames} is not N*4+1 frames (Wan's and HunyuanVideo 1.5's VAEs pack 4 frames per latent after the \
         first); use {down} or {} (musubi-tuner would silently round it down to {down})",
        down + 4
    ))
}

fn check_unused(ds: &DatasetSection, cx: &Cx, out: &mut Vec<Problem>) {
    // Control images are the edit models' (FLUX.1 Kontext, Qwen-Image-Edit) sources in an image dataset.
    let video = ds.kind() == DatasetKind::Video;
    let other_models = [
        ("control_directory", video && ds.control_directory.is_some()),
        ("multiple_target", ds.multiple_target == Some(true)),
        ("fp_1f_clean_indices", ds.fp_1f_clean_indices.is_some()),
        ("fp_1f_target_index", ds.fp_1f_target_index.is_some()),
        (
            "no_resize_control",
            video && ds.no_resize_control == Some(true),
        ),
        (
            "control_resolution",
            video && ds.control_resolution.is_some(),
        ),
    ];
    for (key, set) in other_models {
        if set {
            out.push(cx.warning(
                key,
                "is kept in the config but not used by framesmith's Wan trainer",
            ));
        }
    }
}

fn check_cache_directories(
    config: &DatasetConfig,
    file: &Path,
    base: &Path,
    out: &mut Vec<Problem>,
) {
    let mut seen: HashMap<PathBuf, String> = HashMap::new();
    let all = config
        .datasets
        .iter()
        .enumerate()
        .map(|(i, ds)| (format!("datasets[{i}]"), ds))
        .chain(
            config
                .validation_datasets
                .iter()
                .enumerate()
                .map(|(i, ds)| (format!("validation_datasets[{i}]"), ds)),
        );
    for (name, ds) in all {
        // musubi-tuner falls back to the image/video directory when cache_directory is not set.
        let dir = ds
            .cache_directory
            .as_ref()
            .or(ds.video_directory.as_ref())
            .or(ds.image_directory.as_ref())
            .map(|p| resolve_path(base, p));
        let Some(dir) = dir else { continue };
        if let Some(first) = seen.get(&dir) {
            out.push(Problem::key_error(
                file,
                format!("{name}.cache_directory"),
                format!(
                    "{} is also the cache directory of {first}; give each dataset its own cache_directory",
                    dir.display()
                ),
            ));
        } else {
            seen.insert(dir, name);
        }
    }
}

#[cfg(test)]
mod tests;
