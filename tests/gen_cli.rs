//! `framesmith cache latents|text` and `framesmith generate` end to end on the tiny fixture VAE, umT5 and DiT,
//! with a tiny tokenizer built here.

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

mod cli_support;
use cli_support::{fixture, framesmith, s, write_lora};

/// Two captioned images and one broken file, cached into `cache/`.
fn dataset(root: &Path) -> PathBuf {
    let images = root.join("images");
    std::fs::create_dir_all(&images).expect("dir");
    for (name, w, h) in [("red", 40u32, 30u32), ("blue", 32, 48)] {
        image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 6) as u8, (y * 5) as u8, 70]))
            .save(images.join(format!("{name}.png")))
            .expect("png");
        std::fs::write(
            images.join(format!("{name}.txt")),
            format!("a {name} square"),
        )
        .expect("caption");
    }
    std::fs::write(images.join("broken.png"), "not a png").expect("write");
    std::fs::write(images.join("broken.txt"), "a dog").expect("write");
    let toml = root.join("dataset.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )
    .expect("toml");
    toml
}

#[test]
fn cache_commands_write_skip_and_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = dataset(dir.path());
    let vae = fixture("wan21_vae_tiny");
    let args = [
        "cache",
        "latents",
        "--dataset",
        s(&toml),
        "--vae",
        &vae,
        "--device",
        "cpu",
    ];
    // The image that does not decode fails the command, once the others are cached.
    let (ok, stdout, stderr) = framesmith(&args);
    assert!(!ok, "{stdout}");
    assert!(
        stdout.contains("3 items: 2 cache files written, 0 already cached, 1 failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("broken.png")
            && stderr.contains("skipped")
            && stderr.contains("--skip-unreadable"),
        "{stdout}\n{stderr}"
    );
    let cache = dir.path().join("cache");
    assert!(cache.join("red_0040x0030_wan.safetensors").is_file());
    assert!(cache.join("blue_0032x0048_wan.safetensors").is_file());
    let (ok, stdout, _) = framesmith(&[&args[..], &["--skip-unreadable"]].concat());
    assert!(
        ok && stdout.contains("0 cache files written, 2 already cached"),
        "{stdout}"
    );

    let te = fixture("umt5_tiny");
    let (ok, _, stderr) = framesmith(&[
        "cache",
        "text",
        "--dataset",
        s(&toml),
        "--text-encoder",
        &te,
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("put tokenizer.json from the umT5 folder")
            && stderr.contains("--tokenizer"),
        "{stderr}"
    );
    let tokenizer = dir.path().join("tokenizer.json");
    cli_support::write_tokenizer(&tokenizer, &["a", "red", "cat", "dog", "blue", "square"]);
    let text = [
        "cache",
        "text",
        "--dataset",
        s(&toml),
        "--text-encoder",
        &te,
        "--tokenizer",
        s(&tokenizer),
    ];
    let (ok, stdout, stderr) = framesmith(&text);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("3 items: 3 cache files written"),
        "{stdout}"
    );
    assert!(cache.join("red_wan_te.safetensors").is_file());
}

/// The tiny fixture DiT, umT5 and VAE, and a tokenizer for them.
struct Models {
    dit: String,
    te: String,
    vae: String,
    tokenizer: PathBuf,
}

impl Models {
    /// The fixtures, with the tokenizer written into `dir`.
    fn new(dir: &Path) -> Models {
        let tokenizer = dir.join("tokenizer.json");
        cli_support::write_tokenizer(&tokenizer, &["a", "red", "cat", "dog", "blue", "square"]);
        Models {
            dit: fixture("wan21_t2v_tiny"),
            te: fixture("umt5_tiny"),
            vae: fixture("wan21_vae_tiny"),
            tokenizer,
        }
    }
}

/// `generate` with `m` (5 frames of 32x48, 2 steps, seed 11) into `out`, with `extra` arguments; it must succeed.
fn clip(m: &Models, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "generate",
        "--dit",
        &m.dit,
        "--text-encoder",
        &m.te,
        "--tokenizer",
        s(&m.tokenizer),
        "--vae",
        &m.vae,
        "--prompt",
        "a red cat",
        "--negative",
        "a dog",
        "--width",
        "32",
        "--height",
        "48",
        "--frames",
        "5",
        "--steps",
        "2",
        "--seed",
        "11",
        "--device",
        "cpu",
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = framesmith(&args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("5 frames"), "{stdout}");
}

/// The PNG of frame `i` that `generate` wrote beside `mp4`.
fn frame(mp4: &Path, i: usize) -> Vec<u8> {
    let stem = mp4.file_stem().and_then(|n| n.to_str()).unwrap_or_default();
    std::fs::read(
        mp4.with_file_name(format!("{stem}_frames"))
            .join(format!("frame_{i:04}.png")),
    )
    .expect("frame written")
}

#[test]
fn generate_writes_a_deterministic_clip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Models::new(dir.path());
    let lora = dir.path().join("lora.safetensors");
    write_lora(&lora);
    let (a, b, c) = (
        dir.path().join("a.mp4"),
        dir.path().join("b.mp4"),
        dir.path().join("c.mp4"),
    );
    clip(&m, &a, &[]);
    clip(&m, &b, &[]);
    let lora_arg = format!("{}:0.5", lora.display());
    clip(&m, &c, &["--lora", &lora_arg]);
    // Streamed blocks, and the same weights as two experts (one parked while the other denoises), change nothing.
    let (d, e) = (dir.path().join("d.mp4"), dir.path().join("e.mp4"));
    clip(&m, &d, &["--blocks-to-swap", "1"]);
    clip(
        &m,
        &e,
        &[
            "--dit-low-noise",
            &m.dit,
            "--boundary",
            "0.5",
            "--vram-budget-gb",
            "8",
        ],
    );
    for (other, why) in [
        (&b, "differs between runs with one seed"),
        (&d, "streaming changed it"),
        (&e, "two equal experts changed it"),
    ] {
        for i in 0..5 {
            assert_eq!(frame(&a, i), frame(other, i), "frame {i}: {why}");
        }
    }
    assert!(
        (0..5).any(|i| frame(&a, i) != frame(&c, i)),
        "the LoRA changes nothing"
    );
    if let Ok(tools) = framesmith_data::media::MediaTools::locate() {
        let info = tools.probe(&a).expect("ffprobe reads the clip");
        assert_eq!((info.width, info.height, info.frame_count), (32, 48, 5));
    }
    let (ok, _, stderr) = framesmith(&[
        "generate",
        "--dit",
        &m.dit,
        "--text-encoder",
        &m.te,
        "--tokenizer",
        s(&m.tokenizer),
        "--vae",
        &m.vae,
        "--prompt",
        "x",
        "--width",
        "40",
        "--height",
        "48",
        "--frames",
        "5",
        "--device",
        "cpu",
        "--out",
        s(&dir.path().join("bad.mp4")),
    ]);
    assert!(!ok && stderr.contains("multiples of 16"), "{stderr}");
}

/// `generate` with the tiny DiT, a text encoder and VAE that do not exist, `[frames, width, steps]`, `out` and
/// `extra` arguments fails with `expected` before it loads either of them.
fn refused_before_loading(
    dir: &Path,
    [frames, width, steps]: [&str; 3],
    out: &Path,
    extra: &[&str],
    expected: &str,
) {
    let dit = fixture("wan21_t2v_tiny");
    let missing = dir.join("missing.safetensors");
    let mut args = vec![
        "generate",
        "--dit",
        &dit,
        "--text-encoder",
        s(&missing),
        "--vae",
        s(&missing),
        "--prompt",
        "x",
        "--width",
        width,
        "--height",
        "48",
        "--frames",
        frames,
        "--steps",
        steps,
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    let (ok, _, stderr) = framesmith(&args);
    assert!(!ok && stderr.contains(expected), "{expected}: {stderr}");
    assert!(
        !stderr.contains("missing.safetensors"),
        "{expected}: {stderr}"
    );
}

#[test]
fn generate_rejects_bad_settings_before_loading_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "not a folder").expect("write");
    let out = dir.path().join("clip.mp4");
    let out_under_a_file = blocker.join("clip.mp4");
    // ([frames, width, steps], out, expected)
    let cases = [
        (
            ["6", "32", "2"],
            &out,
            "6 frames does not fit: the VAE needs 4k + 1 frames (e.g. 5)",
        ),
        (["5", "40", "2"], &out, "multiples of 16"),
        (["5", "32", "0"], &out, "0 steps sample nothing"),
        (
            ["5", "32", "2"],
            &out_under_a_file,
            "cannot create the folder for --out",
        ),
    ];
    for (sizes, out, expected) in cases {
        refused_before_loading(dir.path(), sizes, out, &[], expected);
    }
    let numbers: [(&str, &str, &str); 4] = [
        (
            "--shift",
            "-1",
            "flow shift -1 does not work: use a number above 0",
        ),
        ("--shift", "nan", "flow shift NaN does not work"),
        (
            "--guidance",
            "-2",
            "guidance scale -2 does not work: use 0 or more",
        ),
        (
            "--boundary",
            "1.5",
            "--boundary 1.5 is not a fraction of the timesteps",
        ),
    ];
    for (flag, value, expected) in numbers {
        refused_before_loading(dir.path(), ["5", "32", "2"], &out, &[flag, value], expected);
    }
}
