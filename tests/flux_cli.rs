//! `framesmith cache latents` / `cache text` with FLUX.1 files: the fixture's tiny autoencoder caches an image
//! dataset as `_flux` latents beside Wan caches; Wan-only flags and half a pair of text encoders are refused; and
//! `framesmith train` on a run config whose `model.dit` is the tiny FLUX.1 [dev] fixture writes a FLUX.1 LoRA.
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
    let latents = framesmith_data::family::flux::cache::read_flux_latent_cache(
        &cache,
        &candle_core::Device::Cpu,
    )
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

/// Writes the text cache of `a.png` into `dir/cache`: the tiny DiT reads 32-wide text, so the caption is cached as
/// its text encoders would give it.
fn write_text_cache(dir: &std::path::Path) {
    use candle_core::{DType, Device, Tensor};
    use framesmith_data::family::flux::cache::{
        flux_text_cache_name, write_flux_text_cache, FluxTextCache,
    };
    let text = FluxTextCache {
        t5: Tensor::ones((5, 32), DType::F32, &Device::Cpu).expect("t5"),
        clip_l_pooler: Tensor::ones(32, DType::F32, &Device::Cpu).expect("clip"),
        caption: "a gradient".into(),
    };
    write_flux_text_cache(&dir.join("cache").join(flux_text_cache_name("a")), &text)
        .expect("text cache");
}

#[test]
fn train_with_a_flux_dev_dit_writes_a_flux_lora() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = image_dataset(dir.path());
    let ae = flux_fixture("flux_ae");
    let (ok, stdout, stderr) = framesmith(&[
        "cache",
        "latents",
        "--dataset",
        s(&dataset),
        "--vae",
        &ae,
        "--device",
        "cpu",
    ]);
    assert!(ok, "{stdout}{stderr}");
    write_text_cache(dir.path());
    let dit = dir.path().join("flux1-dev.safetensors");
    std::fs::copy(flux_fixture("flux_dit"), &dit).expect("copy");
    let out = dir.path().join("out");
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\ndit = {:?}\nbase_dtype = \"f32\"\n[dataset]\nconfig = {:?}\n[lora]\nrank = 4\n\
             [training]\ndevice = \"cpu\"\nmax_train_steps = 2\ntimestep_sampling = \"flux_shift\"\n\
             [output]\noutput_dir = {:?}\noutput_name = \"flux-lora\"\n",
            s(&dit),
            s(&dataset),
            s(&out)
        ),
    )
    .expect("config");
    let (ok, stdout, stderr) = framesmith(&["train", "--config", s(&config)]);
    assert!(ok, "{stdout}{stderr}");
    let lora = framesmith_nn::lora_file::LoraFile::load(
        &out.join("flux-lora.safetensors"),
        &candle_core::Device::Cpu,
    )
    .expect("the final LoRA");
    assert!(lora.get("lora_unet_double_blocks_0_img_attn_qkv").is_some());
    assert!(lora.get("lora_unet_single_blocks_1_linear1").is_some());
    assert_eq!(
        lora.metadata.get("ss_network_module").map(String::as_str),
        Some("networks.lora_flux")
    );
}

/// A tiny FLUX.1 run config training `dataset` into `dir/out` for one step; `extra` goes under `[dataset]`.
fn one_step_flux_run(dir: &std::path::Path, dataset: &std::path::Path, extra: &str) -> String {
    let dit = dir.join("flux1-dev.safetensors");
    if !dit.exists() {
        std::fs::copy(flux_fixture("flux_dit"), &dit).expect("copy");
    }
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\ndit = {:?}\nbase_dtype = \"f32\"\n[dataset]\nconfig = {:?}\n{extra}\n[lora]\nrank = 4\n\
             [training]\ndevice = \"cpu\"\nmax_train_steps = 1\ntimestep_sampling = \"flux_shift\"\n\
             [output]\noutput_dir = {:?}\noutput_name = \"flux-lora\"\n",
            s(&dit),
            s(dataset),
            s(&dir.join("out"))
        ),
    )
    .expect("config");
    config.display().to_string()
}

/// Adds to `dir`'s images one that does not decode and a link to a drive that is not there (`gone.png`, returned).
#[cfg(unix)]
fn add_unreadable_entries(dir: &std::path::Path) -> std::path::PathBuf {
    let images = dir.join("images");
    std::fs::write(images.join("broken.png"), b"\x89PNG\r\n\x1a\nnot a png").expect("write");
    std::fs::write(images.join("broken.txt"), "a caption").expect("write");
    let gone = images.join("gone.png");
    std::os::unix::fs::symlink(dir.join("unplugged/drive.png"), &gone).expect("link");
    std::fs::write(images.join("gone.txt"), "a caption").expect("write");
    gone
}

#[cfg(unix)]
#[test]
fn unreadable_entries_stop_cache_and_train_unless_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = image_dataset(dir.path());
    let gone = add_unreadable_entries(dir.path());
    let ae = flux_fixture("flux_ae");
    let cache = |extra: &[&str]| {
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
        framesmith(&[&args[..], extra].concat())
    };
    let a_cache = dir.path().join("cache/a_0024x0016_flux.safetensors");

    // The dangling link stops the pass before anything is encoded.
    let (ok, _, stderr) = cache(&[]);
    assert!(!ok);
    assert!(
        stderr.contains("gone.png") && stderr.contains("--skip-unreadable"),
        "{stderr}"
    );
    assert!(!a_cache.exists());

    // Skipped: a warning for the link, the image that does not decode counted, the rest cached.
    let (ok, stdout, stderr) = cache(&["--skip-unreadable"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("left out (skip_unreadable)") && stderr.contains("gone.png"),
        "{stderr}"
    );
    assert!(
        stdout.contains("1 item(s) that could not be read are left out"),
        "{stdout}"
    );
    assert!(a_cache.exists());

    // Without the link, the image that does not decode fails the command once everything else is cached.
    std::fs::remove_file(&gone).expect("unlink");
    std::fs::remove_file(&a_cache).expect("rm");
    let (ok, stdout, stderr) = cache(&[]);
    assert!(!ok);
    assert!(stdout.contains("broken.png"), "{stdout}");
    assert!(
        stderr.contains("1 item(s) could not be read and have no cache"),
        "{stderr}"
    );
    assert!(
        a_cache.exists(),
        "the readable image is cached all the same"
    );

    // Training: the link refuses the run unless the run config skips it.
    std::os::unix::fs::symlink(dir.path().join("unplugged/drive.png"), &gone).expect("link");
    write_text_cache(dir.path());
    let config = one_step_flux_run(dir.path(), &dataset, "");
    let (ok, _, stderr) = framesmith(&["train", "--config", &config]);
    assert!(!ok);
    assert!(
        stderr.contains("gone.png") && stderr.contains("skip_unreadable = true"),
        "{stderr}"
    );
    let config = one_step_flux_run(dir.path(), &dataset, "skip_unreadable = true");
    let (ok, stdout, stderr) = framesmith(&["train", "--config", &config]);
    assert!(ok, "{stdout}{stderr}");
    let log = format!("{stdout}{stderr}");
    assert!(
        log.contains("left out (skip_unreadable)") && log.contains("gone.png"),
        "{log}"
    );
    assert!(dir.path().join("out/flux-lora.safetensors").exists());
}
