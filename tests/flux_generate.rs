//! `framesmith generate` with FLUX.1 files: the official code's tiny fixtures (the dev DiT, the autoencoder, CLIP-L
//! and T5, each encoder with a word-level tokenizer.json beside it) write a PNG of the asked size, the same image for
//! the same seed and another for another seed; wrong files, missing encoders, a non-PNG output and Wan options are
//! refused by name before anything loads, and FLUX.1 options are refused for a Wan DiT.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod cli_support;
use std::path::{Path, PathBuf};

use cli_support::{framesmith, s};

fn flux_fixture(case: &str) -> PathBuf {
    framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors")
}

const WORDS: [&str; 6] = ["thing", "a", "red", "fox", "in", "snow"];

/// The tiny FLUX.1 files laid out as people have them: each text encoder in its folder with its tokenizer.json.
struct Files {
    dit: PathBuf,
    ae: PathBuf,
    clip_l: PathBuf,
    t5: PathBuf,
}

fn files(dir: &Path) -> Files {
    let copy = |case: &str, to: PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(flux_fixture(case), &to).unwrap();
        to
    };
    let (clip_l, t5) = framesmith_models::fixtures::flux_text_encoders(dir, &WORDS).unwrap();
    Files {
        dit: copy("flux_dit", dir.join("flux1-dev.safetensors")),
        ae: copy("flux_ae", dir.join("ae.safetensors")),
        clip_l,
        t5,
    }
}

/// `generate` with the FLUX.1 files, `out` and `extra` arguments.
fn generate(f: &Files, out: &Path, extra: &[&str]) -> (bool, String, String) {
    let base = [
        "generate",
        "--dit",
        s(&f.dit),
        "--vae",
        s(&f.ae),
        "--clip-l",
        s(&f.clip_l),
        "--t5",
        s(&f.t5),
        "--prompt",
        "a red fox in snow",
        "--steps",
        "3",
        "--device",
        "cpu",
        "--out",
        s(out),
    ];
    // The size unless `extra` gives its own.
    let mut size = Vec::new();
    for (flag, value) in [("--width", "24"), ("--height", "16")] {
        if !extra.contains(&flag) {
            size.extend([flag, value]);
        }
    }
    framesmith(&[&base[..], &size, extra].concat())
}

#[test]
fn a_flux_dev_dit_writes_a_png_of_the_asked_size_for_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let out = dir.path().join("images/fox.png");
    let (ok, stdout, stderr) = generate(&f, &out, &["--seed", "5"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stderr.contains("DiT: FLUX.1 [dev]"), "{stderr}");
    assert!(
        stderr.contains("seed 5, 24x16, 3 steps, guidance 3.5"),
        "{stderr}"
    );
    assert!(stderr.contains("denoised in"), "{stderr}");
    assert!(
        stdout.contains("wrote") && stdout.contains("(24x16)"),
        "{stdout}"
    );
    let first = image::open(&out).unwrap().to_rgb8();
    assert_eq!(first.dimensions(), (24, 16));

    let again = dir.path().join("again.png");
    let (ok, stdout, stderr) = generate(&f, &again, &["--seed", "5"]);
    assert!(ok, "{stdout}{stderr}");
    assert_eq!(image::open(&again).unwrap().to_rgb8(), first);

    let other = dir.path().join("other.png");
    let (ok, stdout, stderr) = generate(&f, &other, &["--seed", "6", "--guidance", "1"]);
    assert!(ok, "{stdout}{stderr}");
    assert_ne!(image::open(&other).unwrap().to_rgb8(), first);
}

/// `generate` with `f`, `out` and `extra` fails, and its error names each of `needles`.
fn refused(f: &Files, out: &Path, extra: &[&str], needles: &[&str]) {
    let (ok, stdout, stderr) = generate(f, out, extra);
    assert!(!ok, "{extra:?} succeeded: {stdout}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{extra:?}: no `{needle}` in {stderr}"
        );
    }
}

#[test]
fn wrong_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let out = dir.path().join("x.png");
    // The DiT given as the autoencoder, and the autoencoder as the DiT.
    let swapped = Files {
        ae: f.dit.clone(),
        ..files(&dir.path().join("b"))
    };
    refused(
        &swapped,
        &out,
        &[],
        &["--vae:", "FLUX.1 [dev]-style DiT", "ae.safetensors"],
    );
    let ae_as_dit = Files {
        dit: f.ae.clone(),
        ..files(&dir.path().join("c"))
    };
    refused(
        &ae_as_dit,
        &out,
        &[],
        &["--dit:", "autoencoder", "flux1-dev.safetensors"],
    );
    // T5 and CLIP-L swapped.
    let crossed = Files {
        t5: f.clip_l.clone(),
        ..files(&dir.path().join("d"))
    };
    refused(&crossed, &out, &[], &["--t5:", "CLIP"]);
    // Kontext by name.
    let kontext = dir.path().join("flux1-kontext-dev.safetensors");
    std::fs::copy(&f.dit, &kontext).unwrap();
    let k = Files {
        dit: kontext,
        ..files(&dir.path().join("e"))
    };
    refused(
        &k,
        &out,
        &[],
        &["Kontext", "edits an image", "--control IMAGE"],
    );
    assert!(!out.exists());
}

#[test]
fn a_kontext_dit_edits_its_control_image() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let kontext = dir.path().join("flux1-kontext-dev.safetensors");
    std::fs::copy(&f.dit, &kontext).unwrap();
    let k = Files {
        dit: kontext,
        ..files(&dir.path().join("k"))
    };
    let control = |name: &str, colour: [u8; 3]| {
        let path = dir.path().join(name);
        image::RgbImage::from_pixel(34, 20, image::Rgb(colour))
            .save(&path)
            .unwrap();
        path
    };
    let (red, blue) = (
        control("red.png", [220, 20, 20]),
        control("blue.png", [20, 20, 220]),
    );
    let edit = |control: &Path, out: &Path| {
        let (ok, stdout, stderr) = framesmith(
            &[
                &[
                    "generate",
                    "--dit",
                    s(&k.dit),
                    "--vae",
                    s(&k.ae),
                    "--clip-l",
                    s(&k.clip_l),
                    "--t5",
                    s(&k.t5),
                    "--prompt",
                    "a red fox in snow",
                    "--steps",
                    "2",
                    "--device",
                    "cpu",
                    "--seed",
                    "3",
                    "--out",
                    s(out),
                ][..],
                &["--control", s(control)],
            ]
            .concat(),
        );
        assert!(ok, "{stdout}{stderr}");
        image::open(out).unwrap().to_rgb8()
    };
    let from_red = edit(&red, &dir.path().join("r.png"));
    // The control's size rounded down to the autoencoder's 2× and the 2×2 packing.
    assert_eq!(from_red.dimensions(), (32, 20));
    assert_ne!(edit(&blue, &dir.path().join("b.png")), from_red);
    // A text-to-image DiT refuses a control image, a missing control image is named.
    let out = dir.path().join("x.png");
    refused(
        &f,
        &out,
        &["--control", s(&red)],
        &["--control is for edit models", "flux1-kontext-dev"],
    );
    let missing = dir.path().join("missing.png");
    refused(
        &k,
        &out,
        &["--control", s(&missing)],
        &["--control", "missing.png"],
    );
}

#[test]
fn wrong_options_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let out = dir.path().join("x.png");
    // Not a PNG; Wan options.
    refused(&f, &dir.path().join("x.mp4"), &[], &["--out", ".png"]);
    refused(
        &f,
        &out,
        &["--frames", "81", "--negative", "blurry"],
        &["--negative, --frames are for Wan"],
    );
    refused(
        &f,
        &out,
        &["--solver", "unipc"],
        &["--solver (FLUX.1 samples with euler) is for Wan"],
    );
    // Bad sizes: the autoencoder down-samples 2×, so sides are multiples of 4.
    refused(
        &f,
        &out,
        &["--width", "26"],
        &["--width 26", "multiples of 4"],
    );
    assert!(!out.exists());

    // Half the text encoders.
    let (ok, _, stderr) = framesmith(&[
        "generate",
        "--dit",
        s(&f.dit),
        "--vae",
        s(&f.ae),
        "--t5",
        s(&f.t5),
        "--prompt",
        "a fox",
        "--device",
        "cpu",
        "--out",
        s(&out),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("needs both of its text encoders: --clip-l"),
        "{stderr}"
    );
}

#[test]
fn flux_options_are_refused_for_a_wan_dit() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let wan = cli_support::fixture("wan21_t2v_tiny");
    let (ok, _, stderr) = framesmith(&[
        "generate",
        "--dit",
        &wan,
        "--vae",
        s(&f.ae),
        "--t5",
        s(&f.t5),
        "--prompt",
        "a fox",
        "--device",
        "cpu",
        "--out",
        s(&dir.path().join("x.mp4")),
    ]);
    assert!(!ok);
    assert!(stderr.contains("--text-encoder"), "{stderr}");
    let te = cli_support::fixture("umt5_tiny");
    let (ok, _, stderr) = framesmith(&[
        "generate",
        "--dit",
        &wan,
        "--vae",
        s(&f.ae),
        "--text-encoder",
        &te,
        "--t5",
        s(&f.t5),
        "--prompt",
        "a fox",
        "--device",
        "cpu",
        "--out",
        s(&dir.path().join("x.mp4")),
    ]);
    assert!(!ok);
    assert!(stderr.contains("--t5 is for FLUX.1 DiTs"), "{stderr}");
}
