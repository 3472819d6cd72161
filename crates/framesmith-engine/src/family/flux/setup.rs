//! A FLUX.1 [dev] run's part built from a validated plan whose `model.dit` is a FLUX.1 file: the FLUX.1 DiT, LoRA
//! on its double- and single-stream blocks under sd-scripts' names, items from `_flux` caches, block streaming
//! over both block kinds in `memory.flux_stream_order`, the memory plan (which picks `blocks_to_swap = "auto"`),
//! and samples during training ([`crate::family::flux::samples`]); the trainer does the rest as for any family,
//! the micro-step being [`crate::family::flux::run`]'s. The Wan-only
//! settings a FLUX.1 run cannot take (validation among them, for now) are refused by the config validator
//! (`validate_for` with the FLUX.1 family) before this runs.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;

use crate::family::flux::run::FluxRun;
use crate::family::flux::samples::image_samples;
use crate::family::flux::train::{load_flux_items, train_dit};
use crate::family::image::items::{largest_clip, repeated};
use crate::family::image::setup::{image_lora_metadata, memory_report};
use crate::plan as memory_plan;
use crate::train::data::TrainSet;
use crate::train::setup::{
    blocks_to_swap, device_for, device_label, float_dtype, log_plan, lora_spec, reserve_budget,
    start_loras, RunParts,
};
use framesmith_config::plan::DatasetSource;
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::Unreadable;
use framesmith_models::flux::weights::{load_dit_streamed, FluxVariant};
use framesmith_models::flux::{Flux, FluxConfig};
use framesmith_models::trainable::attach_model_loras;
use framesmith_nn::offload::OffloadOptions;

/// Pixels per latent pixel of the FLUX.1 autoencoder.
const AUTOENCODER_FACTOR: usize = 8;

/// The name runs and LoRA metadata give the base model.
const BASE_NAME: &str = "FLUX.1 [dev]";

/// The LoRA file's metadata: every family's keys with FLUX.1's network module, architecture and numerics.
fn flux_lora_metadata(plan: &RunPlan) -> HashMap<String, String> {
    image_lora_metadata(
        plan,
        (BASE_NAME, "https://github.com/black-forest-labs/flux"),
        &[
            ("ss_network_module", "networks.lora_flux"),
            ("modelspec.architecture", "flux-1-dev/lora"),
            ("ss_guidance_scale", "1.0"),
        ],
    )
}

/// The streamed blocks (`memory.flux_stream_order`) and ring settings of a CUDA FLUX.1 run, the count from the
/// memory plan when it is `"auto"`; `None` when nothing streams (streaming off, a CPU run, or no block to stream).
fn flux_streaming(
    plan: &RunPlan,
    cfg: &FluxConfig,
    device: &Device,
    memory: Option<&Result<PlanReport, String>>,
) -> anyhow::Result<Option<(Vec<usize>, OffloadOptions)>> {
    let blocks = cfg.depth + cfg.depth_single_blocks;
    let model = format!(
        "FLUX.1 has {blocks} blocks ({} double-stream, {} single-stream)",
        cfg.depth, cfg.depth_single_blocks
    );
    Ok(
        blocks_to_swap(plan, device, memory, blocks, &model)?.map(|(blocks_to_swap, offload)| {
            (
                super::plan::flux_streamed_blocks(
                    cfg,
                    blocks_to_swap,
                    plan.memory.flux_stream_order,
                ),
                offload,
            )
        }),
    )
}

/// Says how many blocks of each kind stream, when some do.
fn log_flux_streaming(model: &Flux, plan: &RunPlan, log: &mut dyn FnMut(LogLevel, String)) {
    let cfg = model.config();
    for streamer in model.streamers() {
        let double = (0..cfg.depth).any(|i| streamer.is_streamed(i));
        let (kind, of) = if double {
            ("double-stream", cfg.depth)
        } else {
            ("single-stream", cfg.depth_single_blocks)
        };
        log(
            LogLevel::Info,
            format!(
                "streaming {} of {of} {kind} blocks from host RAM ({} mode, {:.1} MiB each; order {})",
                streamer.count(),
                streamer.mode().as_str(),
                streamer.block_bytes() as f64 / (1u64 << 20) as f64,
                plan.memory.flux_stream_order.as_str()
            ),
        );
    }
}

/// Builds a FLUX.1 [dev] run's part from a validated plan whose `model.dit` is the FLUX.1 file `dit`.
pub(super) fn start_run(
    plan: &RunPlan,
    dit: &Path,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    let (cfg, variant) = train_dit(dit)?;
    let DatasetSource::Config(dataset) = &plan.dataset.source else {
        anyhow::bail!(
            "a FLUX.1 run trains on a dataset config: set dataset.config to a musubi-tuner image dataset TOML \
             (dataset.synthetic is for the demo model)"
        );
    };
    let device = device_for(plan)?;
    let unreadable = Unreadable::skip_if(plan.dataset.skip_unreadable);
    let cached = load_flux_items((dataset, unreadable), (&cfg, variant), &device)?;
    for line in &cached.skipped {
        log(LogLevel::Warn, line.clone());
    }
    // Planned before the reservation and the DiT take the card's memory.
    let model = || {
        memory_plan::PlanModel::new(super::plan::FluxPlanModel {
            config: cfg.clone(),
            order: plan.memory.flux_stream_order,
        })
    };
    let clip = largest_clip(&cached, AUTOENCODER_FACTOR)?;
    let memory = memory_report(plan, model, clip, &device);
    if let Some(Ok(report)) = &memory {
        log_plan(report, log);
    }
    let vram_reservation = reserve_budget(plan, &device)?;
    let dtype = float_dtype(plan.model.compute_dtype);
    let fp8 = plan.model.fp8_scale.map(memory_plan::fp8_scale);
    // Before the DiT: the text encoders' memory is free again by the time the DiT takes its own.
    let samples = image_samples(plan, (&cfg, variant), (dtype, &device), log)?;
    let (streamed, offload) =
        flux_streaming(plan, &cfg, &device, memory.as_ref())?.unwrap_or_default();
    let mut model = load_dit_streamed(
        dit,
        Some(variant),
        (dtype, &device),
        fp8,
        plan.model.fp8_matmul,
        (&streamed, &offload),
    )?;
    log(
        LogLevel::Info,
        format!("model: {BASE_NAME} on {}", device_label(&device)),
    );
    let mode = match variant {
        FluxVariant::Kontext => "edit (FLUX.1 Kontext [dev], a control image per item)",
        _ => "text-to-image",
    };
    log(
        LogLevel::Info,
        format!("training mode: {mode}, guidance 1.0"),
    );
    log_flux_streaming(&model, plan, log);
    let data = TrainSet::new(
        repeated(cached.items),
        cached.batch_size,
        1,
        plan.training.seed,
    )?;
    let loras = attach_model_loras(&mut model, &lora_spec(plan))?;
    start_loras(
        plan,
        &loras,
        &device,
        "a FLUX.1 [dev] LoRA .safetensors with this run's modules (one Framesmith, musubi-tuner or sd-scripts \
         saved)",
        log,
    )?;
    Ok(RunParts {
        family: Box::new(FluxRun::new(model, dtype, samples)),
        loras,
        data,
        metadata: flux_lora_metadata(plan),
        validation: None,
        report: memory.and_then(Result::ok),
        vram_reservation,
        activation_buffers: None,
    })
}
