//! Tests of the dataset config: musubi-tuner's documented examples, round trips, inheritance, and every bad-key
//! and bad-value case reported at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use super::*;
use crate::problem::{Problem, Severity};
use crate::validate::validate;

const FILE: &str = "/cfg/dataset.toml";

fn parse(text: &str) -> ParsedConfig {
    DatasetConfig::parse(text, Path::new(FILE)).unwrap()
}

fn parse_clean(text: &str) -> DatasetConfig {
    let parsed = parse(text);
    assert!(parsed.problems.is_empty(), "{:#?}", parsed.problems);
    parsed.config
}

fn round_trips(config: &DatasetConfig) {
    let text = config.to_toml_string().unwrap();
    let again = parse_clean(&text);
    assert_eq!(&again, config, "round trip changed the config:\n{text}");
}

fn p(s: &str) -> Option<PathBuf> {
    Some(PathBuf::from(s))
}

// dataset_config.md, "Sample for Image Dataset with Caption Text Files".
const IMAGE_CAPTIONS: &str = r#"
# resolution, caption_extension, batch_size, num_repeats, enable_bucket, bucket_no_upscale should be set in either general or datasets
# otherwise, the default values will be used for each item

# general configurations
[general]
resolution = [960, 544]
caption_extension = ".txt"
batch_size = 1
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
image_directory = "/path/to/image_dir"
cache_directory = "/path/to/cache_directory"
num_repeats = 1 # optional, default is 1. Number of times to repeat the dataset. Useful to balance the multiple datasets with different sizes.
# multiple_target = true # optional, default is false. Set to true for Qwen-Image-Layered training.

# other datasets can be added here. each dataset can have different configurations
"#;

#[test]
fn doc_image_dataset_with_captions() {
    let c = parse_clean(IMAGE_CAPTIONS);
    let expected = DatasetConfig {
        general: GeneralSection {
            resolution: Some(Resolution::WidthHeight(960, 544)),
            caption_extension: Some(".txt".into()),
            batch_size: Some(1),
            num_repeats: None,
            enable_bucket: Some(true),
            bucket_no_upscale: Some(false),
        },
        datasets: vec![DatasetSection {
            image_directory: p("/path/to/image_dir"),
            cache_directory: p("/path/to/cache_directory"),
            num_repeats: Some(1),
            ..Default::default()
        }],
        validation_datasets: Vec::new(),
    };
    assert_eq!(c, expected);
    round_trips(&c);
    let r = c.resolve(Path::new("/cfg"));
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0].source,
        DatasetSource::ImageDirectory("/path/to/image_dir".into())
    );
    assert_eq!(r[0].resolution, (960, 544));
    assert_eq!(r[0].caption_extension.as_deref(), Some(".txt"));
    assert!(r[0].enable_bucket && !r[0].bucket_no_upscale);
    assert_eq!(r[0].video, None);
}

// "Sample for Image Dataset with Metadata JSONL File".
const IMAGE_JSONL: &str = r#"
[general]
resolution = [960, 544]
batch_size = 1
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
image_jsonl_file = "/path/to/metadata.jsonl"
cache_directory = "/path/to/cache_directory" # required for metadata jsonl file
num_repeats = 1 # optional, default is 1. Same as above.
"#;

#[test]
fn doc_image_jsonl() {
    let c = parse_clean(IMAGE_JSONL);
    assert_eq!(c.datasets[0].image_jsonl_file, p("/path/to/metadata.jsonl"));
    round_trips(&c);
    let r = c.resolve(Path::new("/cfg"));
    assert_eq!(
        r[0].source,
        DatasetSource::ImageJsonl("/path/to/metadata.jsonl".into())
    );
    assert_eq!(r[0].caption_extension, None);
    assert_eq!(r[0].cache_directory, p("/path/to/cache_directory"));
}

// "Sample for Video Dataset with Caption Text Files".
const VIDEO_CAPTIONS: &str = r#"
[general]
resolution = [960, 544]
caption_extension = ".txt"
batch_size = 1
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
video_directory = "/path/to/video_dir"
cache_directory = "/path/to/cache_directory" # recommended to set cache directory
target_frames = [1, 25, 45]
frame_extraction = "head"
source_fps = 30.0 # optional, source fps for videos in the directory, decimal number

[[datasets]]
video_directory = "/path/to/video_dir2"
cache_directory = "/path/to/cache_directory2" # recommended to set cache directory
frame_extraction = "full"
max_frames = 45
"#;

#[test]
fn doc_video_dataset_with_captions() {
    let c = parse_clean(VIDEO_CAPTIONS);
    assert_eq!(c.datasets.len(), 2);
    assert_eq!(
        c.datasets[0],
        DatasetSection {
            video_directory: p("/path/to/video_dir"),
            cache_directory: p("/path/to/cache_directory"),
            target_frames: Some(vec![1, 25, 45]),
            frame_extraction: Some(FrameExtraction::Head),
            source_fps: Some(30.0),
            ..Default::default()
        }
    );
    assert_eq!(c.datasets[1].frame_extraction, Some(FrameExtraction::Full));
    assert_eq!(c.datasets[1].max_frames, Some(45));
    round_trips(&c);

    let r = c.resolve(Path::new("/cfg"));
    let v0 = r[0].video.as_ref().unwrap();
    assert_eq!(v0.target_frames, vec![1, 25, 45]);
    assert_eq!(v0.source_fps, Some(30.0));
    let v1 = r[1].video.as_ref().unwrap();
    assert_eq!(v1.target_frames, vec![1]);
    assert_eq!(
        (
            v1.frame_extraction,
            v1.max_frames,
            v1.frame_stride,
            v1.frame_sample
        ),
        (FrameExtraction::Full, 45, 1, 1)
    );
    assert_eq!(r[1].caption_extension.as_deref(), Some(".txt"));
}

// "Sample for Video Dataset with Metadata JSONL File".
const VIDEO_JSONL: &str = r#"
[general]
resolution = [960, 544]
batch_size = 1
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
video_jsonl_file = "/path/to/metadata.jsonl"
target_frames = [1, 25, 45]
frame_extraction = "head"
cache_directory = "/path/to/cache_directory_head"
source_fps = 30.0 # optional, source fps for videos in the jsonl file
# same metadata jsonl file can be used for multiple datasets
[[datasets]]
video_jsonl_file = "/path/to/metadata.jsonl"
target_frames = [1]
frame_stride = 10
cache_directory = "/path/to/cache_directory_stride"
"#;

#[test]
fn doc_video_jsonl() {
    let c = parse_clean(VIDEO_JSONL);
    assert_eq!(c.datasets[1].frame_stride, Some(10));
    assert_eq!(c.datasets[1].target_frames, Some(vec![1]));
    round_trips(&c);
    let r = c.resolve(Path::new("/cfg"));
    assert_eq!(
        r[1].source,
        DatasetSource::VideoJsonl("/path/to/metadata.jsonl".into())
    );
    assert_eq!(r[1].video.as_ref().unwrap().frame_stride, 10);
}

// The "Specifications" block (every documented key), with its comments.
const SPECIFICATION: &str = r#"
[general]
resolution = [960, 544] # optional, [W, H], default is [960, 544]. This is the default resolution for all datasets
caption_extension = ".txt" # optional, default is None. This is the default caption extension for all datasets
batch_size = 1 # optional, default is 1. This is the default batch size for all datasets
num_repeats = 1 # optional, default is 1. Number of times to repeat the dataset.
enable_bucket = true # optional, default is false. Enable bucketing for datasets
bucket_no_upscale = false # optional, default is false. Disable upscaling for bucketing. Ignored if enable_bucket is false

[[datasets]]
image_directory = "/path/to/image_dir"
caption_extension = ".txt" # required for caption text files, if general caption extension is not set
resolution = [960, 544] # required if general resolution is not set
batch_size = 4 # optional, overwrite the default batch size
num_repeats = 1 # optional, overwrite the default num_repeats
enable_bucket = false # optional, overwrite the default bucketing setting
bucket_no_upscale = true # optional, overwrite the default bucketing setting
cache_directory = "/path/to/cache_directory" # optional
control_directory = "/path/to/control_dir" # optional, required for dataset with control images

[[datasets]]
image_jsonl_file = "/path/to/metadata.jsonl" # includes pairs of image files and captions
resolution = [960, 544] # required if general resolution is not set
cache_directory = "/path/to/cache_directory" # required for metadata jsonl file

[[datasets]]
video_directory = "/path/to/video_dir"
caption_extension = ".txt" # required for caption text files, if general caption extension is not set
resolution = [960, 544] # required if general resolution is not set
control_directory = "/path/to/control_dir" # optional, required for dataset with control images
target_frames = [1, 25, 79] # required for video dataset. each element must be N*4+1 (N=0,1,2,...)
frame_extraction = "head" # optional, "head" or "chunk", "full", "slide", "uniform". Default is "head"
frame_stride = 1 # optional, default is 1, available for "slide" frame extraction
frame_sample = 4 # optional, default is 1 (same as "head"), available for "uniform" frame extraction
max_frames = 129 # optional, default is 129. Maximum number of frames to extract, available for "full" frame extraction

[[datasets]]
video_jsonl_file = "/path/to/metadata.jsonl" # includes pairs of video files and captions
target_frames = [1, 79]
cache_directory = "/path/to/cache_directory" # required for metadata jsonl file
"#;

#[test]
fn doc_specification_block() {
    let c = parse_clean(SPECIFICATION);
    assert_eq!(c.datasets.len(), 4);
    assert_eq!(c.datasets[0].batch_size, Some(4));
    assert_eq!(c.datasets[0].control_directory, p("/path/to/control_dir"));
    assert_eq!(c.datasets[2].frame_sample, Some(4));
    round_trips(&c);
    let r = c.resolve(Path::new("/cfg"));
    // enable_bucket = false in the dataset wins over [general], and then bucket_no_upscale is forced off.
    assert!(!r[0].enable_bucket && !r[0].bucket_no_upscale);
    assert_eq!(r[0].batch_size, 4);
    assert_eq!(r[1].batch_size, 1);
    assert!(r[1].enable_bucket);
    // The documentation's own 79 is not N*4+1 (79 = 4*19 + 3): musubi-tuner rounds it down to 77, and
    // validation reports it.
    assert_eq!(r[2].video.as_ref().unwrap().target_frames, vec![1, 25, 77]);
    let problems = validate(&c, Path::new(FILE), Path::new("/"));
    assert!(
        problems
            .iter()
            .any(|p| p.is_error() && p.message.contains("79 is not N*4+1")),
        "{problems:#?}"
    );
    assert_eq!(r[3].caption_extension.as_deref(), Some(".txt"));
}

// "Resizing Control Images", FramePack one-frame keys, and a square resolution.
#[test]
fn doc_control_and_framepack_keys() {
    let c = parse_clean(
        r#"
[general]
resolution = 512
caption_extension = ".txt"
[[datasets]]
image_directory = "/path/to/image_dir"
control_directory = "/path/to/control_dir"
control_resolution = [1024, 1024]
no_resize_control = false
fp_1f_clean_indices = [0, 10]
fp_1f_target_index = 1
fp_1f_no_post = true
fp_latent_window_size = 9
"#,
    );
    assert_eq!(c.general.resolution, Some(Resolution::Square(512)));
    assert_eq!(
        c.datasets[0].control_resolution,
        Some(Resolution::WidthHeight(1024, 1024))
    );
    assert_eq!(c.datasets[0].fp_1f_clean_indices, Some(vec![0, 10]));
    round_trips(&c);
    assert!(c.to_toml_string().unwrap().contains("resolution = 512"));
    assert_eq!(c.resolve(Path::new("/"))[0].resolution, (512, 512));
}

#[test]
fn deprecated_keys_are_read_as_their_new_names() {
    let c = parse_clean(
        "[[datasets]]\nimage_directory = \"/i\"\nqwen_image_edit_control_resolution = [1024, 1024]\nflux_kontext_no_resize_control = true\n",
    );
    assert_eq!(
        c.datasets[0].control_resolution,
        Some(Resolution::WidthHeight(1024, 1024))
    );
    assert_eq!(c.datasets[0].no_resize_control, Some(true));
}

#[test]
fn defaults_and_inheritance_follow_musubi() {
    let c = parse_clean(
        r#"
[general]
num_repeats = 3
bucket_no_upscale = true
[[datasets]]
video_directory = "clips"
frame_extraction = "uniform"
source_fps = 30
"#,
    );
    let r = &c.resolve(Path::new("/cfg"))[0];
    assert_eq!(r.source, DatasetSource::VideoDirectory("/cfg/clips".into()));
    assert_eq!(r.cache_directory, p("/cfg/clips"));
    assert_eq!(
        (r.resolution, r.batch_size, r.num_repeats),
        ((960, 544), 1, 3)
    );
    // bucket_no_upscale needs enable_bucket.
    assert!(!r.enable_bucket && !r.bucket_no_upscale);
    let v = r.video.as_ref().unwrap();
    // uniform with frame_sample = 1 becomes head; target_frames defaults to [1]; an integer fps is accepted.
    assert_eq!(v.frame_extraction, FrameExtraction::Head);
    assert_eq!(
        (v.target_frames.clone(), v.max_frames, v.source_fps),
        (vec![1], 129, Some(30.0))
    );
}

fn keys_of(problems: &[Problem]) -> Vec<String> {
    problems.iter().filter_map(|p| p.key.clone()).collect()
}

#[test]
fn every_bad_key_is_reported_with_key_and_file() {
    let parsed = parse(
        r#"
seed = 1
[general]
resolution = [960, 544]
batch_siz = 2
target_frames = [1]
[[datasets]]
image_directory = "/i"
target_frames = [1, 25]
colour = "red"
batch_size = "two"
resolution = [1, 2, 3]
[[datasets]]
video_directory = "/v"
frame_extraction = "random"
multiple_target = true
max_frames = -5
"#,
    );
    let keys = keys_of(&parsed.problems);
    let expected = [
        "seed",
        "general.batch_siz",
        "general.target_frames",
        "datasets[0].target_frames",
        "datasets[0].colour",
        "datasets[0].batch_size",
        "datasets[0].resolution",
        "datasets[1].frame_extraction",
        "datasets[1].multiple_target",
        "datasets[1].max_frames",
    ];
    for key in expected {
        assert!(
            keys.iter().any(|k| k == key),
            "{key} not reported in {:#?}",
            parsed.problems
        );
    }
    assert_eq!(
        parsed.problems.len(),
        expected.len(),
        "{:#?}",
        parsed.problems
    );
    for problem in &parsed.problems {
        assert_eq!(problem.severity, Severity::Error);
        assert!(problem.to_string().ends_with(FILE), "{problem}");
    }
    let text: Vec<String> = parsed.problems.iter().map(ToString::to_string).collect();
    assert!(
        text.iter().any(|t| t.contains("did you mean `batch_size`")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|t| t.contains("frame_extraction") && t.contains("head")),
        "{text:#?}"
    );
    // The good keys survive.
    assert_eq!(
        parsed.config.general.resolution,
        Some(Resolution::WidthHeight(960, 544))
    );
    assert_eq!(parsed.config.datasets.len(), 2);
    assert_eq!(parsed.config.datasets[1].video_directory, p("/v"));
}

#[test]
fn toml_syntax_error_names_the_file() {
    let err = DatasetConfig::parse("[general\nresolution = 1", Path::new(FILE)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ConfigError::Syntax { .. }) && msg.ends_with(FILE),
        "{msg}"
    );
}

#[test]
fn written_file_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.toml");
    let c = parse_clean(VIDEO_CAPTIONS);
    c.write(&path).unwrap();
    assert_eq!(DatasetConfig::read(&path).unwrap().config, c);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("[general]") && text.contains("[[datasets]]"),
        "{text}"
    );
}

#[test]
fn the_current_folder_resolves_to_itself() {
    // A config in the current folder has an empty base; `.` there is the current folder, not an empty path.
    use crate::resolve::resolve_path;
    assert_eq!(resolve_path(Path::new(""), Path::new(".")), Path::new("."));
    assert_eq!(resolve_path(Path::new("."), Path::new(".")), Path::new("."));
    assert_eq!(
        resolve_path(Path::new(""), Path::new("clips")),
        Path::new("clips")
    );
    assert_eq!(
        resolve_path(Path::new("data"), Path::new("./clips")),
        Path::new("data/clips")
    );
    assert_eq!(
        resolve_path(Path::new("/cfg"), Path::new("/abs")),
        Path::new("/abs")
    );
}
