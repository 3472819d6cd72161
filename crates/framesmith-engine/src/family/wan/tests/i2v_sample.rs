//! Samples during image-to-video training: each prompt's start image (`--i`) conditions its clip as `framesmith
//! generate --image` does, and what they need is checked when the run starts.

use crate::family::wan::tests::i2v::{dataset, run_config, write_musubi_caches, MusubiItem};
use crate::train::trainer::Trainer;
use candle_core::{DType, Device};
use framesmith_config::protocol::StartRun;
use framesmith_config::run::Checkpointing;
use framesmith_models::wan::random::random_weights;
use framesmith_models::wan::{Generation, ModelType, WanConfig};

/// Samples of image-to-video models start from the prompt's image: a prompt without `--i`, or Wan2.1 I2V without
/// `model.clip`, is refused when the run starts, before any model loads.
#[test]
fn i2v_samples_need_a_start_image_and_for_wan21_the_clip_encoder() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path())?;
    let start = dir.path().join("start.png");
    image::RgbImage::from_fn(40, 30, |x, y| {
        image::Rgb([(x * 6) as u8, (y * 8) as u8, 50])
    })
    .save(&start)?;
    let error = |line: &str| -> anyhow::Result<String> {
        let prompts = dir.path().join("prompts.txt");
        std::fs::write(&prompts, line)?;
        let mut config = run_config(dir.path(), &toml, Checkpointing::Blocks)?;
        config.sampling.prompts = Some(prompts);
        config.sampling.sample_every_n_steps = Some(1);
        let fixture =
            |case| framesmith_models::fixtures::wan_case(case).join("weights.safetensors");
        config.model.vae = fixture("wan21_vae_tiny");
        config.model.text_encoder = fixture("umt5_tiny");
        let request = StartRun {
            config,
            resume_from: None,
        };
        Ok(Trainer::start(&request, &mut |_, _| {})
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default())
    };
    let err = error("a red cat --w 32 --h 32 --f 5 --s 2\n")?;
    assert!(
        err.contains("sample prompt \"a red cat\"") && err.contains("add --i"),
        "{err}"
    );
    let err = error(&format!(
        "a red cat --w 32 --h 32 --f 5 --s 2 --i {}\n",
        start.display()
    ))?;
    assert!(err.contains("set model.clip"), "{err}");
    Ok(())
}

/// A Wan2.2 I2V-A14B-shaped run (no CLIP) samples each prompt from its start image, conditioned as `generate
/// --image` conditions it: two prompts alike but for the image give different clips.
#[test]
fn wan22_i2v_samples_start_from_the_prompts_image() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let cfg = WanConfig {
        generation: Generation::Wan22,
        model_type: ModelType::I2v,
        in_dim: 36,
        ..WanConfig::tiny(2)
    };
    let dit = root.join("dit.safetensors");
    candle_core::safetensors::save(&random_weights(&cfg, 8, DType::F32, &Device::Cpu)?, &dit)?;
    let models = root.join("models");
    std::fs::create_dir_all(&models)?;
    let text_encoder = models.join("umt5.safetensors");
    std::fs::copy(
        framesmith_models::fixtures::wan_case("umt5_tiny").join("weights.safetensors"),
        &text_encoder,
    )?;
    framesmith_models::wan::text_encoder::tokenizer::testkit::write_tiny_tokenizer(
        &models.join("tokenizer.json"),
    )?;
    let toml = dataset(root)?;
    for (stem, seed) in [("a", 1), ("b", 2)] {
        let item = MusubiItem {
            stem,
            seed,
            image: true,
            clip_dim: None,
        };
        write_musubi_caches(&root.join("cache"), &item, 32)?;
    }
    let mut lines = String::new();
    for (name, tint) in [("red.png", 200u8), ("blue.png", 20)] {
        let path = root.join(name);
        image::RgbImage::from_fn(40, 30, |x, y| {
            image::Rgb([tint, (x * 6) as u8, (y * 8) as u8])
        })
        .save(&path)?;
        lines.push_str(&format!(
            "a cat --w 32 --h 32 --f 5 --s 2 --l 1.0 --d 3 --i {}\n",
            path.display()
        ));
    }
    let prompts = root.join("prompts.txt");
    std::fs::write(&prompts, lines)?;
    let mut config = run_config(root, &toml, Checkpointing::Blocks)?;
    config.model.dit = dit;
    config.model.vae =
        framesmith_models::fixtures::wan_case("wan21_vae_tiny").join("weights.safetensors");
    config.model.text_encoder = text_encoder;
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_at_first = true;
    let request = StartRun {
        config,
        resume_from: None,
    };
    let mut trainer = Trainer::start(&request, &mut |_, _| {})?;
    let events = trainer.sample(&|| false)?;
    assert_eq!(events.len(), 2);
    let frames = |i: usize| -> anyhow::Result<Vec<u8>> {
        Ok(std::fs::read(root.join(format!(
            "run/samples/000000-{i:02}/frame_0000.png"
        )))?)
    };
    assert_ne!(
        frames(0)?,
        frames(1)?,
        "the start image conditions the clip"
    );
    let report = trainer.train_step(&|| false)?;
    assert!(report.loss.is_some_and(f64::is_finite));
    Ok(())
}
