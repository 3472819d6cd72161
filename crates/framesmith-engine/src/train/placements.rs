//! The placements a run uses: `[memory]`'s own values, or the memory plan's choice where they say `"auto"` (as
//! `blocks_to_swap = "auto"` takes the plan's count). On a CUDA run an `"auto"` placement without a plan fails
//! rather than guess; where placements do not apply (a CPU run), `"auto"` is the least memory.

use candle_core::Device;

use super::setup::MemoryReport;
use framesmith_config::plan::MemoryPlan;
use framesmith_config::protocol::memory::{Placement, PlanReport};
use framesmith_config::run::{ActivationPlacement, Checkpointing, StreamingMode};
use framesmith_config::RunPlan;
use framesmith_nn::offload::{SavedPlacement, StreamMode};

/// How streamed blocks reach the GPU on a CUDA run (`memory.streaming`, the plan's choice for `"auto"`); `None`
/// when nothing streams.
pub(crate) fn stream_mode(
    m: &MemoryPlan,
    memory: Option<&MemoryReport>,
) -> anyhow::Result<Option<StreamMode>> {
    let mode = match m.streaming {
        StreamingMode::Auto => match memory {
            Some(Ok(report)) => chosen(report, "memory.streaming")?.streaming,
            Some(Err(e)) => anyhow::bail!("planning memory for streaming = \"auto\": {e}"),
            None => anyhow::bail!("streaming = \"auto\" needs the run's memory plan"),
        },
        fixed => fixed,
    };
    Ok(match mode {
        StreamingMode::Pinned => Some(StreamMode::Pinned),
        StreamingMode::Staged => Some(StreamMode::Staged),
        StreamingMode::Off | StreamingMode::Auto => None,
    })
}

/// Where the step keeps saved block inputs on `device`: the plan's placement when there is a plan (it settles
/// `"host"` by the streaming mode and `"auto"` by the budgets), else `memory.activations` itself (`"host"`:
/// pageable with `staged` streaming, whose promise is little page-locked memory, else page-locked).
pub(crate) fn saved_inputs_for(
    plan: &RunPlan,
    device: &Device,
    report: Option<&PlanReport>,
) -> anyhow::Result<SavedPlacement> {
    if !(plan.memory.applies && device.is_cuda()) {
        return Ok(SavedPlacement::Device);
    }
    saved_at(&plan.memory, report)
}

/// [`saved_inputs_for`] on a CUDA device.
pub(crate) fn saved_at(
    m: &MemoryPlan,
    report: Option<&PlanReport>,
) -> anyhow::Result<SavedPlacement> {
    use ActivationPlacement::{Auto, Device as OnDevice, Host, Pageable, Pinned};
    if m.activations == OnDevice {
        return Ok(SavedPlacement::Device);
    }
    if let Some(placements) = report.and_then(|r| r.placements.as_ref()) {
        return Ok(match placements.saved {
            Placement::Device => SavedPlacement::Device,
            Placement::Host => SavedPlacement::Pageable,
            Placement::HostPinned => SavedPlacement::PageLocked,
        });
    }
    Ok(match (m.activations, m.streaming) {
        (Pageable, _) | (Host, StreamingMode::Staged) => SavedPlacement::Pageable,
        (Pinned, _) | (Host, StreamingMode::Off | StreamingMode::Pinned) => SavedPlacement::PageLocked,
        (Auto, _) | (Host, StreamingMode::Auto) => anyhow::bail!(
            "memory.activations = \"{}\" with memory.streaming = \"{}\" needs the run's memory plan, which could not \
             be made (see the log): name the placement (\"device\", \"pinned\" or \"pageable\")",
            activations_name(m.activations),
            streaming_name(m.streaming),
        ),
        (OnDevice, _) => SavedPlacement::Device,
    })
}

/// What the step keeps from each block's forward: the plan's choice where there is one, else
/// `memory.checkpointing` (`"auto"` without a plan: block inputs only, the least memory).
pub(crate) fn checkpointing_for(m: &MemoryPlan, report: Option<&PlanReport>) -> Checkpointing {
    match (m.checkpointing, report.and_then(|r| r.placements.as_ref())) {
        (Checkpointing::Auto, Some(placements)) => placements.checkpointing,
        (Checkpointing::Auto, None) => Checkpointing::Blocks,
        (fixed, _) => fixed,
    }
}

/// The plan's placements, which a plan for an `"auto"` `key` must carry.
fn chosen<'a>(
    report: &'a PlanReport,
    key: &str,
) -> anyhow::Result<&'a framesmith_config::protocol::memory::Placements> {
    report
        .placements
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{key} = \"auto\": the memory plan chose no placements"))
}

fn activations_name(a: ActivationPlacement) -> &'static str {
    match a {
        ActivationPlacement::Device => "device",
        ActivationPlacement::Host => "host",
        ActivationPlacement::Pinned => "pinned",
        ActivationPlacement::Pageable => "pageable",
        ActivationPlacement::Auto => "auto",
    }
}

fn streaming_name(s: StreamingMode) -> &'static str {
    match s {
        StreamingMode::Off => "off",
        StreamingMode::Pinned => "pinned",
        StreamingMode::Staged => "staged",
        StreamingMode::Auto => "auto",
    }
}

/// Refuses a CUDA run that leaves a placement to the planner (`"auto"`) when the plan's RAM does not fit:
/// `"auto"` never picks a plan that swaps, so with no choice that fits the run does not start.
pub(crate) fn refuse_swapping(m: &MemoryPlan, memory: Option<&MemoryReport>) -> anyhow::Result<()> {
    let auto = [
        (m.streaming == StreamingMode::Auto, "streaming"),
        (m.activations == ActivationPlacement::Auto, "activations"),
        (m.checkpointing == Checkpointing::Auto, "checkpointing"),
    ];
    let Some((_, key)) = auto.iter().find(|(is_auto, _)| *is_auto) else {
        return Ok(());
    };
    match memory {
        Some(Ok(report)) => match &report.ram_shortfall {
            Some(short) => anyhow::bail!(
                "memory.{key} = \"auto\" found no placement that fits the RAM: {short} (or set \
                 memory.ram_budget_gb if the machine can give more)"
            ),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
