//! Control images found and resized as musubi-tuner does, and the errors naming the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::config::DatasetConfig;

fn dataset(toml: &str, base: &Path) -> ResolvedDataset {
    let parsed = DatasetConfig::parse(toml, &base.join("d.toml")).unwrap();
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    parsed.config.resolve(base).remove(0)
}

fn png(path: &Path, (w, h): Size) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    RgbImage::new(w, h).save(path).unwrap();
}

#[test]
fn a_control_directory_matches_stems_plain_first_then_by_number() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for name in ["a.png", "a_b.png", "c.png"] {
        png(&d.join("img").join(name), (16, 16));
    }
    for name in ["a_10.png", "a.jpg", "a_2.png", "a_b.png", "c_0.png"] {
        png(&d.join("ctl").join(name), (16, 16));
    }
    let toml = "[[datasets]]\nimage_directory = \"img\"\ncontrol_directory = \"ctl\"\ncaption_extension = \".txt\"\n";
    let ds = dataset(toml, d);
    let controls = DatasetControls::find(&ds).unwrap();
    let names = |media: &str| -> Vec<String> {
        controls
            .of(&d.join("img").join(media))
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    // `a_b` (the longer name) takes `a_b.png` before `a` could.
    assert_eq!(names("a_b.png"), ["a_b.png"]);
    assert_eq!(names("a.png"), ["a.jpg", "a_2.png", "a_10.png"]);
    assert_eq!(names("c.png"), ["c_0.png"]);
}

#[test]
fn an_item_without_its_control_image_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    png(&d.join("img/a.png"), (16, 16));
    png(&d.join("img/b.png"), (16, 16));
    png(&d.join("ctl/a.png"), (16, 16));
    let toml = "[[datasets]]\nimage_directory = \"img\"\ncontrol_directory = \"ctl\"\ncaption_extension = \".txt\"\n";
    let controls = DatasetControls::find(&dataset(toml, d)).unwrap();
    let err = controls.of(&d.join("img/b.png")).unwrap_err().to_string();
    assert!(
        err.contains("no control image for") && err.contains("b.png"),
        "{err}"
    );
    assert!(err.ends_with(&d.join("ctl").display().to_string()), "{err}");
}

#[test]
fn jsonl_controls_resolve_and_an_unreadable_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    png(&d.join("a.png"), (32, 16));
    png(&d.join("c0.png"), (64, 64));
    std::fs::write(d.join("c1.png"), b"not a png").unwrap();
    std::fs::write(
        d.join("m.jsonl"),
        r#"{"image_path": "a.png", "control_path_0": "c0.png", "control_path_1": "c1.png", "caption": "x"}"#,
    )
    .unwrap();
    let ds = dataset("[[datasets]]\nimage_jsonl_file = \"m.jsonl\"\n", d);
    let controls = DatasetControls::find(&ds).unwrap();
    let media = d.join("a.png");
    let paths = controls.of(&media).unwrap().to_vec();
    assert_eq!(paths, [d.join("c0.png"), d.join("c1.png")]);
    let err = load_controls(&ds, &media, &paths, ((32, 16), 16))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot be read") && err.ends_with("c1.png"),
        "{err}"
    );
    // The first alone loads, resized to the target's bucket.
    let images = load_controls(&ds, &media, &paths[..1], ((32, 16), 16)).unwrap();
    assert_eq!(images[0].dimensions(), (32, 16));
}

#[test]
fn control_sizes_follow_musubi_tuners_rules() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("img")).unwrap();
    let base = "[[datasets]]\nimage_directory = \"img\"\ncaption_extension = \".txt\"\n";
    let plain = dataset(base, d);
    assert_eq!(
        control_size(&plain, (1000, 500), (512, 256), 16),
        (512, 256)
    );
    let res = dataset(&format!("{base}control_resolution = [64, 64]\n"), d);
    assert_eq!(control_size(&res, (200, 100), (512, 256), 16), (80, 48));
    let keep = dataset(&format!("{base}no_resize_control = true\n"), d);
    assert_eq!(control_size(&keep, (100, 70), (512, 256), 16), (96, 64));
    let keep_max = dataset(
        &format!("{base}no_resize_control = true\nqwen_image_edit_control_resolution = [64, 64]\n"),
        d,
    );
    assert_eq!(
        control_size(&keep_max, (200, 100), (512, 256), 16),
        (80, 48)
    );
    assert_eq!(control_size(&keep_max, (40, 40), (512, 256), 16), (32, 32));
}

#[test]
fn a_control_stamp_follows_the_images_contents_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.png"), dir.path().join("b.png"));
    png(&a, (16, 16));
    RgbImage::from_pixel(16, 16, image::Rgb([9, 9, 9]))
        .save(&b)
        .unwrap();
    let media = dir.path().join("img.png");
    let stamp = |paths: &[PathBuf]| control_stamp(&media, paths).unwrap();
    let ab = stamp(&[a.clone(), b.clone()]);
    assert!(
        ab.starts_with("sha256:") && ab.split(' ').count() == 2,
        "{ab}"
    );
    assert_ne!(ab, stamp(&[b.clone(), a.clone()]));
    // Same size, same name, other pixels: another stamp.
    RgbImage::from_pixel(16, 16, image::Rgb([1, 2, 3]))
        .save(&a)
        .unwrap();
    assert_ne!(ab, stamp(&[a.clone(), b.clone()]));
    let err = control_stamp(&media, &[dir.path().join("gone.png")])
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("gone.png") && err.contains("img.png"),
        "{err}"
    );
    assert_eq!(
        read_controls(&media, &[b]).unwrap()[0].dimensions(),
        (16, 16)
    );
}
