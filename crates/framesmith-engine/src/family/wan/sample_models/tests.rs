//! A run on the tiny fixture DiT with the fixture VAE and umT5 (tokenizer beside its weights) samples a clip.

use std::path::Path;

use candle_core::{DType, Device};

use crate::family::wan::latents::{cache_latents, LatentEncoder};
use crate::family::wan::text_cache::cache_text;
use crate::prep::CacheOptions;
use crate::train::trainer::Trainer;
use framesmith_config::protocol::{LogLevel, StartRun};
use framesmith_config::run::{BaseDtype, DeviceSpec};
use framesmith_config::RunConfig;
use framesmith_data::load_valid;
use framesmith_models::wan::text_encoder::tokenizer::testkit::write_tiny_tokenizer;
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats, VaeVariant};

fn fixture(case: &str) -> std::path::PathBuf {
    framesmith_models::fixtures::wan_case(case).join("weights.safetensors")
}

/// One captioned image, cached with the fixture VAE and umT5.
fn cached_dataset(root: &Path, text_encoder: &Path) -> anyhow::Result<std::path::PathBuf> {
    let images = root.join("images");
    std::fs::create_dir_all(&images)?;
    image::RgbImage::from_fn(32, 32, |x, y| {
        image::Rgb([(x * 8) as u8, (y * 8) as u8, 90])
    })
    .save(images.join("grid.png"))?;
    std::fs::write(images.join("grid.txt"), "a blue square")?;
    let toml = root.join("dataset.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nenable_bucket = false\n\n\
         [[datasets]]\nimage_directory = \"images\"\ncache_directory = \"cache\"\n",
    )?;
    let valid = load_valid(&toml)?;
    let vae = load_vae_auto(&fixture("wan21_vae_tiny"), DType::F32, &Device::Cpu)?;
    let stats = LatentStats::official(VaeVariant::Wan21, &Device::Cpu)?;
    let encoder = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: Device::Cpu,
        dtype: DType::F32,
        tiles: None,
        image: Default::default(),
    };
    cache_latents(&valid, None, &encoder, &CacheOptions::default(), &mut ())?;
    let text = TextEncoder::load(text_encoder, None, DType::F32, &Device::Cpu)?;
    cache_text(
        &valid,
        None,
        &text,
        DType::F32,
        &CacheOptions::default(),
        &mut (),
    )?;
    Ok(toml)
}

#[test]
fn a_real_model_run_samples_through_the_vae() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models)?;
    let text_encoder = models.join("umt5.safetensors");
    std::fs::copy(fixture("umt5_tiny"), &text_encoder)?;
    write_tiny_tokenizer(&models.join("tokenizer.json"))?;
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "a red cat --w 32 --h 48 --f 5 --s 2 --l 2.0 --n a dog --d 3\n",
    )?;

    let mut config = RunConfig::default();
    config.model.dit = fixture("wan21_t2v_tiny");
    config.model.vae = fixture("wan21_vae_tiny");
    config.model.text_encoder = text_encoder;
    config.model.base_dtype = BaseDtype::F32;
    config.dataset.config = cached_dataset(dir.path(), &config.model.text_encoder)?;
    config.lora.rank = 4;
    config.lora.alpha = 4.0;
    config.training.device = DeviceSpec::Cpu;
    config.training.max_train_steps = 2;
    config.output.output_dir = dir.path().join("out");
    config.output.save_every_n_steps = Some(0);
    config.output.save_every_n_epochs = Some(0);
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_at_first = true;
    let mut logs = Vec::new();
    let request = StartRun {
        config,
        resume_from: None,
    };
    let mut trainer = Trainer::start(&request, &mut |level, line| logs.push((level, line)))?;
    assert!(
        logs.iter()
            .any(|(l, m)| *l == LogLevel::Info && m.contains("text encoder released")),
        "{logs:?}"
    );
    assert!(trainer.sample_at_start());
    let events = trainer.sample(&|| false)?;
    assert_eq!(events.len(), 1);
    let samples = dir.path().join("out").join("samples");
    assert!(samples.join("000000-00.mp4").is_file());
    let info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        samples.join("000000-00/frames.json"),
    )?)?;
    assert_eq!(
        (
            info["frames"].as_u64(),
            info["width"].as_u64(),
            info["height"].as_u64()
        ),
        (Some(5), Some(32), Some(48))
    );
    let report = trainer.train_step(&|| false)?;
    assert!(report.loss.is_some_and(f64::is_finite));
    let first_clip = std::fs::read(samples.join("000000-00.mp4"))?;
    drop(trainer);

    // A second start finds the prompt's embeddings in the output folder's cache: no encoder, the same clip.
    logs.clear();
    let mut trainer = Trainer::start(&request, &mut |level, line| logs.push((level, line)))?;
    assert!(
        logs.iter().any(
            |(_, m)| m.contains("1 sample prompts from the prompt cache")
                && m.contains("the text encoder was not loaded")
        ),
        "{logs:?}"
    );
    trainer.sample(&|| false)?;
    assert_eq!(std::fs::read(samples.join("000000-00.mp4"))?, first_clip);
    Ok(())
}

#[test]
fn a_control_image_is_refused_by_name() {
    let spec = crate::generate::prompts::parse_line("a cat --ci edit.png").expect("a line");
    let err = super::check_start_images(&[spec], None, Path::new("prompts.txt"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("--ci") && err.ends_with("edit.png"), "{err}");
}
