//! An LTX-2 run's part built from a validated plan whose `model.dit` is an LTX-2 transformer: the video stream of
//! the DiT, and its audio stream when the caches hold audio latents (in FP8 and streamed as the plan says), LoRA on the official trainer's targets under ltx-core's names,
//! items from `_ltx2` caches (held-out items when the run validates), the memory plan (which picks
//! `blocks_to_swap = "auto"`), samples during training (their prompts encoded by Gemma 3 before the DiT loads,
//! the video VAE from `model.vae` or the checkpoint) and the LoRA metadata.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use super::encoder::{load_gemma, LoadGemma};
use super::items::{load_ltx2_items, VAE};
use super::plan::{Ltx2PlanModel, PlanSound, PlanVae};
use super::run::Ltx2Run;
use super::samples::{clip_samples, Ltx2Samples, SampleFilesIn};
use super::sound::{muxer, sound_file};
use super::train::{dit_config, first_frame_conditioning_p};
use crate::family::image::items::split_items;
use crate::family::image::plan::spread_streamed_blocks;
use crate::family::image::run::BatchOptions;
use crate::family::image::setup::{image_lora_metadata, memory_report};
use crate::plan as memory_plan;
use crate::train::data::{TrainItem, TrainSet};
use crate::train::setup::{
    blocks_to_swap, device_for, device_label, float_dtype, log_plan, lora_spec, reserve_budget,
    start_loras, RunParts,
};
use framesmith_config::plan::DatasetSource;
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::Unreadable;
use framesmith_models::ltx2::weights::load_streamed_av;
use framesmith_models::ltx2::{Ltx2Config, Ltx2Transformer, Ltx2Version};
use framesmith_models::trainable::attach_model_loras;
use framesmith_nn::offload::OffloadOptions;

/// The LoRA file's metadata: every family's keys with the release trained (`ss_base_model_version` `ltx2` or
/// `ltx2.3`, modelspec architecture `ltx-2/lora`), text-to-video (with audio when `joint`) and the first-frame
/// conditioning probability.
pub(crate) fn ltx2_lora_metadata(
    plan: &RunPlan,
    cfg: &Ltx2Config,
    (joint, conditioning_p): (bool, f64),
) -> HashMap<String, String> {
    let base = match cfg.version() {
        Ltx2Version::Ltx2 => "ltx2",
        Ltx2Version::Ltx23 => "ltx2.3",
    };
    let mut meta = image_lora_metadata(
        plan,
        (base, "https://github.com/Lightricks/LTX-2"),
        &[("modelspec.architecture", "ltx-2/lora")],
    );
    let mode = if joint {
        "text_to_video_with_audio"
    } else {
        "text_to_video"
    };
    meta.insert("framesmith.training_mode".into(), mode.into());
    meta.insert(
        "framesmith.first_frame_conditioning_p".into(),
        conditioning_p.to_string(),
    );
    meta.insert("framesmith.model_timestep".into(), "sigma*1000".into());
    meta
}

/// Whether the run trains both streams: every item has audio latents (true), none has (false); a dataset with
/// both is refused, naming an item without audio.
fn joint_items(items: &[(TrainItem, usize)]) -> anyhow::Result<bool> {
    let with_audio = items.iter().filter(|(i, _)| i.audio.is_some()).count();
    if with_audio == 0 {
        return Ok(false);
    }
    if let Some((item, _)) = items.iter().find(|(i, _)| i.audio.is_none()) {
        anyhow::bail!(
            "{with_audio} of {} cached clips have audio latents (_ltx2_audio.safetensors) but {} has none: cache \
             audio for every clip (`framesmith cache latents` with the LTX-2 checkpoint writes it for clips with \
             sound; musubi-tuner's ltx2_cache_latents.py --ltx2_mode av) to train audio and video jointly, or remove \
             the audio caches to train video only",
            items.len(),
            item.key
        );
    }
    Ok(true)
}

/// Says what `model` (`release` on `device`) trains (both streams when `joint`) and how many of its blocks
/// stream, when some do.
fn log_model(
    model: &Ltx2Transformer,
    (release, joint, device): (&str, bool, &Device),
    log: &mut dyn FnMut(LogLevel, String),
) {
    let streams = if joint {
        "video and audio streams trained jointly from the audio latent caches"
    } else {
        "video stream trained text-to-video (no audio latent caches: audio left out)"
    };
    log(
        LogLevel::Info,
        format!("model: {release} on {}, {streams}", device_label(device)),
    );
    if let Some(streamer) = model.streamer() {
        log(
            LogLevel::Info,
            format!(
                "streaming {} of {} blocks from host RAM ({} mode, {:.1} MiB each)",
                streamer.count(),
                model.transformer_blocks.len(),
                streamer.mode().as_str(),
                streamer.block_bytes() as f64 / (1u64 << 20) as f64,
            ),
        );
    }
}

/// The run's samples (`None` without `[sampling]`): their prompts encoded by Gemma 3 from `load` with the
/// checkpoint `dit`'s connector, their VAE `model.vae` (else the checkpoint's); with sound when the run trains the
/// audio stream (`joint`: the audio VAE's decoder and vocoder from `model.vae`, else the checkpoint).
fn samples_of(
    plan: &RunPlan,
    (dit, cfg, joint): (&Path, &Ltx2Config, bool),
    (dtype, device): (DType, &Device),
    load: LoadGemma<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<Ltx2Samples>> {
    if plan.sampling.is_none() {
        return Ok(None);
    }
    let text_encoder = plan.model.text_encoder.as_deref().context(
        "LTX-2 samples need model.text_encoder (Gemma 3 12B: the google/gemma-3-12b-it folder or ComfyUI's \
         gemma_3_12B_it.safetensors); set it, or remove sampling.prompts",
    )?;
    let vae = plan.model.vae.as_deref().unwrap_or(dit);
    let sound = if joint {
        let candidates: Vec<&Path> = plan.model.vae.as_deref().into_iter().chain([dit]).collect();
        let context = "the samples of this audio-video run have sound (or remove sampling.prompts)";
        let file = sound_file(
            &candidates,
            cfg.audio_in_channels,
            "model.dit (or model.vae)",
        )
        .context(context)?;
        muxer().context(context)?;
        Some(file)
    } else {
        None
    };
    let files = SampleFilesIn {
        dit,
        vae,
        text_encoder,
        sound,
    };
    clip_samples(plan, files, (dtype, device), load, log)
}

/// Builds an LTX-2 run's part from a validated plan whose `model.dit` is the transformer `dit`.
pub(super) fn start_run(
    plan: &RunPlan,
    dit: &Path,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    start_run_with(plan, dit, &load_gemma, log)
}

/// [`start_run`] with the samples' Gemma 3 from `load`.
pub(crate) fn start_run_with(
    plan: &RunPlan,
    dit: &Path,
    load: LoadGemma<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    let cfg = dit_config(dit)?;
    let DatasetSource::Config(dataset) = &plan.dataset.source else {
        anyhow::bail!(
            "an LTX-2 run trains on a dataset config: set dataset.config to a musubi-tuner dataset TOML cached \
             with the LTX-2 branch's ltx2_cache_latents.py and ltx2_cache_text_encoder_outputs.py"
        );
    };
    let device = device_for(plan)?;
    let unreadable = Unreadable::skip_if(plan.dataset.skip_unreadable);
    let cached = load_ltx2_items((dataset, unreadable), &cfg, &device)?;
    for line in &cached.skipped {
        log(LogLevel::Warn, line.clone());
    }
    let joint = joint_items(&cached.items)?;
    if joint {
        cfg.validate_audio()
            .map_err(|e| anyhow::anyhow!("model.dit: {e}: {}", dit.display()))?;
    }
    // Planned before the reservation and the DiT take the card's memory.
    let conditioning_p = first_frame_conditioning_p(&plan.config);
    let model = || {
        memory_plan::PlanModel::new(Ltx2PlanModel {
            config: cfg.clone(),
            audio: joint,
            vae: PlanVae::of_file(plan.model.vae.as_deref().unwrap_or(dit)),
            first_frame_conditioning: conditioning_p > 0.0,
            sound: joint
                .then(|| {
                    let files: Vec<&Path> =
                        plan.model.vae.as_deref().into_iter().chain([dit]).collect();
                    PlanSound::of_files(&files)
                })
                .flatten(),
        })
    };
    let memory = memory_report(plan, model, VAE.largest_clip(&cached)?, &device);
    if let Some(report) = memory.as_ref().and_then(|m| m.as_ref().ok()) {
        log_plan(report, log);
    }
    let vram_reservation = reserve_budget(plan, &device)?;
    let dtype = float_dtype(plan.model.compute_dtype);
    let fp8 = plan.model.fp8_scale.map(memory_plan::fp8_scale);
    // Before the DiT: Gemma's memory is free again by the time the DiT takes its own.
    let samples = samples_of(plan, (dit, &cfg, joint), (dtype, &device), load, log)?;
    let release = cfg.version().name();
    let model_line = format!("{release} has {} blocks", cfg.num_layers);
    let (streamed, offload): (Vec<usize>, OffloadOptions) =
        blocks_to_swap(plan, &device, memory.as_ref(), cfg.num_layers, &model_line)?
            .map(|(count, offload)| (spread_streamed_blocks(cfg.num_layers, count), offload))
            .unwrap_or_default();
    let (_, mut model) = load_streamed_av(
        dit,
        (dtype, &device),
        (fp8, plan.model.fp8_matmul),
        (&streamed, &offload),
        joint,
    )?;
    log_model(&model, (release, joint, &device), log);
    let (train, validation) = split_items(plan, cached.items, release)?;
    let data = TrainSet::new(train, cached.batch_size, 1, plan.training.seed)?;
    let loras = attach_model_loras(&mut model, &lora_spec(plan))?;
    start_loras(
        plan,
        &loras,
        &device,
        "an LTX-2 LoRA .safetensors with this run's modules (one Framesmith or the official trainer saved)",
        log,
    )?;
    Ok(RunParts {
        family: Box::new(
            Ltx2Run::new(model, dtype, samples).with_batch(BatchOptions {
                first_frame_conditioning_p: conditioning_p,
            }),
        ),
        loras,
        data,
        metadata: ltx2_lora_metadata(plan, &cfg, (joint, conditioning_p)),
        validation,
        report: memory.and_then(Result::ok),
        vram_reservation,
        activation_buffers: None,
    })
}
