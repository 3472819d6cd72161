//! LTX-2 on the CPU with the tiny model (`testkit`): the `_ltx2` caches of musubi-tuner's LTX-2 branch are read, a
//! fixed batch learns, a run config trains through the same `Trainer` as every family, saves a LoRA under the
//! official trainer's keys (which ComfyUI loads) and resumes bit-identically, the plan reads its clip from the
//! caches, what needs a missing VAE or Gemma 3 is refused by name, and a run with sample prompts writes its
//! clips (the prompts encoded once, then read from the prompt cache) and a LoRA that `generate` applies.
//! First-frame conditioning (the official trainer's image-to-video) is tested in [`i2v`].

use std::path::{Path, PathBuf};

use crate::train::noise::StepRng;
use candle_core::{DType, Device};

use super::items::load_ltx2_items;
use super::setup::start_run_with;
use super::testkit::{
    dataset, dataset_for, dataset_with, text_case_dir, tiny_checkpoint, tiny_config, tiny_dit,
    tiny_dit_with, tiny_gemma, AUDIO_FRAMES,
};
use super::train::ltx2_batch;
use crate::family::family_of_cache;
use crate::family::image::run::BatchOptions;
use crate::family::testkit::run::{
    assert_a_fixed_batch_learns, assert_family_named, assert_trains_and_resumes, cached_clip,
    cached_run_config, error_of, fixed_draws, generate_error, refused_cache_request,
    sampling_start_error, tiny_lora_spec,
};
use crate::prep::pass::{CachePass, LatentFiles};
use crate::train::optimizer::AdamW;
use framesmith_config::run::TimestepSampling;
use framesmith_config::validate::validate_for;
use framesmith_config::{HostInfo, ModelFamily, RunConfig};
use framesmith_data::Unreadable;
use framesmith_models::ltx2::weights::{load, load_streamed_av};
use framesmith_models::ltx2::Ltx2Transformer;
use framesmith_nn::lora::{attach_family_loras, LoraFamily, LoraSet};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::offload::OffloadOptions;

/// Text-to-video batches: no first-frame conditioning.
const T2V: BatchOptions = BatchOptions {
    first_frame_conditioning_p: 0.0,
};

/// The tiny transformer written into `dir` and loaded, with a rank-4 LoRA on the official targets and its
/// optimizer.
fn tiny_model_with_lora(dir: &Path) -> anyhow::Result<(Ltx2Transformer, LoraSet, AdamW)> {
    let (_, mut model) = load(&tiny_dit(dir)?, DType::F32, &Device::Cpu, None)?;
    let loras = attach_family_loras(model.linears_mut(), &tiny_lora_spec(), LoraFamily::Ltx2)?;
    let optimizer = AdamW::new(crate::train::setup::named_vars(&loras), Default::default())?;
    Ok((model, loras, optimizer))
}

#[test]
fn musubi_ltx2_caches_are_read_and_a_fixed_batch_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset(dir.path(), 1)?;
    let items = load_ltx2_items((&toml, Unreadable::Refuse), &tiny_config(), &Device::Cpu)?.items;
    let shapes: Vec<_> = items
        .iter()
        .map(|(i, _)| (i.latents.dims().to_vec(), i.context.dims().to_vec()))
        .collect();
    assert_eq!(
        shapes,
        [
            (vec![4, 3, 2, 3], vec![3, 16]),
            (vec![4, 3, 2, 3], vec![5, 16]),
            (vec![4, 3, 2, 3], vec![4, 16]),
        ]
    );

    let (model, loras, mut optimizer) = tiny_model_with_lora(&dir.path().join("dit"))?;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
        // The same noise every step: the loss of one fixed batch.
        let (inputs, targets) =
            ltx2_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32, &T2V)?;
        assert_eq!(inputs.latents.dims(), &[3, 18, 4], "frame-major tokens");
        assert_eq!(inputs.positions.dims(), &[3, 3, 18, 2]);
        assert_eq!(inputs.context.dims(), &[3, 5, 16]);
        assert_eq!(inputs.context_lens, Some(vec![3, 5, 4]));
        assert_eq!(inputs.sigmas, [0.6; 3]);
        assert_eq!(targets[0].dims(), &[18, 4]);
        Ok((inputs, targets))
    })
}

/// A `steps`-long LTX-2 run on the cached tiny dataset in `dir`.
fn config(dir: &Path, steps: usize) -> anyhow::Result<RunConfig> {
    std::fs::create_dir_all(dir)?;
    let toml = dataset(dir, 2)?;
    let files = (tiny_dit(dir)?, toml);
    let mut config = cached_run_config(dir, files, steps, TimestepSampling::ShiftedLogitNormal)?;
    config.lora.alpha = 2.0;
    Ok(config)
}

#[test]
fn a_run_config_trains_saves_official_keys_and_resumes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let steps = 4;
    let config_a = config(&dir.path().join("a"), steps)?;
    assert_family_named(&config_a, "LTX-2");
    let config_b = config(&dir.path().join("b"), steps)?;
    let (straight, lora) = assert_trains_and_resumes(&config_a, &config_b, steps)?;
    assert_eq!(straight.family.sample_count(), 0);

    // The official trainer's keys (PEFT's under ComfyUI's prefix), alpha / rank folded into lora_B, no alpha.
    let bytes = std::fs::read(&lora)?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let mut keys: Vec<String> = st.names().into_iter().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(
        keys.len(),
        2 * 8 * 2,
        "q, k, v, out of both attentions of both blocks: {keys:?}"
    );
    for key in [
        "diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight",
        "diffusion_model.transformer_blocks.0.attn1.to_q.lora_B.weight",
        "diffusion_model.transformer_blocks.1.attn2.to_out.0.lora_B.weight",
        "diffusion_model.transformer_blocks.1.attn2.to_v.lora_A.weight",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key}: {keys:?}");
    }
    assert!(
        keys.iter()
            .all(|k| !k.ends_with(".alpha") && !k.contains("lora_unet")),
        "{keys:?}"
    );
    // Read back, the file gives the trained adapter's delta: B' = B · alpha / rank, read at alpha = rank.
    let file = LoraFile::load(&lora, &Device::Cpu)?;
    let q = file
        .get("lora_unet_transformer_blocks_0_attn1_to_q")
        .ok_or_else(|| anyhow::anyhow!("no attn1.to_q"))?;
    assert_eq!(q.alpha, 4.0);
    let trained = straight
        .loras()
        .get("transformer_blocks.0.attn1.to_q")
        .and_then(|a| a.as_lora().map(|l| l.up.as_tensor().clone()))
        .ok_or_else(|| anyhow::anyhow!("no trained attn1.to_q"))?;
    let diff = (q.up.to_dtype(DType::F32)? - (trained.to_dtype(DType::F32)? * 0.5)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert!(diff < 1e-6, "lora_B carries alpha / rank: {diff}");
    let meta = |k: &str| file.metadata.get(k).map(String::as_str);
    assert_eq!(meta("ss_base_model_version"), Some("ltx2.3"));
    assert_eq!(meta("framesmith.training_mode"), Some("text_to_video"));

    assert_eq!(cached_clip(&config_a)?, Some((96, 64, 17, 2)));
    Ok(())
}

#[test]
fn what_needs_a_vae_or_gemma_is_refused_naming_what_is_missing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit: PathBuf = tiny_dit(dir.path())?;
    // The latent pass is LTX-2's; a checkpoint without the video VAE (the tiny transformer) is named as such.
    let pass = CachePass::Latents(LatentFiles {
        dit: Some(dit.clone()),
        ..LatentFiles::default()
    });
    let family = family_of_cache(&pass);
    assert_eq!(family.name(), "LTX-2");
    let request = refused_cache_request(dir.path(), pass);
    let err = error_of(family.cache(&request, &mut (), &mut |_| {}));
    for part in ["no LTX-2 video VAE", "ltx-2-19b", "tiny"] {
        assert!(err.contains(part), "{part}: {err}");
    }

    let err = generate_error(&dit, dir.path());
    assert!(
        err.contains("--text-encoder") && err.contains("Gemma 3"),
        "{err}"
    );

    // Samples without Gemma are refused when the run starts, before anything loads.
    let config = config(dir.path(), 2)?;
    let err = sampling_start_error(&config, &dit);
    assert!(
        err.contains("model.text_encoder") && err.contains("Gemma 3 12B"),
        "{err}"
    );

    // A dataset without `_ltx2` caches names the commands that make them.
    std::fs::remove_dir_all(dir.path().join("cache"))?;
    let err = error_of(load_ltx2_items(
        (&config.dataset.config, Unreadable::Refuse),
        &tiny_config(),
        &Device::Cpu,
    ));
    assert!(
        err.contains("no *_ltx2.safetensors")
            && err.contains("framesmith cache latents")
            && err.contains("framesmith cache text"),
        "{err}"
    );
    Ok(())
}

/// Joint audio-video training: with `_ltx2_audio` caches beside the clips, the items carry their audio latents
/// (cut to the frames that hold audio) and the audio connector's output, the batch noises both streams at one σ
/// with the joint loss's targets, and a fixed batch learns through both streams' hand-written block backward.
#[test]
fn audio_latent_caches_train_both_streams_and_a_fixed_batch_learns() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let toml = dataset_with(dir.path(), 1, true)?;
    let cfg = tiny_config();
    let items = load_ltx2_items((&toml, Unreadable::Refuse), &cfg, &Device::Cpu)?.items;
    for (item, _) in &items {
        let audio = item
            .audio
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no audio"))?;
        assert_eq!(audio.dims(), &[2, AUDIO_FRAMES, 2]);
        let text = item
            .second_text
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no audio text"))?;
        assert_eq!(text.dim(1)?, 8);
    }
    let dit = tiny_dit_with(&dir.path().join("dit"), true)?;
    let (_, mut model) = load_streamed_av(
        &dit,
        (DType::F32, &Device::Cpu),
        (None, false),
        (&[], &OffloadOptions::default()),
        true,
    )?;
    let loras = attach_family_loras(model.linears_mut(), &tiny_lora_spec(), LoraFamily::Ltx2)?;
    let names: Vec<&str> = loras.iter().map(|(n, _)| n).collect();
    for module in [
        "audio_attn1.to_q",
        "audio_to_video_attn.to_k",
        "video_to_audio_attn.to_out.0",
    ] {
        assert!(
            names.iter().any(|n| n.ends_with(module)),
            "{module}: {names:?}"
        );
    }
    let mut optimizer = AdamW::new(crate::train::setup::named_vars(&loras), Default::default())?;
    let batch: Vec<_> = items.iter().map(|(i, _)| i).collect();
    let draws = fixed_draws(batch.len(), 0.6, 601.0);
    assert_a_fixed_batch_learns(&model, &loras, &mut optimizer, || {
        let (inputs, targets) =
            ltx2_batch(&batch, &draws, &mut StepRng::seeded(9), DType::F32, &T2V)?;
        let audio = inputs
            .audio
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no audio inputs"))?;
        assert_eq!(
            audio.latents.dims(),
            &[3, AUDIO_FRAMES, 4],
            "[T, C·mel] tokens"
        );
        assert_eq!(audio.positions.dims(), &[3, 1, AUDIO_FRAMES, 2]);
        assert_eq!(audio.context.dims(), &[3, 5, 8]);
        // Both streams' targets joined: 18 × 4 video values and 9 × 4 audio values.
        assert_eq!(targets[0].dims(), &[18 * 4 + AUDIO_FRAMES * 4, 1]);
        Ok((inputs, targets))
    })
}

/// A run on clips with audio caches trains both streams from the run config, saves the audio and cross-modal
/// modules under the official trainer's keys, and says so in the metadata; a dataset with audio for some clips
/// only is refused by name.
#[test]
fn a_run_with_audio_caches_trains_jointly_and_mixed_caches_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let joint_config = |sub: &str| -> anyhow::Result<RunConfig> {
        let dir = dir.path().join(sub);
        std::fs::create_dir_all(&dir)?;
        let toml = dataset_with(&dir, 2, true)?;
        let mut config = cached_run_config(
            &dir,
            (tiny_dit_with(&dir, true)?, toml),
            4,
            TimestepSampling::ShiftedLogitNormal,
        )?;
        config.lora.alpha = 2.0;
        Ok(config)
    };
    let (a, b) = (joint_config("a")?, joint_config("b")?);
    let (_, lora) = assert_trains_and_resumes(&a, &b, 4)?;
    let file = LoraFile::load(&lora, &Device::Cpu)?;
    // q, k, v, out of the six attentions of both blocks.
    assert_eq!(file.modules.len(), 2 * 24);
    assert!(file
        .get("lora_unet_transformer_blocks_1_video_to_audio_attn_to_v")
        .is_some());
    assert_eq!(
        file.metadata
            .get("framesmith.training_mode")
            .map(String::as_str),
        Some("text_to_video_with_audio")
    );

    // One clip's audio cache gone: refused, naming it.
    let cache = a
        .dataset
        .config
        .parent()
        .map(|d| d.join("cache"))
        .unwrap_or_default();
    let audio = std::fs::read_dir(&cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with("_ltx2_audio.safetensors"))
        .ok_or_else(|| anyhow::anyhow!("no audio cache"))?;
    std::fs::remove_file(&audio)?;
    let err = error_of(crate::train::tests::try_start(&a, None).map(|_| ()));
    assert!(
        err.contains("_ltx2_audio") && err.contains("has none"),
        "{err}"
    );
    Ok(())
}

#[test]
fn samples_are_clips_encoded_once_and_generate_applies_the_trained_lora() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dit = tiny_checkpoint(&dir.path().join("ckpt"))?;
    let cfg = super::train::dit_config(&dit)?;
    let toml = dataset_for(dir.path(), 1, (false, &cfg))?;
    let mut config = cached_run_config(
        dir.path(),
        (dit.clone(), toml),
        2,
        TimestepSampling::ShiftedLogitNormal,
    )?;
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "a red fox runs through deep snow --w 24 --h 16 --f 5 --s 2 --d 5\n",
    )?;
    config.sampling.prompts = Some(prompts);
    config.sampling.sample_every_n_steps = Some(1);
    config.model.text_encoder = text_case_dir().join("gemma_3_12B_it.safetensors");
    let plan = validate_for(&config, &HostInfo::cpu_only(), ModelFamily::Ltx2)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut lines = Vec::new();
    let mut parts = start_run_with(&plan, &dit, &tiny_gemma, &mut |_, l| lines.push(l))?;
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
    // The prompt and the trainer's default negative prompt.
    assert!(
        lines.iter().any(|l| l.contains("2 sample prompts encoded")),
        "{lines:?}"
    );
    let refuse = |_: &Path, _: DType, _: &Device, _: u64| -> anyhow::Result<_> {
        anyhow::bail!("Gemma was loaded")
    };
    let mut again = Vec::new();
    start_run_with(&plan, &dit, &refuse, &mut |_, l| again.push(l))?;
    assert!(
        again.iter().any(|l| l.contains("from the prompt cache")),
        "{again:?}"
    );

    // A trained LoRA changes what `generate` makes with the checkpoint.
    let mut plain_run = config.clone();
    plain_run.sampling.prompts = None;
    plain_run.sampling.sample_every_n_steps = None;
    let mut run = crate::train::tests::try_start(&plain_run, None)?;
    while run.step() < 2 {
        run.train_step(&|| false)?;
    }
    let lora = run
        .save(true)?
        .loras
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no LoRA saved"))?;
    drop(run);
    let mut request = super::generate::tests::request(&dir.path().join("gen"), "a red fox")?;
    request.dit = crate::generate::request::DitSource::File(dit);
    let plain = super::generate::tests::first_frame(&request)?;
    request.loras = vec![crate::generate::request::LoraChoice {
        path: lora,
        strength: 1.0,
    }];
    request.out = dir.path().join("gen/lora.mp4");
    assert_ne!(plain, super::generate::tests::first_frame(&request)?);
    Ok(())
}

mod av;
mod i2v;
