//! A HunyuanVideo 1.5 run's part built from a validated plan whose `model.dit` is a HunyuanVideo 1.5 transformer:
//! the DiT (in FP8 and streamed as the plan says), LoRA on musubi-tuner's targets under its names, items from
//! `_hv15` caches (held-out items when the run validates), the memory plan (which picks `blocks_to_swap =
//! "auto"`), samples during training (their prompts and, image-to-video, start images encoded before the DiT
//! loads), and the LoRA metadata musubi-tuner writes for HunyuanVideo 1.5.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device};

use super::encoder::{load_qwen, LoadQwen};
use super::items::{load_hv15_items, ItemReader, VAE};
use super::plan::Hv15PlanModel;
use super::run::Hv15Run;
use super::samples::{clip_samples, Hv15Samples};
use super::train::dit_config;
use crate::family::image::items::split_items;
use crate::family::image::setup::{image_lora_metadata, memory_report, streamed_blocks_of};
use crate::plan as memory_plan;
use crate::train::data::TrainSet;
use crate::train::setup::{
    device_for, device_label, float_dtype, log_plan, lora_spec, reserve_budget, start_loras,
    RunParts,
};
use framesmith_config::plan::DatasetSource;
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::Unreadable;
use framesmith_models::hunyuan_video15::weights::load_dit_streamed;
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;
use framesmith_models::trainable::attach_model_loras;
use framesmith_nn::device::VramUse;

/// The name runs and LoRA metadata give the base model: musubi-tuner's `ss_base_model_version` for HunyuanVideo
/// 1.5.
const BASE_VERSION: &str = "hunyuan_video_1_5";

/// The LoRA file's metadata: every family's keys with what musubi-tuner writes for HunyuanVideo 1.5 (its network
/// module, `ss_base_model_version` and modelspec architecture `hunyuan-video-1.5/lora`), and whether it trained
/// image-to-video (`i2v`) or text-to-video.
pub(crate) fn hv15_lora_metadata(plan: &RunPlan, i2v: bool) -> HashMap<String, String> {
    let mut meta = image_lora_metadata(
        plan,
        (
            BASE_VERSION,
            "https://github.com/Tencent-Hunyuan/HunyuanVideo-1.5",
        ),
        &[
            ("ss_network_module", "networks.lora_hv_1_5"),
            ("modelspec.architecture", "hunyuan-video-1.5/lora"),
        ],
    );
    let mode = if i2v {
        "image_to_video"
    } else {
        "text_to_video"
    };
    meta.insert("framesmith.training_mode".into(), mode.into());
    meta
}

/// Says how many of `model`'s blocks stream, when some do.
fn log_streaming(model: &HunyuanVideo15Transformer, log: &mut dyn FnMut(LogLevel, String)) {
    if let Some(streamer) = model.streamer() {
        log(
            LogLevel::Info,
            format!(
                "streaming {} of {} blocks from host RAM ({} mode, {:.1} MiB each)",
                streamer.count(),
                model.double_blocks.len(),
                streamer.mode().as_str(),
                streamer.block_bytes() as f64 / (1u64 << 20) as f64,
            ),
        );
    }
}

/// The run's samples (`None` without `[sampling]`), their prompts encoded by the encoders `load` gives, their VAE
/// tiled for the run's VRAM budget (else the card) and, for an image-to-video run, their start images encoded.
fn samples_of(
    plan: &RunPlan,
    i2v: bool,
    (dtype, device): (DType, &Device),
    load: LoadQwen<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<Hv15Samples>> {
    if plan.sampling.is_none() {
        return Ok(None);
    }
    let vram_bytes = plan
        .memory
        .vram_budget_bytes
        .unwrap_or_else(|| VramUse::measure(device, 0).map_or(u64::MAX, |u| u.free + u.reserved));
    clip_samples(plan, i2v, (dtype, device, vram_bytes), load, log)
}

/// Builds a HunyuanVideo 1.5 run's part from a validated plan whose `model.dit` is the transformer `dit`.
pub(super) fn start_run(
    plan: &RunPlan,
    dit: &Path,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    start_run_with(plan, dit, &load_qwen, log)
}

/// [`start_run`] with the samples' Qwen2.5-VL from `load`.
pub(crate) fn start_run_with(
    plan: &RunPlan,
    dit: &Path,
    load: LoadQwen<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    let cfg = dit_config(dit)?;
    let DatasetSource::Config(dataset) = &plan.dataset.source else {
        anyhow::bail!(
            "a HunyuanVideo 1.5 run trains on a dataset config: set dataset.config to a musubi-tuner dataset TOML \
             cached with hv_1_5_cache_latents.py and hv_1_5_cache_text_encoder_outputs.py"
        );
    };
    let device = device_for(plan)?;
    let unreadable = Unreadable::skip_if(plan.dataset.skip_unreadable);
    let reader = ItemReader {
        cfg: &cfg,
        mode: plan.training.mode,
        device: &device,
    };
    let cached = load_hv15_items((dataset, unreadable), reader)?;
    let i2v = cached.items.iter().any(|(item, _)| item.image.is_some());
    for line in &cached.skipped {
        log(LogLevel::Warn, line.clone());
    }
    // Planned before the reservation and the DiT take the card's memory.
    let model = || {
        memory_plan::PlanModel::new(Hv15PlanModel {
            config: cfg.clone(),
            i2v,
        })
    };
    let memory = memory_report(plan, model, VAE.largest_clip(&cached)?, &device);
    if let Some(report) = memory.as_ref().and_then(|m| m.as_ref().ok()) {
        log_plan(report, log);
    }
    let vram_reservation = reserve_budget(plan, &device)?;
    let dtype = float_dtype(plan.model.compute_dtype);
    let fp8 = plan.model.fp8_scale.map(memory_plan::fp8_scale);
    // Before the DiT: the text encoders' memory is free again by the time the DiT takes its own.
    let samples = samples_of(plan, i2v, (dtype, &device), load, log)?;
    let blocks = cfg.num_layers;
    let model_line = format!("HunyuanVideo 1.5 has {blocks} double-stream blocks");
    let (streamed, offload) =
        streamed_blocks_of(plan, &device, memory.as_ref(), blocks, &model_line)?;
    let mut model = load_dit_streamed(
        dit,
        (dtype, &device),
        fp8,
        plan.model.fp8_matmul,
        (&streamed, &offload),
    )?;
    let task = if i2v { "image" } else { "text" };
    log(
        LogLevel::Info,
        format!(
            "model: HunyuanVideo 1.5 on {}, trained {task}-to-video",
            device_label(&device)
        ),
    );
    log_streaming(&model, log);
    let (train, validation) = split_items(plan, cached.items, "HunyuanVideo 1.5")?;
    let data = TrainSet::new(train, cached.batch_size, 1, plan.training.seed)?;
    let loras = attach_model_loras(&mut model, &lora_spec(plan))?;
    start_loras(
        plan,
        &loras,
        &device,
        "a HunyuanVideo 1.5 LoRA .safetensors with this run's modules (one Framesmith or musubi-tuner saved)",
        log,
    )?;
    Ok(RunParts {
        family: Box::new(Hv15Run::new(model, dtype, samples)),
        loras,
        data,
        metadata: hv15_lora_metadata(plan, i2v),
        validation,
        report: memory.and_then(Result::ok),
        vram_reservation,
        activation_buffers: None,
    })
}
