//! `framesmith cache latents` / `cache text` with FLUX.1 files: the fixture's tiny autoencoder caches an image
//! dataset as `_flux` latents beside Wan caches; Wan-only flags and half a pair of text encoders are refused.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod cli_support;
use cli_support::{framesmith, s};

fn image_dataset(dir: &std::path::Path) -> std::path::PathBuf {
    let images = dir.join("images");
    std::fs::create_dir(&images).expect("mkdir");
    image::RgbImage::from_fn(24, 16, |x, y| {
        image::Rgb([(x * 9) as u8, (y * 13) as u8, 40])
    })
    .save(images.join("a.png"))
    .expect("png");
    std::fs::write(images.join("a.txt"), "a gradient").expect("write");
    let dataset = dir.join("dataset.toml");
    std::fs::write(
        &dataset,
        "[general]\nresolution = [32, 32]\nenable_bucket = true\ncaption_extension = \".txt\"\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )
    .expect("write");
    dataset
}

fn flux_fixture(case: &str) -> String {
    framesmith_models::fixtures::case_dir("flux", case)
        .join("weights.safetensors")
        .display()
        .to_string()
}

#[test]
fn cache_latents_with_flux_autoencoder_writes_flux_caches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = image_dataset(dir.path());
    let ae = flux_fixture("flux_ae");
    let args = [
        "cache",
        "latents",
        "--dataset",
        s(&dataset),
        "--vae",
        &ae,
        "--device",
        "cpu",
    ];
    let (ok, stdout, stderr) = framesmith(&args);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("autoencoder: FLUX.1, 16 latent channels"),
        "{stderr}"
    );
    assert!(stdout.contains("1 cache files written"), "{stdout}");
    let cache = dir.path().join("cache/a_0024x0016_flux.safetensors");
    let latents =
        framesmith_data::flux_cache::read_flux_latent_cache(&cache, &candle_core::Device::Cpu)
            .expect("a FLUX.1 latent cache");
    assert_eq!(latents.dims()[..2], [16, 1]);

    let (ok, _, stderr) = framesmith(&[&args[..], &["--i2v"]].concat());
    assert!(!ok);
    assert!(
        stderr.contains("--i2v, --clip and --tiled are for Wan VAEs"),
        "{stderr}"
    );
}

#[test]
fn cache_text_needs_both_flux_text_encoders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = image_dataset(dir.path());
    let t5 = flux_fixture("t5_encoder");
    let (ok, _, stderr) = framesmith(&["cache", "text", "--dataset", s(&dataset), "--t5", &t5]);
    assert!(!ok);
    assert!(stderr.contains("--clip-l"), "{stderr}");
}
