//! What an image family's run setup shares: the memory plan of a CUDA run, made before the DiT takes device
//! memory, the DiT blocks the run streams, and the LoRA file's metadata of a text-to-image run.

use std::collections::HashMap;

use candle_core::Device;

use super::plan::spread_streamed_blocks;
use crate::plan::{plan_run, ClipShape, PlanModel};
use crate::train::setup::{blocks_to_swap, lora_metadata, MemoryReport};
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::RunPlan;
use framesmith_nn::offload::OffloadOptions;

/// The memory plan of a CUDA run of `model` (`None` elsewhere, or when the plan does not apply), made before the
/// DiT takes device memory: it picks `blocks_to_swap = "auto"` and words the out-of-memory advice.
pub(crate) fn memory_report(
    plan: &RunPlan,
    model: impl FnOnce() -> PlanModel,
    clip: ClipShape,
    device: &Device,
) -> Option<Result<PlanReport, String>> {
    if !(device.is_cuda() && plan.memory.applies) {
        return None;
    }
    Some(plan_run(plan, model(), clip).map_err(|e| e.to_string()))
}

/// The blocks of a DiT of `num_blocks` blocks that the run streams, spread evenly ([`spread_streamed_blocks`]), and
/// the ring settings: [`blocks_to_swap`]'s count, its refusals naming the model by `model_line` ("Qwen-Image has 60
/// dual-stream blocks"); no block when nothing streams.
pub(crate) fn streamed_blocks_of(
    plan: &RunPlan,
    device: &Device,
    memory: Option<&MemoryReport>,
    num_blocks: usize,
    model_line: &str,
) -> anyhow::Result<(Vec<usize>, OffloadOptions)> {
    Ok(
        blocks_to_swap(plan, device, memory, num_blocks, model_line)?
            .map(|(count, offload)| (spread_streamed_blocks(num_blocks, count), offload))
            .unwrap_or_default(),
    )
}

/// The LoRA file's metadata of an image family's text-to-image run: every family's keys ([`lora_metadata`] with
/// the base model's name and its official code), the family's `entries` (its network module, modelspec
/// architecture, …), the model timestep `t+0.001`, and the timestep sampling in musubi-tuner's spelling
/// (`flux_shift`, `qwen_shift`), as the config takes it.
pub(crate) fn image_lora_metadata(
    plan: &RunPlan,
    (base_name, implementation): (&str, &str),
    entries: &[(&str, &str)],
) -> HashMap<String, String> {
    let mut meta = lora_metadata(plan, base_name, implementation);
    let common = [
        ("framesmith.model_timestep", "t+0.001"),
        ("framesmith.training_mode", "text_to_image"),
    ];
    for (key, value) in entries.iter().chain(&common) {
        meta.insert((*key).into(), (*value).into());
    }
    if let Ok(serde_json::Value::String(name)) =
        serde_json::to_value(plan.training.timesteps.sampling)
    {
        meta.insert("ss_timestep_sampling".into(), name);
    }
    meta
}
