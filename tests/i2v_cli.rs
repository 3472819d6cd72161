//! `framesmith generate --image` end to end: a TI2V-5B clip from the tiny fixture DiT, VAE and umT5 (the image
//! changes the clip, one image and seed give one clip), and every wrong combination of model, image and CLIP
//! file refused with a message that names the fix.

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

mod cli_support;
use cli_support::{fixture, framesmith, s};

fn write_picture(path: &Path, tint: u8) {
    image::RgbImage::from_fn(90, 50, |x, y| {
        image::Rgb([(x * 2) as u8 ^ tint, (y * 5) as u8, tint])
    })
    .save(path)
    .expect("picture saved");
}

struct Setup {
    dir: tempfile::TempDir,
    tokenizer: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokenizer = dir.path().join("tokenizer.json");
    cli_support::write_tokenizer(&tokenizer, &["a", "red", "cat"]);
    Setup { dir, tokenizer }
}

/// `generate` with the tiny umT5 and the given DiT, VAE and extra arguments.
fn generate(setup: &Setup, dit: &str, vae: &str, out: &str, extra: &[&str]) -> (bool, String) {
    let te = fixture("umt5_tiny");
    let mut args = vec![
        "generate",
        "--dit",
        dit,
        "--text-encoder",
        &te,
        "--tokenizer",
        s(&setup.tokenizer),
        "--vae",
        vae,
        "--prompt",
        "a red cat",
        "--width",
        "64",
        "--height",
        "32",
        "--frames",
        "5",
        "--steps",
        "2",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = framesmith(&args);
    (ok, format!("{stdout}{stderr}"))
}

#[test]
fn ti2v_clips_follow_the_start_image() {
    let setup = setup();
    let root = setup.dir.path();
    let (img_a, img_b) = (root.join("a.png"), root.join("b.jpg"));
    write_picture(&img_a, 10);
    write_picture(&img_b, 200);
    let (dit, vae) = (fixture("wan22_ti2v_tiny"), fixture("wan22_vae_tiny"));
    let run = |name: &str, image: &Path| {
        let out = root.join(name);
        let (ok, log) = generate(&setup, &dit, &vae, s(&out), &["--image", s(image)]);
        assert!(ok, "{log}");
        assert!(
            log.contains("from the start image") && log.contains("5 frames"),
            "{log}"
        );
        std::fs::read(root.join(format!("{}_frames/frame_0000.png", &name[..1]))).expect("frame")
    };
    let a = run("a.mp4", &img_a);
    assert_eq!(a, run("c.mp4", &img_a), "one image and seed, one clip");
    assert_ne!(a, run("b.mp4", &img_b), "another image, another clip");
}

#[test]
fn wrong_image_and_model_combinations_name_the_fix() {
    let setup = setup();
    let root = setup.dir.path();
    let picture = root.join("p.png");
    write_picture(&picture, 1);
    let out = root.join("x.mp4");
    let (i2v, t2v, vae) = (
        fixture("wan21_i2v_tiny"),
        fixture("wan21_t2v_tiny"),
        fixture("wan21_vae_tiny"),
    );
    let expect = |dit: &str, extra: &[&str], wanted: &[&str]| {
        let (ok, log) = generate(&setup, dit, &vae, s(&out), extra);
        assert!(!ok, "should fail: {extra:?}");
        for w in wanted {
            assert!(log.contains(w), "{w:?} missing from: {log}");
        }
    };
    expect(
        &t2v,
        &["--image", s(&picture)],
        &["takes no start image", "drop --image"],
    );
    expect(&i2v, &[], &["needs a start image", "--image PATH"]);
    expect(
        &i2v,
        &["--image", s(&picture)],
        &["CLIP image encoder", "--clip"],
    );
    let missing = root.join("missing.png");
    expect(
        &i2v,
        &["--image", s(&missing), "--clip", &vae],
        &["start image not found", "missing.png"],
    );
    let junk = root.join("junk.jpg");
    std::fs::write(&junk, "not a picture").expect("write");
    expect(
        &i2v,
        &["--image", s(&junk), "--clip", &vae],
        &["cannot read the start image", "junk.jpg"],
    );
    // A VAE file given as the CLIP encoder: found out when it is loaded.
    expect(
        &i2v,
        &["--image", s(&picture), "--clip", &vae],
        &[
            "this is a VAE, not the CLIP image encoder",
            "clip_vision_h",
            "wan21_vae_tiny",
        ],
    );
    // A CLIP file of another size (the tiny parity fixture is not a ViT-H/14).
    let tiny_clip =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/clip_tiny/weights.safetensors");
    expect(
        &i2v,
        &["--image", s(&picture), "--clip", s(&tiny_clip)],
        &[
            "do not fit the CLIP image encoder",
            "expected [1280, 3, 14, 14]",
            "clip_tiny",
        ],
    );
    assert!(!out.exists(), "no clip is written on errors");
}

/// `cache latents` for image-to-video models: `--i2v` (musubi-tuner's flag) adds `latents_image` to each cache,
/// an I2V `--dit` asks for what it needs, and a flag the DiT contradicts is refused with the fix.
#[test]
fn cache_latents_writes_image_latents_for_i2v_models_and_names_what_is_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let images = root.join("images");
    std::fs::create_dir(&images).expect("mkdir");
    write_picture(&images.join("a.png"), 7);
    std::fs::write(images.join("a.txt"), "a red cat").expect("caption");
    let dataset = root.join("dataset.toml");
    std::fs::write(
        &dataset,
        "[general]\nresolution = [32, 32]\nenable_bucket = false\ncaption_extension = \".txt\"\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )
    .expect("dataset");
    let (i2v, t2v, vae) = (
        fixture("wan21_i2v_tiny"),
        fixture("wan21_t2v_tiny"),
        fixture("wan21_vae_tiny"),
    );
    let cache = |extra: &[&str]| {
        let mut args = vec![
            "cache",
            "latents",
            "--dataset",
            s(&dataset),
            "--vae",
            &vae,
            "--device",
            "cpu",
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = framesmith(&args);
        (ok, format!("{stdout}{stderr}"))
    };
    let (ok, log) = cache(&["--dit", &i2v]);
    assert!(
        !ok && log.contains("takes CLIP image features") && log.contains("--clip"),
        "{log}"
    );
    let (ok, log) = cache(&["--dit", &t2v, "--i2v"]);
    assert!(
        !ok && log.contains("not an image-to-video model") && log.contains("drop --i2v"),
        "{log}"
    );
    let (ok, log) = cache(&["--dit", &i2v, "--clip", &vae]);
    assert!(
        !ok && log.contains("this is a VAE, not the CLIP image encoder"),
        "{log}"
    );

    let (ok, log) = cache(&["--i2v"]);
    assert!(ok && log.contains("first frame's conditioning"), "{log}");
    let file = root.join("cache/a_0090x0050_wan.safetensors");
    let (cached, _) =
        framesmith_data::cache::read_wan_latent_cache(&file, &candle_core::Device::Cpu)
            .expect("cache read back");
    assert_eq!(cached.latents.dims(), &[16, 1, 4, 4]);
    assert_eq!(
        cached.latents_image.expect("image latents").dims(),
        &[20, 1, 4, 4]
    );
    assert!(cached.clip.is_none());
}

/// `cache latents --dit` for TI2V-5B: the Wan2.1 VAE is refused with the VAE to use, and the Wan2.2 VAE writes
/// plain 48-channel latent caches (`--i2v` is noted as unused: the first latent frame is the conditioning).
#[test]
fn cache_latents_for_ti2v_takes_the_wan22_vae_and_writes_plain_latents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let images = root.join("images");
    std::fs::create_dir(&images).expect("mkdir");
    write_picture(&images.join("a.png"), 7);
    std::fs::write(images.join("a.txt"), "a red cat").expect("caption");
    let dataset = root.join("dataset.toml");
    std::fs::write(
        &dataset,
        "[general]\nresolution = [32, 32]\nenable_bucket = false\ncaption_extension = \".txt\"\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )
    .expect("dataset");
    let dit = fixture("wan22_ti2v_tiny");
    let cache = |vae: &str, extra: &[&str]| {
        let mut args = vec![
            "cache",
            "latents",
            "--dataset",
            s(&dataset),
            "--vae",
            vae,
            "--dit",
            &dit,
            "--device",
            "cpu",
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = framesmith(&args);
        (ok, format!("{stdout}{stderr}"))
    };
    let (ok, log) = cache(&fixture("wan21_vae_tiny"), &[]);
    assert!(
        !ok && log.contains("16-channel latents") && log.contains("Wan2.2_VAE.pth"),
        "{log}"
    );
    let (ok, log) = cache(&fixture("wan22_vae_tiny"), &["--i2v"]);
    assert!(ok && log.contains("--i2v and --clip are not used"), "{log}");
    let file = root.join("cache/a_0090x0050_wan.safetensors");
    let (cached, _) =
        framesmith_data::cache::read_wan_latent_cache(&file, &candle_core::Device::Cpu)
            .expect("cache read back");
    assert_eq!(cached.latents.dims(), &[48, 1, 2, 2]);
    assert!(cached.latents_image.is_none() && cached.clip.is_none());
}
