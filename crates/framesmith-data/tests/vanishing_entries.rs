//! Dataset entries that cannot be read — a symbolic link whose target is gone, a FIFO, a link to a device, a link
//! loop — are errors naming each file in `dataset check` and refuse caching and training (`load_valid`); the
//! caption such an entry leaves behind is reported; thousands of unreadable files print as one line per kind. With
//! `skip_unreadable` each is a counted warning instead and the entry is left out.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::symlink;
use std::path::Path;

use framesmith_data::report::check_path;
use framesmith_data::scan::ScanOptions;
use framesmith_data::{load_valid, load_valid_with, ConfigError, Unreadable};
use image::RgbImage;

fn probing() -> ScanOptions {
    ScanOptions {
        probe_media: true,
        tools: None,
        decode_check: true,
    }
}

/// A folder with one good captioned image and every kind of entry that cannot be read, each with a caption.
fn hostile_folder(d: &Path) {
    RgbImage::new(32, 32).save(d.join("good.png")).unwrap();
    for name in ["good", "gone", "pipe", "device", "loop"] {
        std::fs::write(d.join(format!("{name}.txt")), format!("{name} caption")).unwrap();
    }
    symlink(d.join("unplugged/drive.png"), d.join("gone.png")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(d.join("pipe.png"))
        .status()
        .unwrap();
    assert!(made.success());
    symlink("/dev/zero", d.join("device.png")).unwrap();
    symlink(d.join("loop.png"), d.join("loop.png")).unwrap();
}

#[test]
fn dataset_check_counts_every_entry_that_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hostile_folder(d);
    let report = check_path(d, &probing()).unwrap();
    let text: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    for (name, why) in [
        ("gone.png", "drive.png, which does not exist"),
        ("pipe.png", "is a FIFO (named pipe), not an image file"),
        (
            "device.png",
            "is a symbolic link to a character device (/dev/zero)",
        ),
        ("loop.png", "cannot be followed"),
    ] {
        assert!(
            text.iter().any(|t| t.starts_with("error: this image ")
                && t.contains(why)
                && t.contains("(its caption is left unused)")
                && t.ends_with(name)),
            "{name}: {text:#?}"
        );
    }
    assert_eq!(report.error_count(), 4, "{text:#?}");
    let summary = &report.datasets[0];
    assert_eq!(summary.media_found, 5, "{summary:?}");
    assert_eq!(summary.items, 1, "{summary:?}");
    assert_eq!(summary.left_out.unreadable, 4, "{summary:?}");
    assert_eq!(summary.unreadable.len(), 4, "{summary:?}");
    assert!(!report.is_ok());
}

#[test]
fn caching_and_training_refuse_a_dataset_with_entries_that_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let images = d.join("images");
    std::fs::create_dir(&images).unwrap();
    hostile_folder(&images);
    let toml = d.join("dataset.toml");
    std::fs::write(
        &toml,
        "[[datasets]]\nimage_directory = \"images\"\ncaption_extension = \".txt\"\n",
    )
    .unwrap();
    let err = load_valid(&toml).unwrap_err();
    let ConfigError::Invalid { problems } = &err else {
        panic!("{err}");
    };
    assert_eq!(problems.len(), 4, "{problems:#?}");
    let shown = err.to_string();
    assert!(
        shown.contains("pipe.png") && shown.contains("gone.png") && shown.contains("loop.png"),
        "{shown}"
    );
}

#[test]
fn thousands_of_unreadable_files_print_one_line_per_kind() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    RgbImage::new(32, 32).save(d.join("good.png")).unwrap();
    std::fs::write(d.join("good.txt"), "a caption").unwrap();
    let broken = 2_000;
    for i in 0..broken {
        std::fs::write(
            d.join(format!("bad{i:05}.png")),
            b"\x89PNG\r\n\x1a\nnot a png",
        )
        .unwrap();
    }
    let report = check_path(d, &probing()).unwrap();
    assert_eq!(report.error_count(), broken, "every file is still counted");
    let shown = report.to_string();
    let lines = shown.lines().count();
    assert!(lines < 20, "{lines} lines:\n{shown}");
    assert!(
        shown.contains(&format!(
            "error: {broken} unreadable images or videos; the first: "
        )),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "warning: {broken} images without a caption file, left out"
        )),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("and {} more", broken - 3)),
        "{shown}"
    );
}

#[test]
fn a_caption_without_its_media_is_a_warning_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    RgbImage::new(32, 32).save(d.join("good.png")).unwrap();
    std::fs::write(d.join("good.txt"), "a caption").unwrap();
    std::fs::write(d.join("renamed.txt"), "its clip was renamed").unwrap();
    let report = check_path(d, &probing()).unwrap();
    let text: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    let orphans: Vec<&String> = text
        .iter()
        .filter(|t| t.contains("a caption with no image or video"))
        .collect();
    assert_eq!(orphans.len(), 1, "{text:#?}");
    assert!(
        orphans[0].starts_with("warning:") && orphans[0].ends_with("renamed.txt"),
        "{text:#?}"
    );
    assert_eq!(report.error_count(), 0, "{text:#?}");
    assert_eq!(report.datasets[0].items, 1);
}

#[test]
fn skip_unreadable_makes_each_entry_a_counted_warning_and_leaves_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let images = d.join("images");
    std::fs::create_dir(&images).unwrap();
    hostile_folder(&images);
    std::fs::write(images.join("broken.png"), b"\x89PNG\r\n\x1a\nnot a png").unwrap();
    std::fs::write(images.join("broken.txt"), "a caption").unwrap();
    let toml = d.join("dataset.toml");
    std::fs::write(
        &toml,
        "[[datasets]]\nimage_directory = \"images\"\ncaption_extension = \".txt\"\n",
    )
    .unwrap();

    // Refused, each error says how to leave such entries out.
    let err = load_valid_with(&toml, Unreadable::Refuse).unwrap_err();
    assert!(err.to_string().contains("skip_unreadable = true"), "{err}");
    let valid = load_valid_with(&toml, Unreadable::Skip).unwrap();
    let skipped: Vec<String> = valid.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(skipped.len(), 4, "{skipped:#?}");
    for name in ["gone.png", "pipe.png", "device.png", "loop.png"] {
        assert!(
            skipped.iter().any(|w| w.starts_with("warning: this image ")
                && w.contains("left out (skip_unreadable)")
                && w.ends_with(name)),
            "{name}: {skipped:#?}"
        );
    }

    // dataset check: the same entries, and the image that does not decode, as warnings; the rest still counted.
    let refused = check_path(&toml, &probing())
        .unwrap()
        .with_unreadable(Unreadable::Refuse);
    assert_eq!(refused.error_count(), 5, "{refused}");
    let report = check_path(&toml, &probing())
        .unwrap()
        .with_unreadable(Unreadable::Skip);
    assert!(report.is_ok(), "{report}");
    let left_out = report
        .problems
        .iter()
        .filter(|p| p.message.ends_with("left out (skip_unreadable)"))
        .count();
    assert_eq!(left_out, 5, "{report}");
    assert_eq!(report.datasets[0].left_out.unreadable, 5, "{report}");
    assert_eq!(report.datasets[0].items, 1, "{report}");
}

#[test]
fn skipping_leaves_errors_that_are_not_about_unreadable_entries() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    RgbImage::new(32, 32).save(d.join("good.png")).unwrap();
    let lines = "{\"image_path\": 3}\n{\"image_path\": \"gone.png\", \"caption\": \"c\"}\n\
                 {\"image_path\": \"good.png\", \"caption\": \"c\"}\n";
    std::fs::write(d.join("list.jsonl"), lines).unwrap();
    let toml = d.join("dataset.toml");
    std::fs::write(
        &toml,
        "[[datasets]]\nimage_jsonl_file = \"list.jsonl\"\ncache_directory = \"cache\"\n",
    )
    .unwrap();
    let err = load_valid_with(&toml, Unreadable::Skip).unwrap_err();
    let ConfigError::Invalid { problems } = &err else {
        panic!("{err}");
    };
    // The bad line stays an error; the listed file that is gone does not.
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].message.starts_with("line 1"), "{err}");
    std::fs::write(
        d.join("list.jsonl"),
        &lines[lines.find('\n').unwrap() + 1..],
    )
    .unwrap();
    let valid = load_valid_with(&toml, Unreadable::Skip).unwrap();
    assert!(
        valid.warnings[0].to_string().contains("gone.png"),
        "{:?}",
        valid.warnings
    );
    assert!(load_valid_with(&toml, Unreadable::Refuse).is_err());
}
