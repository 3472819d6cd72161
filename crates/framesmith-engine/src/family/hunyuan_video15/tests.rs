//! HunyuanVideo 1.5 on the CPU with the tiny model (`testkit`): musubi-tuner's `_hv15` caches are read (glyph
//! states only where the caption quotes text), a fixed batch learns, a run config trains through the same
//! `Trainer` as every family, saves a LoRA with musubi-tuner's names and metadata and resumes bit-identically, the
//! plan reads its clip from the caches, and what needs the missing byT5 encoder is refused by name.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::items::{load_hv15_items, ItemReader};
use super::testkit::{dataset, tiny_config, tiny_dit};
use super::train::hv15_batch;
use crate::family::{family_of, family_of_cache, family_of_dit};
use crate::generate::request::{DitSource, GenerationRequest};
use crate::generate::run::Session;
use crate::prep::pass::{CachePass, CacheRequest, LatentFiles};
use crate::train::optimizer::AdamW;
use crate::train::step::{try_checkpointed_step, LossTarget, StepOptions};
use crate::train::tests::{all_lora_values, try_start};
use crate::train::timesteps::TimestepDraw;
use framesmith_config::run::{Checkpointing, TimestepSampling, TrainingMode};
use framesmith_config::{presets, RunConfig};
use framesmith_data::Unreadable;
use framesmith_models::hunyuan_video15::weights::load_dit;
use framesmith_models::hunyuan_video15::{HunyuanVideo15Config, HunyuanVideo15Transformer};
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSet, LoraSpec};
use framesmith_nn::lora_file::LoraFile;

/// How the tests read items: on the CPU for the tiny model `cfg`, in `mode`.
fn reader(cfg: &HunyuanVideo15Config, mode: TrainingMode) -> ItemReader<'_> {
    ItemReader {
        cfg,
        mode,
        device: &Device::Cpu,
    }
}

/// The tiny transformer written into `dir` and loaded, with a rank-4 LoRA on musubi-tuner's targets and its
/// optimizer.
fn tiny_model_with_lora(dir: &Path) -> anyhow::Result<(HunyuanVideo15Transformer, LoraSet, AdamW)> {
    let mut model = load_dit(&tiny_dit(dir)?, DType::F32, &Device::Cpu, None)?;
    let spec = LoraSpec {
        rank: 4,
        alpha: 4.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 3,
        kind: Default::default(),
    };
    let loras = attach_family_loras(model.linears_mut(), &spec, LoraFamily::HunyuanVideo15)?;
    let optimizer = AdamW::new(crate::train::setup::named_vars(&loras), Default::default())?;
    Ok((model, loras, optimizer))
}

#[test]
fn musubi_caches_are_read_and_a_fixed_batch_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path(), 1, false)?;
    let cfg = tiny_config();
    let items = load_hv15_items(
        (&toml, Unreadable::Refuse),
        reader(&cfg, TrainingMode::Auto),
    )?
    .items;
    assert_eq!(items.len(), 3);
    let shapes: Vec<_> = items
        .iter()
        .map(|(i, _)| {
            (
                i.latents.dims().to_vec(),
                i.context.dim(0).ok(),
                i.second_text.is_some(),
            )
        })
        .collect();
    assert_eq!(
        shapes,
        [
            (vec![4, 3, 4, 4], Some(3), false),
            (vec![4, 3, 4, 4], Some(5), false),
            (vec![4, 3, 4, 4], Some(4), true),
        ]
    );

    let (model, loras, mut optimizer) = tiny_model_with_lora(&dir.path().join("dit"))?;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = vec![
        TimestepDraw {
            t: 0.6,
            model_timestep: 601.0
        };
        batch.len()
    ];
    let mut losses = Vec::new();
    for _ in 0..12 {
        // The same noise every step: the loss of one fixed batch.
        let b = hv15_batch(&batch, &draws, &mut StdRng::seed_from_u64(9), DType::F32)?;
        assert_eq!(
            b.inputs.latents.dims(),
            &[3, 9, 3, 4, 4],
            "noisy, condition, mask"
        );
        assert_eq!(b.inputs.txt.lens, [3, 5, 4]);
        let glyph = b.inputs.byt5.as_ref().map(|g| g.lens.clone());
        assert_eq!(
            glyph,
            Some(vec![0, 0, 2]),
            "glyph tokens where the caption quotes"
        );
        assert_eq!(b.inputs.timesteps.to_vec1::<f32>()?, [601.0; 3]);
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
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[11] < 0.9 * losses[0], "the loss falls: {losses:?}");
    // Without glyph text in the batch there are no glyph tokens at all.
    let b = hv15_batch(
        &batch[..2],
        &draws[..2],
        &mut StdRng::seed_from_u64(9),
        DType::F32,
    )?;
    assert!(b.inputs.byt5.is_none());
    Ok(())
}

/// A `steps`-long HunyuanVideo 1.5 run on the cached tiny dataset in `dir`.
fn config(dir: &Path, steps: usize) -> anyhow::Result<RunConfig> {
    std::fs::create_dir_all(dir)?;
    let toml = dataset(dir, 2, false)?;
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = tiny_dit(dir)?;
    config.dataset.synthetic = false;
    config.dataset.config = toml;
    config.lora.rank = 4;
    config.lora.alpha = 4.0;
    config.training.max_train_steps = steps;
    config.training.timestep_sampling = TimestepSampling::Shift;
    config.training.discrete_flow_shift = 2.0;
    config.optimizer.lr_warmup_steps = 0;
    config.memory.checkpointing = Checkpointing::Blocks;
    config.output.output_dir = dir.join("run");
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

#[test]
fn a_run_config_trains_saves_musubi_names_and_metadata_and_resumes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let steps = 4;
    let config_a = config(&dir.path().join("a"), steps)?;
    assert_eq!(family_of(&config_a).name(), "HunyuanVideo 1.5");
    let dit = DitSource::File(config_a.model.dit.clone());
    assert_eq!(family_of_dit(&dit).name(), "HunyuanVideo 1.5");
    let mut straight = try_start(&config_a, None)?;
    assert_eq!(straight.family.sample_count(), 0);
    let mut losses = Vec::new();
    while straight.step() < steps {
        let report = straight.train_step(&|| false)?;
        let loss = report.loss.ok_or_else(|| anyhow::anyhow!("no loss"))?;
        assert!(loss.is_finite() && loss > 0.0, "{loss}");
        losses.push(loss);
    }
    let saved = straight.save(true)?;
    let file = LoraFile::load(&saved.loras[0], &Device::Cpu)?;
    let names: Vec<&str> = file.modules.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names.len(),
        2 * 14,
        "every linear of both blocks: {names:?}"
    );
    for name in [
        "lora_unet_double_blocks_0_img_attn_q",
        "lora_unet_double_blocks_1_txt_mlp_fc2",
        "lora_unet_double_blocks_1_img_mod_linear",
    ] {
        assert!(
            names.contains(&name),
            "musubi-tuner's name {name}: {names:?}"
        );
    }
    let meta = |k: &str| file.metadata.get(k).map(String::as_str);
    assert_eq!(meta("ss_network_module"), Some("networks.lora_hv_1_5"));
    assert_eq!(meta("ss_base_model_version"), Some("hunyuan_video_1_5"));
    assert_eq!(
        meta("modelspec.architecture"),
        Some("hunyuan-video-1.5/lora")
    );
    assert_eq!(meta("framesmith.training_mode"), Some("text_to_video"));

    let config_b = config(&dir.path().join("b"), steps)?;
    let mut first = try_start(&config_b, None)?;
    let mut resumed = Vec::new();
    while first.step() < 2 {
        resumed.push(first.train_step(&|| false)?.loss.unwrap_or(f64::NAN));
    }
    first.save(false)?;
    drop(first);
    let mut second = try_start(&config_b, Some(&dir.path().join("b").join("run")))?;
    assert_eq!(second.step(), 2);
    while second.step() < steps {
        resumed.push(second.train_step(&|| false)?.loss.unwrap_or(f64::NAN));
    }
    assert_eq!(losses, resumed);
    assert_eq!(all_lora_values(&straight)?, all_lora_values(&second)?);

    let valid = framesmith_data::load_valid(&config_a.dataset.config)?;
    let clip = crate::family::largest_cached_clip(&valid, false);
    assert_eq!(
        clip.map(|c| (c.width, c.height, c.frames, c.batch)),
        Some((64, 64, 9, 2))
    );
    Ok(())
}

/// The error of `result`, in full.
fn error_of<T>(result: anyhow::Result<T>) -> String {
    result.err().map(|e| format!("{e:#}")).unwrap_or_default()
}

#[test]
fn what_needs_byt5_is_refused_naming_what_is_missing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit: PathBuf = tiny_dit(dir.path())?;
    let pass = CachePass::Latents(LatentFiles {
        vae: dir.path().join("hunyuanvideo15_vae.safetensors"),
        dit: Some(dit.clone()),
        ..LatentFiles::default()
    });
    let family = family_of_cache(&pass);
    assert_eq!(family.name(), "HunyuanVideo 1.5");
    let request = CacheRequest {
        dataset: dir.path().join("data.toml"),
        pass,
        keep_stale: false,
        unreadable: Unreadable::Refuse,
        open: &|| anyhow::bail!("no device is opened for a refused pass"),
    };
    // The latent pass runs (its dataset config is missing here); the text pass needs byT5.
    let err = error_of(family.cache(&request, &mut (), &mut |_| {}));
    assert!(err.contains("data.toml"), "{err}");
    let text = CacheRequest {
        pass: CachePass::Text(Default::default()),
        ..request
    };
    let err = error_of(family.cache(&text, &mut (), &mut |_| {}));
    for part in ["byT5", "hv_1_5_cache_text_encoder_outputs.py", "data.toml"] {
        assert!(err.contains(part), "{part}: {err}");
    }

    let request = GenerationRequest::new(
        DitSource::File(dit.clone()),
        "a cat",
        dir.path().join("out"),
    );
    let mut events = |_| {};
    let mut session = Session::new(&mut events, &|| false);
    let err = error_of(family_of_dit(&request.dit).generate(&request, &mut session));
    assert!(
        err.contains("byT5") && err.contains("hv_1_5_generate_video.py"),
        "{err}"
    );

    // Samples are refused when the run starts, before anything loads.
    let mut config = config(dir.path(), 2)?;
    config.sampling.prompts = Some(dit);
    config.sampling.sample_every_n_steps = Some(1);
    let err = error_of(try_start(&config, None));
    assert!(
        err.contains("sampling.prompts") && err.contains("byT5"),
        "{err}"
    );

    // A dataset without `_hv15` caches names musubi-tuner's scripts.
    std::fs::remove_dir_all(dir.path().join("cache"))?;
    let cfg = tiny_config();
    let err = error_of(load_hv15_items(
        (&config.dataset.config, Unreadable::Refuse),
        reader(&cfg, TrainingMode::Auto),
    ));
    assert!(
        err.contains("no *_hv15.safetensors")
            && err.contains("hv_1_5_cache_text_encoder_outputs.py"),
        "{err}"
    );
    Ok(())
}

#[test]
fn image_to_video_caches_condition_the_batch_and_train() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path(), 1, true)?;
    let cfg = tiny_config();
    let items = load_hv15_items(
        (&toml, Unreadable::Refuse),
        reader(&cfg, TrainingMode::Auto),
    )?
    .items;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = vec![
        TimestepDraw {
            t: 0.5,
            model_timestep: 501.0
        };
        batch.len()
    ];
    let b = hv15_batch(&batch, &draws, &mut StdRng::seed_from_u64(9), DType::F32)?;
    assert_eq!(b.inputs.latents.dims(), &[3, 9, 3, 4, 4]);
    // The mask channel is 1 on the first latent frame only, and the SigLIP tokens come along.
    let mask: Vec<f32> = b
        .inputs
        .latents
        .get(0)?
        .get(8)?
        .mean_keepdim(2)?
        .mean_keepdim(1)?
        .flatten_all()?
        .to_vec1()?;
    assert_eq!(mask, [1.0, 0.0, 0.0]);
    assert_eq!(
        b.inputs.image_embeds.as_ref().map(|t| t.dims().to_vec()),
        Some(vec![3, 6, 8])
    );
    // Text-to-video leaves the image parts out; a batch that mixes the two is refused.
    let t2v = load_hv15_items(
        (&toml, Unreadable::Refuse),
        reader(&cfg, TrainingMode::TextToVideo),
    )?
    .items;
    assert!(t2v
        .iter()
        .all(|(i, _)| i.image.is_none() && i.clip.is_none()));
    let mixed = [batch[0], &t2v[1].0];
    let err = error_of(hv15_batch(
        &mixed,
        &draws[..2],
        &mut StdRng::seed_from_u64(9),
        DType::F32,
    ));
    assert!(err.contains("mixes image-to-video items"), "{err}");

    // A run of it trains and says so in its LoRA; asked for I2V, text-to-video caches are refused by name.
    let mut config = config(&dir.path().join("run"), 2)?;
    config.dataset.config = toml;
    config.training.mode = TrainingMode::ImageToVideo;
    let mut trainer = try_start(&config, None)?;
    let loss = trainer.train_step(&|| false)?.loss.unwrap_or(f64::NAN);
    assert!(loss.is_finite() && loss > 0.0, "{loss}");
    let saved = trainer.save(true)?;
    let file = LoraFile::load(&saved.loras[0], &Device::Cpu)?;
    let mode = file
        .metadata
        .get("framesmith.training_mode")
        .map(String::as_str);
    assert_eq!(mode, Some("image_to_video"));
    let t2v_toml = dataset(&dir.path().join("t2v"), 1, false)?;
    let err = error_of(load_hv15_items(
        (&t2v_toml, Unreadable::Refuse),
        reader(&cfg, TrainingMode::ImageToVideo),
    ));
    assert!(err.contains("hv_1_5_cache_latents.py --i2v"), "{err}");
    Ok(())
}
