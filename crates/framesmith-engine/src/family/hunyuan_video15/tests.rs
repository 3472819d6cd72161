//! HunyuanVideo 1.5 on the CPU with the tiny model (`testkit`): musubi-tuner's `_hv15` caches are read (glyph
//! states only where the caption quotes text), a fixed batch learns, a run config trains through the same
//! `Trainer` as every family, saves a LoRA with musubi-tuner's names and metadata and resumes bit-identically, the
//! plan reads its clip from the caches, both cache passes are the family's, and samples during a run are clips
//! whose prompts are encoded once (with the fixtures' tiny encoders) and then come from the prompt cache; an
//! image-to-video run's samples start from their prompts' images (through the fixtures' SigLIP and VAE), and a
//! start image that cannot be read is refused before any model loads.

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Device};

use super::encoder::testkit as encoder_testkit;
use super::items::{load_hv15_items, ItemReader};
use super::setup::start_run_with;
use super::testkit::{dataset, dataset_for, tiny_config, tiny_dit};
use super::train::hv15_batch;
use crate::family::family_of_cache;
use crate::family::testkit::run::{
    assert_a_fixed_batch_learns, assert_family_named, assert_trains_and_resumes, cached_clip,
    cached_run_config, error_of, fixed_draws, refused_cache_request, tiny_lora_spec,
};
use crate::prep::pass::{CachePass, CacheRequest, LatentFiles, TextFiles};
use crate::train::optimizer::AdamW;
use crate::train::tests::try_start;
use framesmith_config::run::{TimestepSampling, TrainingMode};
use framesmith_config::validate::validate_for;
use framesmith_config::{HostInfo, ModelFamily, RunConfig};
use framesmith_data::Unreadable;
use framesmith_models::hunyuan_video15::weights::load_dit;
use framesmith_models::hunyuan_video15::{HunyuanVideo15Config, HunyuanVideo15Transformer};
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSet};
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
    let loras = attach_family_loras(
        model.linears_mut(),
        &tiny_lora_spec(),
        LoraFamily::HunyuanVideo15,
    )?;
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
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
        // The same noise every step: the loss of one fixed batch.
        let b = hv15_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32)?;
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
        Ok((b.inputs, b.targets))
    })?;
    // Without glyph text in the batch there are no glyph tokens at all.
    let b = hv15_batch(
        &batch[..2],
        &draws[..2],
        &mut StepRng::seeded(9),
        DType::F32,
    )?;
    assert!(b.inputs.byt5.is_none());
    Ok(())
}

/// A `steps`-long HunyuanVideo 1.5 run on the cached tiny dataset in `dir`.
fn config(dir: &Path, steps: usize) -> anyhow::Result<RunConfig> {
    std::fs::create_dir_all(dir)?;
    let toml = dataset(dir, 2, false)?;
    let files = (tiny_dit(dir)?, toml);
    let mut config = cached_run_config(dir, files, steps, TimestepSampling::Shift)?;
    config.training.discrete_flow_shift = 2.0;
    Ok(config)
}

#[test]
fn a_run_config_trains_saves_musubi_names_and_metadata_and_resumes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let steps = 4;
    let config_a = config(&dir.path().join("a"), steps)?;
    assert_family_named(&config_a, "HunyuanVideo 1.5");
    let config_b = config(&dir.path().join("b"), steps)?;
    let (straight, lora) = assert_trains_and_resumes(&config_a, &config_b, steps)?;
    assert_eq!(straight.family.sample_count(), 0);
    let file = LoraFile::load(&lora, &Device::Cpu)?;
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

    assert_eq!(cached_clip(&config_a)?, Some((64, 64, 9, 2)));
    Ok(())
}

#[test]
fn both_cache_passes_are_the_familys_and_an_uncached_dataset_names_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit: PathBuf = tiny_dit(dir.path())?;
    let pass = CachePass::Latents(LatentFiles {
        vae: dir.path().join("hunyuanvideo15_vae.safetensors"),
        dit: Some(dit.clone()),
        ..LatentFiles::default()
    });
    let family = family_of_cache(&pass);
    assert_eq!(family.name(), "HunyuanVideo 1.5");
    let request = refused_cache_request(dir.path(), pass);
    // Both passes run (their dataset config is missing here).
    let err = error_of(family.cache(&request, &mut (), &mut |_| {}));
    assert!(err.contains("data.toml"), "{err}");
    let text = CachePass::Text(TextFiles {
        text_encoder: Some(dir.path().join("qwen_2.5_vl_7b.safetensors")),
        dit: Some(dit.clone()),
        ..TextFiles::default()
    });
    let family = family_of_cache(&text);
    assert_eq!(family.name(), "HunyuanVideo 1.5");
    let text = CacheRequest {
        pass: text,
        ..request
    };
    let err = error_of(family.cache(&text, &mut (), &mut |_| {}));
    assert!(err.contains("data.toml"), "{err}");
    // Without --dit naming it, a text pass is not HunyuanVideo 1.5's.
    let other = CachePass::Text(TextFiles {
        text_encoder: Some(dir.path().join("qwen_2.5_vl_7b.safetensors")),
        ..TextFiles::default()
    });
    assert_ne!(family_of_cache(&other).name(), "HunyuanVideo 1.5");

    // A dataset without `_hv15` caches names the passes that make them.
    let config = config(dir.path(), 2)?;
    std::fs::remove_dir_all(dir.path().join("cache"))?;
    let cfg = tiny_config();
    let err = error_of(load_hv15_items(
        (&config.dataset.config, Unreadable::Refuse),
        reader(&cfg, TrainingMode::Auto),
    ));
    assert!(
        err.contains("no *_hv15.safetensors")
            && err.contains("framesmith cache text")
            && err.contains("hv_1_5_cache_text_encoder_outputs.py"),
        "{err}"
    );
    Ok(())
}

#[test]
fn samples_are_clips_encoded_once_then_read_from_the_prompt_cache() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = encoder_testkit::dit(dir.path())?;
    let toml = dataset_for(
        dir.path(),
        1,
        false,
        &encoder_testkit::encoder_width_config(),
    )?;
    let mut config =
        cached_run_config(dir.path(), (dit.clone(), toml), 2, TimestepSampling::Shift)?;
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "a sign reading \"OPEN\" --w 32 --h 48 --f 5 --s 2 --d 5\n",
    )?;
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_every_n_steps = Some(1);
    config.model.vae = encoder_testkit::fixture("hunyuan_video15_vae/video/weights.safetensors");
    config.model.text_encoder = encoder_testkit::encoders_side_by_side(&dir.path().join("te"))?;
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut lines = Vec::new();
    let mut parts = start_run_with(&plan, &dit, &encoder_testkit::tiny_qwen, &mut |_, l| {
        lines.push(l)
    })?;
    assert_eq!(parts.family.sample_count(), 1);
    let out = dir.path().join("samples");
    std::fs::create_dir_all(&out)?;
    let files = parts.family.sample(0, &out, "000001-00", &|| false)?;
    assert_eq!(files.file, out.join("000001-00.mp4"));
    assert!(files.file.is_file());
    let pngs = std::fs::read_dir(&files.frames)?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png"))
        })
        .count();
    assert_eq!(pngs, 5);
    // The prompt and the default "" negative prompt.
    assert!(
        lines.iter().any(|l| l.contains("2 sample prompts encoded")),
        "{lines:?}"
    );
    let refuse = |_: &Path, _: Option<&Path>, _: DType, _: &Device| -> anyhow::Result<_> {
        anyhow::bail!("the text encoder was loaded")
    };
    let mut again = Vec::new();
    start_run_with(&plan, &dit, &refuse, &mut |_, l| again.push(l))?;
    assert!(
        again.iter().any(|l| l.contains("from the prompt cache")),
        "{again:?}"
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
    let draws = fixed_draws(batch.len(), 0.5, 501.0);
    let b = hv15_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32)?;
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
        &mut StepRng::seeded(9),
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

/// An image-to-video run with samples: each prompt's start image (`--i`, beside the prompt file) goes through the
/// fixture SigLIP (`model.clip`) and the VAE's encoder, and the sample is a clip; a start image that cannot be read,
/// or a prompt without one, is refused by prompt file and path before any encoder or the DiT loads.
#[test]
fn image_to_video_samples_start_from_their_images() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = encoder_testkit::dit(dir.path())?;
    let toml = dataset_for(
        dir.path(),
        1,
        true,
        &encoder_testkit::encoder_width_config(),
    )?;
    let mut config =
        cached_run_config(dir.path(), (dit.clone(), toml), 2, TimestepSampling::Shift)?;
    image::RgbImage::from_fn(40, 24, |x, y| {
        image::Rgb([(x * 6) as u8, (y * 10) as u8, 90])
    })
    .save(dir.path().join("start.png"))?;
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "a pattern turns --i start.png --w 32 --h 48 --f 5 --s 2 --d 5\n",
    )?;
    config.training.mode = TrainingMode::ImageToVideo;
    config.sampling.prompts = Some(prompts.clone());
    config.sampling.sample_every_n_steps = Some(1);
    config.model.vae = encoder_testkit::fixture("hunyuan_video15_vae/video/weights.safetensors");
    config.model.text_encoder = encoder_testkit::encoders_side_by_side(&dir.path().join("te"))?;
    config.model.clip = encoder_testkit::fixture("siglip");
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut lines = Vec::new();
    let mut parts = start_run_with(&plan, &dit, &encoder_testkit::tiny_qwen, &mut |_, l| {
        lines.push(l)
    })?;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("1 sample start images encoded by SigLIP")),
        "{lines:?}"
    );
    let out = dir.path().join("samples");
    std::fs::create_dir_all(&out)?;
    let files = parts.family.sample(0, &out, "000001-00", &|| false)?;
    assert!(files.file.is_file());
    let pngs = std::fs::read_dir(&files.frames)?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png"))
        })
        .count();
    assert_eq!(pngs, 5);

    // Nothing loads before the start images are checked: a loader that fails shows it is never reached.
    let refuse = |_: &Path, _: Option<&Path>, _: DType, _: &Device| -> anyhow::Result<_> {
        anyhow::bail!("the text encoder was loaded")
    };
    let start = |line: &str| -> String {
        std::fs::write(&prompts, line)
            .map_err(anyhow::Error::from)
            .and_then(|()| start_run_with(&plan, &dit, &refuse, &mut |_, _| {}).map(|_| ()))
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    };
    let err = start("a pattern turns --i missing.png --w 32 --h 48 --f 5 --s 2\n");
    assert!(
        err.contains("missing.png") && err.contains("prompts.txt") && err.contains("--i"),
        "{err}"
    );
    let err = start("a pattern turns --w 32 --h 48 --f 5 --s 2\n");
    assert!(err.contains("add --i with a start image"), "{err}");
    // The same run without its SigLIP is refused at its config check.
    config.model.clip = PathBuf::new();
    let errors = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::HunyuanVideo15)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        errors.contains("model.clip") && errors.contains("sigclip_vision"),
        "{errors}"
    );
    Ok(())
}
