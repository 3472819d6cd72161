//! Tests of dataset config validation: every problem collected at once, warnings for what musubi-tuner
//! silently ignores, and the strict load used before training.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::config::*;
use super::problem::Severity;
use super::validate::{load_valid, validate};

const FILE: &str = "/cfg/dataset.toml";

fn parse_clean(text: &str) -> DatasetConfig {
    let parsed = DatasetConfig::parse(text, Path::new(FILE)).unwrap();
    assert!(parsed.problems.is_empty(), "{:#?}", parsed.problems);
    parsed.config
}

#[test]
fn validation_collects_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    std::fs::create_dir(base.join("clips")).unwrap();
    std::fs::write(base.join("list.jsonl"), "").unwrap();
    let c = parse_clean(
        r#"
[general]
resolution = [960, 540]
[[datasets]]
video_directory = "clips"
caption_extension = ".txt"
target_frames = [1, 27, 0]
frame_extraction = "slide"
frame_stride = 0
source_fps = -1.0
[[datasets]]
image_directory = "missing_images"
batch_size = 0
[[datasets]]
video_jsonl_file = "list.jsonl"
target_frames = [5]
[[datasets]]
image_directory = "clips"
image_jsonl_file = "list.jsonl"
caption_extension = ".txt"
cache_directory = "clips"
"#,
    );
    let problems = validate(&c, Path::new(FILE), base);
    let errors: Vec<String> = problems
        .iter()
        .filter(|p| p.is_error())
        .map(ToString::to_string)
        .collect();
    let has = |key: &str, text: &str| errors.iter().any(|e| e.contains(key) && e.contains(text));
    assert!(has("general.resolution", "multiple of 16"), "{errors:#?}");
    assert!(
        has("datasets[0].target_frames", "27 is not N*4+1"),
        "{errors:#?}"
    );
    assert!(
        has("datasets[0].target_frames", "use 25 or 29"),
        "{errors:#?}"
    );
    assert!(
        has("datasets[0].target_frames", "0 is not a clip length"),
        "{errors:#?}"
    );
    assert!(has("datasets[0].frame_stride", "at least 1"), "{errors:#?}");
    assert!(
        has("datasets[0].source_fps", "not a positive frame rate"),
        "{errors:#?}"
    );
    assert!(
        has("datasets[1].image_directory", "does not exist"),
        "{errors:#?}"
    );
    assert!(has("datasets[1].batch_size", "at least 1"), "{errors:#?}");
    assert!(
        has("datasets[1].caption_extension", "is not set"),
        "{errors:#?}"
    );
    assert!(
        has("datasets[2].cache_directory", "required"),
        "{errors:#?}"
    );
    assert!(
        has("datasets[3].image_directory", "set only one source"),
        "{errors:#?}"
    );
    assert!(
        has(
            "datasets[3].cache_directory",
            "also the cache directory of datasets[0]"
        ),
        "{errors:#?}"
    );
    assert_eq!(errors.len(), 11, "{errors:#?}");
    assert!(errors.iter().all(|e| e.ends_with(FILE)));
}

#[test]
fn warnings_for_what_musubi_ignores() {
    let c = parse_clean(
        r#"
[[datasets]]
video_directory = "/v"
caption_extension = "txt"
frame_extraction = "chunk"
target_frames = [1, 5]
max_frames = 9
num_repeats = 0
"#,
    );
    let problems = validate(&c, Path::new(FILE), Path::new("/"));
    let warnings: Vec<String> = problems
        .iter()
        .filter(|p| p.severity == Severity::Warning)
        .map(ToString::to_string)
        .collect();
    let has = |key: &str, text: &str| warnings.iter().any(|e| e.contains(key) && e.contains(text));
    assert!(has("caption_extension", "leading dot"), "{warnings:#?}");
    assert!(has("target_frames", "chunk"), "{warnings:#?}");
    assert!(has("max_frames", "\"full\""), "{warnings:#?}");
    assert!(has("num_repeats", "left out"), "{warnings:#?}");
}

#[test]
fn empty_config_is_an_error() {
    let c = parse_clean("");
    let problems = validate(&c, Path::new(FILE), Path::new("/"));
    let keys: Vec<_> = problems.iter().map(|p| p.key.as_deref()).collect();
    assert_eq!(keys, vec![Some("datasets")]);
}

#[test]
fn load_valid_lists_every_error_or_gives_resolved_datasets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("clips")).unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[datasets]]\nvideo_directory = \"clips\"\ntarget_frames = [24]\nfoo = 1\n",
    )
    .unwrap();
    let err = load_valid(&bad).unwrap_err();
    let ConfigError::Invalid { problems } = &err else {
        panic!("{err}")
    };
    assert_eq!(problems.len(), 3, "{problems:#?}");
    let msg = err.to_string();
    assert!(
        msg.contains("datasets[0].foo") && msg.contains("24 is not N*4+1"),
        "{msg}"
    );
    assert!(msg.contains("datasets[0].caption_extension"), "{msg}");

    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[general]\ncaption_extension = \".txt\"\n[[datasets]]\nvideo_directory = \"clips\"\n",
    )
    .unwrap();
    let valid = load_valid(&good).unwrap();
    assert_eq!(
        valid.datasets[0].source,
        DatasetSource::VideoDirectory(dir.path().join("clips"))
    );
    // target_frames not set: a warning, not an error.
    assert_eq!(valid.warnings.len(), 1, "{:#?}", valid.warnings);
}

#[test]
fn a_badly_typed_key_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("clips")).unwrap();
    let toml = dir.path().join("dataset.toml");
    std::fs::write(
        &toml,
        "[general]\ncaption_extension = 7\n[[datasets]]\nvideo_directory = \"clips\"\ntarget_frames = \"17\"\n",
    )
    .unwrap();
    let report = super::report::check_path(&toml, &super::ScanOptions::default()).unwrap();
    let text: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    let about = |key: &str| text.iter().filter(|t| t.contains(key)).count();
    assert_eq!(about("target_frames"), 1, "{text:#?}");
    assert_eq!(about("caption_extension"), 1, "{text:#?}");
    assert!(
        text.iter()
            .any(|t| t.contains("write it as target_frames = [17]") && t.ends_with("dataset.toml")),
        "{text:#?}"
    );
    let err = load_valid(&toml).unwrap_err().to_string();
    assert!(err.contains("has 2 error(s)"), "{err}");
}
