//! Tests of dataset config validation: every problem collected at once, warnings for what musubi-tuner
//! silently ignores, and the strict load used before training.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::{load_valid, validate};
use crate::config::*;
use crate::problem::Severity;

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
fn absurd_sizes_and_frame_counts_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("clips")).unwrap();
    let c = parse_clean(
        r#"
[general]
resolution = [100000, 100000]
[[datasets]]
video_directory = "clips"
caption_extension = ".txt"
target_frames = [100001]
[[datasets]]
video_directory = "clips"
cache_directory = "other"
caption_extension = ".txt"
resolution = [16384, 32768]
frame_extraction = "full"
max_frames = 100001
"#,
    );
    let errors: Vec<String> = validate(&c, Path::new(FILE), dir.path())
        .iter()
        .filter(|p| p.is_error())
        .map(ToString::to_string)
        .collect();
    let has = |key: &str, text: &str| errors.iter().any(|e| e.contains(key) && e.contains(text));
    assert!(
        has(
            "general.resolution",
            "100000x100000 is more than 16384 pixels"
        ),
        "{errors:#?}"
    );
    assert!(
        has(
            "datasets[0].target_frames",
            "100001 frames is more than 4093"
        ),
        "{errors:#?}"
    );
    assert!(has("datasets[1].resolution", "16384x32768"), "{errors:#?}");
    assert!(
        has("datasets[1].max_frames", "100001 is more than 4093"),
        "{errors:#?}"
    );
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
    assert!(
        !warnings.iter().any(|w| w.contains("num_repeats")),
        "{warnings:#?}"
    );
}

#[test]
fn zero_repeats_is_an_error_naming_the_key() {
    for (text, key) in [
        ("[[datasets]]\nimage_directory = \"/i\"\ncaption_extension = \".txt\"\nnum_repeats = 0\n", "datasets[0].num_repeats"),
        ("[general]\nnum_repeats = 0\n[[datasets]]\nimage_directory = \"/i\"\ncaption_extension = \".txt\"\n", "general.num_repeats"),
    ] {
        let c = parse_clean(text);
        let errors: Vec<String> = validate(&c, Path::new(FILE), Path::new("/"))
            .iter()
            .filter(|p| p.is_error() && p.key.as_deref() == Some(key))
            .map(ToString::to_string)
            .collect();
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(
            errors[0].contains("set num_repeats = 1 or more, or remove the dataset"),
            "{errors:#?}"
        );
    }
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
    let report = crate::report::check_path(&toml, &crate::ScanOptions::default()).unwrap();
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

#[test]
fn validation_datasets_are_read_checked_and_resolved_like_datasets() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    std::fs::create_dir(base.join("train")).unwrap();
    std::fs::create_dir(base.join("val")).unwrap();
    let text = r#"
[general]
resolution = [512, 512]
caption_extension = ".txt"
[[datasets]]
image_directory = "train"
cache_directory = "cache"
[[validation_datasets]]
video_directory = "val"
cache_directory = "cache"
target_frames = [1, 18]
"#;
    let toml = base.join("dataset.toml");
    std::fs::write(&toml, text).unwrap();
    let parsed = DatasetConfig::parse(text, &toml).unwrap();
    assert!(parsed.problems.is_empty(), "{:#?}", parsed.problems);
    assert_eq!(parsed.config.validation_datasets.len(), 1);
    let problems = validate(&parsed.config, &toml, base);
    let keys: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert!(
        keys.iter()
            .any(|p| p.contains("validation_datasets[0].target_frames")),
        "{keys:#?}"
    );
    assert!(
        keys.iter()
            .any(|p| p.contains("validation_datasets[0].cache_directory")
                && p.contains("also the cache directory of datasets[0]")),
        "{keys:#?}"
    );

    let fixed = text
        .replace("target_frames = [1, 18]", "target_frames = [1, 17]")
        .replace(
            "cache_directory = \"cache\"\ntarget",
            "cache_directory = \"val_cache\"\ntarget",
        );
    std::fs::write(&toml, &fixed).unwrap();
    let valid = load_valid(&toml).unwrap();
    assert_eq!(valid.datasets.len(), 1);
    assert_eq!(valid.validation_datasets.len(), 1);
    assert_eq!(
        valid.validation_datasets[0].resolution,
        (512, 512),
        "[general] applies"
    );
    assert_eq!(
        valid.validation_datasets[0].cache_directory.as_deref(),
        Some(base.join("val_cache").as_path())
    );
    assert_eq!(valid.all_datasets().count(), 2, "caching covers both");
    // Written back, the section round-trips; a config without one writes none.
    let written = toml::to_string(&valid.config).unwrap();
    assert!(written.contains("[[validation_datasets]]"), "{written}");
    let plain = toml::to_string(&parse_clean("[[datasets]]\nimage_directory = \"x\"\n")).unwrap();
    assert!(!plain.contains("validation_datasets"), "{plain}");
    // A misspelt section is named with the right spelling.
    let parsed =
        DatasetConfig::parse("[[validation_dataset]]\nimage_directory = \"x\"\n", &toml).unwrap();
    assert!(
        parsed
            .problems
            .iter()
            .any(|p| p.to_string().contains("validation_datasets")),
        "{:#?}",
        parsed.problems
    );
}
