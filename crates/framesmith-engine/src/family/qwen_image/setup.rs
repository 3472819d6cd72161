//! A Qwen-Image run's part built from a validated plan whose `model.dit` is a Qwen-Image transformer: the DiT (in
//! FP8 and streamed as the plan says), LoRA on musubi-tuner's targets under its names, items from `_qi` caches
//! (held-out items when the run validates), the memory plan (which picks `blocks_to_swap = "auto"`), samples during
//! training through the text-encoder seam, and the LoRA metadata musubi-tuner writes for Qwen-Image.

use std::collections::HashMap;
use std::path::Path;

use super::encoder::EncoderLoaders;
use super::plan::QwenImagePlanModel;
use super::run::QwenImageRun;
use super::samples::image_samples;
use super::train::{dit_config, load_qwen_items};
use crate::family::image::items::{largest_clip, split_items, ImageItems};
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
use framesmith_models::qwen_image::weights::load_dit_streamed;
use framesmith_models::trainable::attach_model_loras;

/// Pixels per latent pixel of Qwen-Image's VAE.
const VAE_FACTOR: usize = 8;

/// The name runs and LoRA metadata give the base model: musubi-tuner's `ss_base_model_version` for Qwen-Image.
const BASE_VERSION: &str = "qwen_image";

/// The LoRA file's metadata: every family's keys with what musubi-tuner writes for Qwen-Image (its network module,
/// `ss_base_model_version` and modelspec architecture `Qwen-Image/lora`).
pub(crate) fn qwen_lora_metadata(plan: &RunPlan) -> HashMap<String, String> {
    image_lora_metadata(
        plan,
        (BASE_VERSION, "https://github.com/QwenLM/Qwen-Image"),
        &[
            ("ss_network_module", "networks.lora_qwen_image"),
            ("modelspec.architecture", "Qwen-Image/lora"),
        ],
    )
}

/// Says when the cached items train Qwen-Image-Edit: they hold control latents.
fn log_edit_mode(cached: &ImageItems, log: &mut dyn FnMut(LogLevel, String)) {
    let controls = cached
        .items
        .first()
        .map_or(0, |(item, _)| item.control.len());
    if controls > 0 {
        log(
            LogLevel::Info,
            format!(
                "training mode: edit (Qwen-Image-Edit, {controls} control image(s) per item, their tokens after \
                 the target's)"
            ),
        );
    }
}

/// Builds a Qwen-Image run's part from a validated plan whose `model.dit` is the Qwen-Image transformer `dit`.
pub(super) fn start_run(
    plan: &RunPlan,
    dit: &Path,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    start_run_with(plan, dit, EncoderLoaders::real(), log)
}

/// [`start_run`] with the text encoders of the samples from `load`.
pub(crate) fn start_run_with(
    plan: &RunPlan,
    dit: &Path,
    load: EncoderLoaders<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    let cfg = dit_config(dit)?;
    let DatasetSource::Config(dataset) = &plan.dataset.source else {
        anyhow::bail!(
            "a Qwen-Image run trains on a dataset config: set dataset.config to a musubi-tuner image dataset TOML"
        );
    };
    let device = device_for(plan)?;
    let unreadable = Unreadable::skip_if(plan.dataset.skip_unreadable);
    let cached = load_qwen_items((dataset, unreadable), &cfg, &device)?;
    for line in &cached.skipped {
        log(LogLevel::Warn, line.clone());
    }
    // Planned before the reservation and the DiT take the card's memory.
    let model = || {
        memory_plan::PlanModel::new(QwenImagePlanModel {
            config: cfg.clone(),
        })
    };
    let memory = memory_report(plan, model, largest_clip(&cached, VAE_FACTOR)?, &device);
    if let Some(report) = memory.as_ref().and_then(|m| m.as_ref().ok()) {
        log_plan(report, log);
    }
    let vram_reservation = reserve_budget(plan, &device)?;
    let dtype = float_dtype(plan.model.compute_dtype);
    let fp8 = plan.model.fp8_scale.map(memory_plan::fp8_scale);
    // Before the DiT: the text encoder's memory is free again by the time the DiT takes its own.
    let samples = image_samples(plan, &cfg, (dtype, &device), load, log)?;
    let model_line = format!("Qwen-Image has {} dual-stream blocks", cfg.num_layers);
    let (streamed, offload) =
        streamed_blocks_of(plan, &device, memory.as_ref(), cfg.num_layers, &model_line)?;
    let mut model = load_dit_streamed(
        dit,
        (dtype, &device),
        fp8,
        plan.model.fp8_matmul,
        (&streamed, &offload),
    )?;
    log(
        LogLevel::Info,
        format!("model: Qwen-Image on {}", device_label(&device)),
    );
    log_edit_mode(&cached, log);
    if let Some(streamer) = model.streamer() {
        log(
            LogLevel::Info,
            format!(
                "streaming {} of {} blocks from host RAM ({} mode, {:.1} MiB each)",
                streamer.count(),
                cfg.num_layers,
                streamer.mode().as_str(),
                streamer.block_bytes() as f64 / (1u64 << 20) as f64,
            ),
        );
    }
    let (train, validation) = split_items(plan, cached.items, "Qwen-Image")?;
    let data = TrainSet::new(train, cached.batch_size, 1, plan.training.seed)?;
    let loras = attach_model_loras(&mut model, &lora_spec(plan))?;
    start_loras(
        plan,
        &loras,
        &device,
        "a Qwen-Image LoRA .safetensors with this run's modules (one Framesmith or musubi-tuner saved)",
        log,
    )?;
    Ok(RunParts {
        family: Box::new(QwenImageRun::new(model, dtype, samples)),
        loras,
        data,
        metadata: qwen_lora_metadata(plan),
        validation,
        report: memory.and_then(Result::ok),
        vram_reservation,
        activation_buffers: None,
    })
}
