//! FLUX.1 Kontext [dev] edit LoRAs on the CPU with the tiny fixtures: a dataset with a control image per item
//! (`control_directory`) caches the control's latents beside the target's under musubi-tuner's Kontext key, a
//! Kontext batch appends the control tokens with ids axis 0 = 1 and learns on the target's tokens only, a run
//! config with the Kontext DiT trains, and a DiT and caches that do not go together are refused by name.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::flux::prep::{cache_flux_latents, FluxLatentEncoder};
use crate::family::flux::run::tests::dit;
use crate::family::flux::train::{flux_batch, load_flux_items};
use crate::prep::CacheOptions;
use crate::train::data::TrainItem;
use crate::train::optimizer::AdamW;
use crate::train::step::{try_checkpointed_step, LossTarget, StepOptions};
use crate::train::tests::try_start;
use crate::train::timesteps::TimestepDraw;
use framesmith_config::run::{Checkpointing, TimestepSampling};
use framesmith_config::{presets, RunConfig};
use framesmith_data::family::flux::cache::{
    flux_text_cache_name, write_flux_text_cache, FluxTextCache,
};
use framesmith_data::tensor_file::read_tensor_file;
use framesmith_data::Unreadable;
use framesmith_models::flux::autoencoder::{AutoEncoder, AutoEncoderConfig};
use framesmith_models::flux::weights::FluxVariant;
use framesmith_models::flux::{Flux, FluxConfig};
use framesmith_nn::init::randn;
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSpec};
use framesmith_nn::vb::Vb;

/// The fixture case's config `init` and its weights.
fn fixture(case: &str) -> anyhow::Result<(String, Vb)> {
    let dir = framesmith_models::fixtures::case_dir("flux", case);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let weights = candle_core::safetensors::load(dir.join("weights.safetensors"), &Device::Cpu)?;
    Ok((
        json["init"].to_string(),
        Vb::from_tensors(weights, DType::F32, &Device::Cpu),
    ))
}

/// Three 16×16 images, each with a control image of another colour (`ctl/{stem}.png`), and their captions cached
/// as random T5 / CLIP-L outputs of the tiny DiT's widths; the latents cached through the tiny autoencoder when
/// `latents`. Returns the dataset TOML.
pub(crate) fn kontext_dataset(dir: &Path, latents: bool) -> anyhow::Result<PathBuf> {
    let (images, ctl, cache) = (dir.join("images"), dir.join("ctl"), dir.join("cache"));
    for d in [&images, &ctl, &cache] {
        std::fs::create_dir_all(d)?;
    }
    let (init, _) = fixture("flux_dit")?;
    let cfg = FluxConfig::from_json(&init)?;
    let rng = &mut StdRng::seed_from_u64(5);
    for (i, stem) in ["a", "b", "c"].into_iter().enumerate() {
        let v = 60 * i as u8;
        image::RgbImage::from_pixel(16, 16, image::Rgb([200, v, 30]))
            .save(images.join(format!("{stem}.png")))?;
        image::RgbImage::from_fn(16, 16, |x, _| image::Rgb([(x * 16) as u8, 255 - v, 90]))
            .save(ctl.join(format!("{stem}.png")))?;
        std::fs::write(images.join(format!("{stem}.txt")), "make it red")?;
        let text = FluxTextCache {
            t5: randn(rng, (5, cfg.context_in_dim), 0.0, 1.0, &Device::Cpu)?,
            clip_l_pooler: randn(rng, cfg.vec_in_dim, 0.0, 1.0, &Device::Cpu)?,
            caption: "make it red".into(),
        };
        write_flux_text_cache(&cache.join(flux_text_cache_name(stem)), &text)?;
    }
    let toml = dir.join("data.toml");
    std::fs::write(
        &toml,
        "[general]\nresolution = [16, 16]\ncaption_extension = \".txt\"\n\
         [[datasets]]\nimage_directory = \"images\"\ncontrol_directory = \"ctl\"\ncache_directory = \"cache\"\n\
         batch_size = 3\n",
    )?;
    if latents {
        let (init, vb) = fixture("flux_ae")?;
        let ae = AutoEncoder::new(&AutoEncoderConfig::from_json(&init)?, &vb)?;
        let encoder = FluxLatentEncoder {
            ae: &ae,
            device: Device::Cpu,
            dtype: DType::F32,
        };
        let valid = framesmith_data::load_valid(&toml)?;
        let summary = cache_flux_latents(&valid, &encoder, &CacheOptions::default(), &mut ())?;
        anyhow::ensure!(summary.written == 3, "{summary:?}");
    }
    Ok(toml)
}

/// The tiny DiT with a LoRA trained 12 steps on one fixed batch (the same noise each step), and each step's loss.
fn fixed_batch_losses(
    (cfg, vb): (&FluxConfig, Vb),
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
) -> anyhow::Result<(Flux, Vec<f32>)> {
    let mut model = Flux::new(cfg, &vb)?;
    let spec = LoraSpec {
        rank: 4,
        alpha: 4.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 3,
        kind: Default::default(),
    };
    let loras = attach_family_loras(model.linears_mut(), &spec, LoraFamily::Flux)?;
    let mut optimizer = AdamW::new(crate::train::setup::named_vars(&loras), Default::default())?;
    let mut losses = Vec::new();
    for _ in 0..12 {
        let b = flux_batch(batch, draws, &mut StepRng::seeded(9), DType::F32)?;
        let target = LossTarget {
            targets: &b.targets,
            weights: None,
            skip_frames: 0,
        };
        let out = try_checkpointed_step(
            &model,
            &b.inputs,
            &target,
            &loras.vars(),
            &StepOptions::default(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        optimizer.step(&out.grads, 1e-2)?;
        losses.push(out.loss);
    }
    Ok((model, losses))
}

/// The loss of `item` at `draw` under `model`, forward only (the noise of seed 9).
fn item_loss(model: &Flux, item: &TrainItem, draw: &TimestepDraw) -> anyhow::Result<f32> {
    let b = flux_batch(
        &[item],
        std::slice::from_ref(draw),
        &mut StepRng::seeded(9),
        DType::F32,
    )?;
    let target = LossTarget {
        targets: &b.targets,
        weights: None,
        skip_frames: 0,
    };
    crate::train::step::forward_loss(model, &b.inputs, &target, None)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

#[test]
fn a_kontext_batch_appends_the_control_tokens_and_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = kontext_dataset(dir.path(), true)?;
    let file = read_tensor_file(
        &dir.path().join("cache/a_0016x0016_flux.safetensors"),
        &Device::Cpu,
    )?;
    assert!(
        file.tensors.contains_key("latents_control_1x8x8_float32"),
        "{:?}",
        file.tensors.keys()
    );

    let (init, vb) = fixture("flux_dit")?;
    let cfg = FluxConfig::from_json(&init)?;
    let loaded = load_flux_items(
        (&toml, Unreadable::Refuse),
        (&cfg, FluxVariant::Kontext),
        &Device::Cpu,
    )?;
    let batch: Vec<_> = loaded.items.iter().map(|(i, _)| i).collect();
    let draws = vec![
        TimestepDraw {
            t: 0.6,
            model_timestep: 601.0
        };
        batch.len()
    ];
    let b = flux_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32)?;
    assert_eq!(
        b.inputs.img.dims(),
        &[3, 32, 64],
        "16 target then 16 control tokens"
    );
    let axis0 = b
        .inputs
        .img_ids
        .get(0)?
        .narrow(1, 0, 1)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    assert_eq!(axis0, [vec![0.0; 16], vec![1.0; 16]].concat());
    assert_eq!(
        b.targets[0].dims(),
        &[16, 64],
        "the loss covers the target only"
    );

    let (model, losses) = fixed_batch_losses((&cfg, vb), &batch, &draws)?;
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[11] < 0.9 * losses[0], "the loss falls: {losses:?}");

    // The control tokens reach the prediction: another control image, another loss.
    let mut other = batch[0].clone();
    other.control = vec![(&other.control[0] * -1.0)?];
    assert_ne!(
        item_loss(&model, batch[0], &draws[0])?,
        item_loss(&model, &other, &draws[0])?
    );
    Ok(())
}

/// A `steps`-long run of the DiT `case` copied as `name` on the Kontext dataset in `dir`.
fn config(dir: &Path, (case, name): (&str, &str), steps: usize) -> anyhow::Result<RunConfig> {
    let toml = kontext_dataset(dir, true)?;
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = dit(dir, case, name)?;
    config.dataset.synthetic = false;
    config.dataset.config = toml;
    config.lora.rank = 4;
    config.lora.alpha = 4.0;
    config.training.max_train_steps = steps;
    config.training.timestep_sampling = TimestepSampling::FluxShift;
    config.optimizer.lr_warmup_steps = 0;
    config.memory.checkpointing = Checkpointing::Blocks;
    config.output.output_dir = dir.join("run");
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

#[test]
fn a_kontext_run_trains_and_mismatched_dits_and_caches_are_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let kontext = config(
        &dir.path().join("k"),
        ("flux_dit", "flux1-kontext-dev.safetensors"),
        2,
    )?;
    let mut run = try_start(&kontext, None)?;
    while run.step() < 2 {
        let loss = run.train_step(&|| false)?.loss;
        assert!(loss.is_some_and(|l| l.is_finite() && l > 0.0), "{loss:?}");
    }
    // The output folder is free again for the start below.
    drop(run);

    let dev = config(
        &dir.path().join("d"),
        ("flux_dit", "flux1-dev.safetensors"),
        2,
    )?;
    let err = try_start(&dev, None)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("flux1-kontext-dev.safetensors") && err.contains("control images"),
        "{err}"
    );

    // Kontext on caches without control latents.
    let cache = dir.path().join("k/cache");
    for entry in std::fs::read_dir(&cache)? {
        let path = entry?.path();
        if path
            .to_string_lossy()
            .ends_with("0016x0016_flux.safetensors")
        {
            let latents = Tensor::zeros((16, 1, 8, 8), DType::F32, &Device::Cpu)?;
            framesmith_data::family::flux::cache::write_flux_latent_cache(
                &path,
                &latents,
                (16, 16),
            )?;
        }
    }
    let err = try_start(&kontext, None)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("FLUX.1 Kontext [dev]") && err.contains("cached without one"),
        "{err}"
    );
    Ok(())
}
