//! Wan2.2 TI2V-5B training on the official tiny TI2V DiT and Wan2.2 VAE: the image-to-video step (first latent
//! frame clean, timestep 0 on its tokens, out of the loss) has LoRA gradients equal to the whole-graph backward and
//! to finite differences; runs in either `training.mode` resume bit-identically; samples go text-to-video, or from
//! a start image (`--i`); and image-to-video on a text-to-video model is refused before anything loads.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::wan::denoise::{first_frame_row, with_first_frame};
use crate::family::wan::step_testkit::whole_graph_step;
use crate::family::wan::step_testkit::{
    attach_random_loras, check_every_backward_equals_whole_graph,
    check_lora_gradients_by_finite_differences, random_targets,
};
use crate::train::step::{checkpointed_step, LossTarget, StepOptions};
use crate::train::tests::{all_lora_values, try_start};
use crate::train::trainer::Trainer;
use framesmith_config::run::TrainingMode;
use framesmith_config::{presets, RunConfig};
use framesmith_data::cache::{
    text_cache_name, video_latent_cache_name, write_wan_latent_cache, write_wan_text_cache,
    LatentCacheMetadata, WanLatentCache,
};
use framesmith_data::frames::FrameWindow;
use framesmith_models::wan::random::{random_inputs, random_weights};
use framesmith_models::wan::{
    Generation, ModelOptions, ModelType, Timesteps, WanConfig, WanInputs, WanModel,
};
use framesmith_nn::init::randn;
use framesmith_nn::vb::Vb;

fn fixture(case: &str) -> PathBuf {
    framesmith_models::fixtures::wan_case(case).join("weights.safetensors")
}

/// A tiny TI2V-shaped model (48 latent channels, per-token timesteps) with random weights and random LoRAs.
fn tiny_ti2v() -> Result<(WanModel, Vec<candle_core::Var>)> {
    let cfg = WanConfig {
        generation: Generation::Wan22,
        model_type: ModelType::Ti2v,
        in_dim: 48,
        out_dim: 48,
        ..WanConfig::tiny(2)
    };
    let dev = Device::Cpu;
    let vb = Vb::from_tensors(
        random_weights(&cfg, 21, DType::F32, &dev)?,
        DType::F32,
        &dev,
    );
    let mut model = WanModel::new(&cfg, vb, &ModelOptions::default())?;
    let vars = attach_random_loras(&mut model, 22)?;
    Ok((model, vars))
}

/// Two clips of one shape (a training batch is one bucket) as the image-to-video step feeds them: noised at `t`
/// (different per clip), the first latent frame replaced by the clean one, its tokens at timestep 0; random
/// targets.
fn start_frame_batch(cfg: &WanConfig) -> Result<(WanInputs, Vec<Tensor>)> {
    let clean = random_inputs(cfg, &[[3, 4, 6], [3, 4, 6]], 23, &Device::Cpu)?;
    let rng = &mut StdRng::seed_from_u64(24);
    let mut latents = Vec::new();
    let mut rows = Vec::new();
    for (x, t) in clean.latents.iter().zip([0.8, 0.3]) {
        let noise = randn(rng, x.shape(), 0.0, 1.0, x.device())?;
        let mixed = ((x * (1.0 - t))? + (noise * t)?)?;
        latents.push(with_first_frame(&mixed, &x.narrow(1, 0, 1)?)?);
        let (c, f, h, w) = x.dims4()?;
        rows.push(first_frame_row(cfg, [c, f, h, w], t * 1000.0 + 1.0));
    }
    let inputs = WanInputs {
        latents,
        timesteps: Timesteps::PerToken(rows),
        ..clean
    };
    let targets = random_targets(&inputs, 25)?;
    Ok((inputs, targets))
}

#[test]
fn start_frame_step_gradients_equal_the_whole_graph_and_finite_differences() -> Result<()> {
    let (model, vars) = tiny_ti2v()?;
    let (inputs, targets) = start_frame_batch(model.config())?;
    let weights = [1.0, 0.6];
    let target = LossTarget {
        targets: &targets,
        weights: Some(&weights),
        skip_frames: 1,
    };
    check_every_backward_equals_whole_graph(&model, &inputs, &target, &vars)?;
    // The start frame is out of the loss: another target there changes nothing.
    let moved: Vec<Tensor> = targets
        .iter()
        .map(|t| {
            let f = t.dim(1)?;
            let first = (t.narrow(1, 0, 1)? + 5.0)?;
            Tensor::cat(&[first, t.narrow(1, 1, f - 1)?], 1)
        })
        .collect::<Result<_>>()?;
    let other = LossTarget {
        targets: &moved,
        ..target
    };
    let full = whole_graph_step(&model, &inputs, &target, &vars)?;
    let again = checkpointed_step(&model, &inputs, &other, &vars, &StepOptions::default())?;
    assert_eq!(again.loss, full.loss);
    let unweighted = LossTarget {
        weights: None,
        ..target
    };
    check_lora_gradients_by_finite_differences(&model, &inputs, &unweighted, &vars, 26)
}

/// Latent frames, height and width of the cached clips: 9 frames of 64×64 through the Wan2.2 VAE.
const LATENT: [usize; 3] = [3, 4, 4];

/// A video dataset of batch size 1 at 64×64 whose caches (TI2V's plain latent caches: 48 channels, latents only)
/// are written into `cache/`; returns the TOML.
fn ti2v_dataset(root: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(root.join("videos"))?;
    let cache = root.join("cache");
    std::fs::create_dir_all(&cache)?;
    let rng = &mut StdRng::seed_from_u64(27);
    let [f, h, w] = LATENT;
    for stem in ["a", "b"] {
        let latents = WanLatentCache {
            latents: randn(rng, (48, f, h, w), 0.0, 1.0, &Device::Cpu)?,
            latents_image: None,
            latents_control: None,
            clip: None,
            f_indices: None,
        };
        let window = FrameWindow {
            start: 0,
            frames: 9,
        };
        write_wan_latent_cache(
            &cache.join(video_latent_cache_name(stem, window, (64, 64))),
            &latents,
            &LatentCacheMetadata::wan((64, 64), Some(9)),
        )?;
        let t5 = randn(rng, (6, 32), 0.0, 1.0, &Device::Cpu)?;
        write_wan_text_cache(&cache.join(text_cache_name(stem)), &t5, stem)?;
    }
    let toml = root.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [64, 64]\ncaption_extension = \".txt\"\nbatch_size = 1\nenable_bucket = false\n\n\
         [[datasets]]\nvideo_directory = \"videos\"\ncache_directory = \"cache\"\ntarget_frames = [9]\n",
    )?;
    Ok(toml)
}

/// The demo-cpu preset on the tiny TI2V DiT and the dataset at `toml`, writing into `out`.
fn ti2v_config(out: &Path, toml: &Path, mode: TrainingMode) -> anyhow::Result<RunConfig> {
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = fixture("wan22_ti2v_tiny");
    config.dataset.synthetic = false;
    config.dataset.config = toml.to_path_buf();
    config.training.mode = mode;
    config.training.max_train_steps = 4;
    config.optimizer.lr_warmup_steps = 0;
    config.output.output_dir = out.to_path_buf();
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

/// Four steps straight, and two steps, a save, a fresh process's resume and two more: the same losses and LoRA,
/// in image-to-video mode (and text-to-video trains something else on the same data and seed).
#[test]
fn ti2v_runs_resume_bit_identically_in_either_mode() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = ti2v_dataset(dir.path())?;
    let losses = |trainer: &mut Trainer, until: usize| -> anyhow::Result<Vec<Option<f64>>> {
        let mut out = Vec::new();
        while trainer.step() < until {
            out.push(trainer.train_step(&|| false)?.loss);
        }
        Ok(out)
    };
    let i2v = ti2v_config(&dir.path().join("a"), &toml, TrainingMode::ImageToVideo)?;
    let mut straight = try_start(&i2v, None)?;
    let expected = losses(&mut straight, 4)?;
    assert!(
        expected.iter().all(|l| l.is_some_and(f64::is_finite)),
        "{expected:?}"
    );

    let i2v_b = ti2v_config(&dir.path().join("b"), &toml, TrainingMode::ImageToVideo)?;
    let mut first = try_start(&i2v_b, None)?;
    let mut resumed = losses(&mut first, 2)?;
    let saved = first.save(false)?;
    let meta = framesmith_nn::lora_file::LoraFile::load(&saved.loras[0], &Device::Cpu)?.metadata;
    assert_eq!(
        meta.get("framesmith.training_mode").map(String::as_str),
        Some("image_to_video")
    );
    assert_eq!(
        meta.get("framesmith.time_embedding").map(String::as_str),
        Some("per_token")
    );
    drop(first);
    let mut second = try_start(&i2v_b, Some(&dir.path().join("b")))?;
    assert_eq!(second.step(), 2);
    resumed.extend(losses(&mut second, 4)?);
    assert_eq!(expected, resumed);
    assert_eq!(all_lora_values(&straight)?, all_lora_values(&second)?);

    // Another mode is another run: refused on resume, and its losses differ.
    let t2v = ti2v_config(&dir.path().join("b"), &toml, TrainingMode::TextToVideo)?;
    let err = try_start(&t2v, Some(&dir.path().join("b")))
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("training.mode"), "{err}");
    let t2v = ti2v_config(&dir.path().join("c"), &toml, TrainingMode::TextToVideo)?;
    let mut text = try_start(&t2v, None)?;
    let text_losses = losses(&mut text, 4)?;
    assert!(text_losses.iter().all(|l| l.is_some_and(f64::is_finite)));
    assert_ne!(text_losses, expected);
    Ok(())
}

#[test]
fn image_to_video_on_a_text_to_video_model_is_refused_before_it_loads() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = ti2v_dataset(dir.path())?;
    let mut config = ti2v_config(&dir.path().join("out"), &toml, TrainingMode::ImageToVideo)?;
    config.model.dit = fixture("wan21_t2v_tiny");
    let err = try_start(&config, None)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.starts_with("training.mode: ") && err.contains("is a text-to-video model"),
        "{err}"
    );
    Ok(())
}

/// Samples of a TI2V run: a prompt with `--i` starts from its image, one without is text-to-video; both decode
/// with the Wan2.2 VAE, and the start image conditions the clip.
#[test]
fn ti2v_samples_go_text_to_video_or_from_a_start_image() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let toml = ti2v_dataset(root)?;
    let models = root.join("models");
    std::fs::create_dir_all(&models)?;
    let text_encoder = models.join("umt5.safetensors");
    std::fs::copy(fixture("umt5_tiny"), &text_encoder)?;
    framesmith_models::wan::text_encoder::tokenizer::testkit::write_tiny_tokenizer(
        &models.join("tokenizer.json"),
    )?;
    let mut lines = String::from("a cat --w 64 --h 64 --f 5 --s 2 --l 1.0 --d 3\n");
    for (name, tint) in [("red.png", 220u8), ("blue.png", 10)] {
        let path = root.join(name);
        image::RgbImage::from_fn(80, 60, |x, y| {
            image::Rgb([tint, (x * 3) as u8, (y * 4) as u8])
        })
        .save(&path)?;
        lines.push_str(&format!(
            "a cat --w 64 --h 64 --f 5 --s 2 --l 1.0 --d 3 --i {}\n",
            path.display()
        ));
    }
    let prompts = root.join("prompts.txt");
    std::fs::write(&prompts, lines)?;
    let mut config = ti2v_config(&root.join("run"), &toml, TrainingMode::ImageToVideo)?;
    config.model.vae = fixture("wan22_vae_tiny");
    config.model.text_encoder = text_encoder;
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_at_first = true;
    let mut trainer = try_start(&config, None)?;
    let events = trainer.sample(&|| false)?;
    assert_eq!(events.len(), 3);
    let frame = |i: usize| -> anyhow::Result<image::RgbImage> {
        let path = root.join(format!("run/samples/000000-{i:02}/frame_0000.png"));
        Ok(image::open(path)?.to_rgb8())
    };
    assert_eq!(frame(0)?.dimensions(), (64, 64));
    assert_ne!(frame(1)?, frame(2)?, "the start image conditions the clip");
    let report = trainer.train_step(&|| false)?;
    assert!(report.loss.is_some_and(f64::is_finite));
    Ok(())
}
