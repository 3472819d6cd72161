//! The placements a plan chooses where `[memory]` leaves them to the planner (`"auto"`): how streamed blocks reach
//! the GPU (`memory.streaming`: page-locked masters or a small page-locked staging ring), where saved activations
//! wait (`memory.activations`: the GPU, page-locked or pageable RAM) and how much of each block's forward the step
//! keeps (`memory.checkpointing`: fewer kept values, more recompute). Every combination the settings allow is
//! planned with the fewest streamed blocks that fit the VRAM (or the configured count); the fastest one whose VRAM,
//! RAM and page-locked RAM all fit their limits wins (leaving a margin of the RAM free when one can), so `"auto"`
//! never picks a plan that swaps. Also which limit binds: the one that ruled out the next faster combination.

use super::ram::{pinned_limit, ram_limit};
use super::{auto_margin_bytes, sampling, PlanInput};
use super::{blocks_to_swap, run_peak, sampling_phase, sizes, step_lines, sum_of, PlanError};
use framesmith_config::protocol::memory::{Limit, Placement, Placements};
use framesmith_config::run::{ActivationPlacement, Checkpointing, StreamingMode};

/// The plan's choice: the input with every placement settled, its streamed block count (as
/// [`blocks_to_swap`] gives it) and the limit that binds.
pub(super) struct Choice {
    /// `input` with `streaming.mode`, `streaming.activations` and `checkpointing` settled (none `Auto`;
    /// activations `Device`, `Pinned` or `Pageable`).
    pub input: PlanInput,
    pub blocks: (usize, bool, Option<String>),
    pub binding: Option<Limit>,
    pub placements: Placements,
}

/// One combination of placements, planned.
struct Planned {
    input: PlanInput,
    blocks: (usize, bool, Option<String>),
    /// The limits it does not fit, in the order VRAM, RAM, page-locked RAM.
    over: Vec<Limit>,
    /// The limits whose margin it does not leave free: the VRAM's (`auto_margin_bytes`) and the RAM's
    /// ([`ram_margin_bytes`]), both only where known.
    tight: Vec<Limit>,
    /// What the step costs beyond its compute, smaller first ([`cost`]).
    cost: (u8, u64),
    ram: u64,
}

/// Chooses the placements of `input` against the VRAM `budget` and the RAM limits (see the module doc). With
/// nothing left to the planner it plans the settings as they are; when no combination fits, it keeps one that
/// fits the card if any does, missing the fewest other limits by the least RAM, so the report says what does
/// not fit.
pub(super) fn choose(input: &PlanInput, budget: Option<u64>) -> Result<Choice, PlanError> {
    let mut planned = candidates(input)
        .into_iter()
        .map(|c| plan_candidate(c, budget))
        .collect::<Result<Vec<_>, _>>()?;
    // Stable: equal costs keep the order of `candidates` (the settings' own order of preference).
    planned.sort_by_key(|p| p.cost);
    // The fastest that leaves the margins free; failing that, the fastest that fits at all.
    let fits = planned
        .iter()
        .position(|p| p.over.is_empty() && p.tight.is_empty())
        .or_else(|| planned.iter().position(|p| p.over.is_empty()));
    let (index, binding) = match fits {
        Some(i) => (i, binding(&planned[..i], &planned[i])),
        None => {
            // The card is what it is: the one that fits it and misses the fewest other limits by the least RAM.
            let leanest = (0..planned.len())
                .min_by_key(|&i| {
                    let p = &planned[i];
                    (p.over.contains(&Limit::Vram), p.over.len(), p.ram)
                })
                .unwrap_or(0);
            (leanest, planned[leanest].over.first().copied())
        }
    };
    let chosen = planned.swap_remove(index);
    let placements = placements_of(input, &chosen.input, chosen.blocks.0);
    Ok(Choice {
        input: chosen.input,
        blocks: chosen.blocks,
        binding,
        placements,
    })
}

/// The limit that binds a plan that fits (`chosen`, after the faster `faster`): a RAM limit when it alone ruled
/// out a faster combination (one that fits the card), else the VRAM when it ruled one out or set the streamed
/// block count, else none.
fn binding(faster: &[Planned], chosen: &Planned) -> Option<Limit> {
    let ram_bound = faster.iter().find_map(|p| {
        let missed = p.over.iter().chain(&p.tight);
        let by_vram = p.over.contains(&Limit::Vram) || p.tight.contains(&Limit::Vram);
        (!by_vram).then(|| missed.copied().next()).flatten()
    });
    let streams = chosen.blocks.0 > 0 && chosen.blocks.1;
    ram_bound.or((streams || !faster.is_empty()).then_some(Limit::Vram))
}

/// Every combination the settings allow, each as a settled input, in the settings' order of preference.
fn candidates(input: &PlanInput) -> Vec<PlanInput> {
    let mut out = Vec::new();
    for checkpointing in checkpointing_options(input) {
        for mode in streaming_options(input) {
            for saved in saved_options(input, mode, checkpointing) {
                let mut c = input.clone();
                c.checkpointing = checkpointing;
                c.streaming.mode = mode;
                c.streaming.activations = saved;
                out.push(c);
            }
        }
    }
    out
}

/// `memory.checkpointing`'s options: `"auto"` weighs keeping self-attention outputs and their projection (the
/// fastest checkpointed steps), the outputs alone, and the block inputs alone (the least memory). It never picks
/// `"off"`, whose tapes cannot leave the GPU. A CPU run's `"auto"` keeps block inputs only.
fn checkpointing_options(input: &PlanInput) -> Vec<Checkpointing> {
    match input.checkpointing {
        Checkpointing::Auto if input.on_cpu => vec![Checkpointing::Blocks],
        Checkpointing::Auto => vec![
            Checkpointing::AttentionProjection,
            Checkpointing::Attention,
            Checkpointing::Blocks,
        ],
        fixed => vec![fixed],
    }
}

/// `memory.streaming`'s options: `"auto"` weighs page-locked masters against the staging ring (not the ring when
/// there are no staging slots, nor on the CPU, where nothing streams).
fn streaming_options(input: &PlanInput) -> Vec<StreamingMode> {
    match input.streaming.mode {
        StreamingMode::Auto if input.on_cpu => vec![StreamingMode::Off],
        StreamingMode::Auto if input.streaming.staging_slots == 0 => vec![StreamingMode::Pinned],
        StreamingMode::Auto => vec![StreamingMode::Pinned, StreamingMode::Staged],
        fixed => vec![fixed],
    }
}

/// `memory.activations`' options with streaming `mode`: `"host"` is page-locked RAM, pageable with `staged`
/// streaming (whose promise is little page-locked memory); `"auto"` weighs the GPU, page-locked and pageable RAM.
/// Without checkpointing the tapes hold the inputs on the GPU, so only the GPU is an option.
fn saved_options(
    input: &PlanInput,
    mode: StreamingMode,
    checkpointing: Checkpointing,
) -> Vec<ActivationPlacement> {
    use ActivationPlacement::{Auto, Device, Host, Pageable, Pinned};
    if checkpointing == Checkpointing::Off || input.on_cpu {
        return vec![Device];
    }
    match input.streaming.activations {
        Auto => vec![Device, Pinned, Pageable],
        Host if mode == StreamingMode::Staged => vec![Pageable],
        Host => vec![Pinned],
        fixed => vec![fixed],
    }
}

/// Plans one settled combination: its block count, peaks, the limits it misses and its cost.
fn plan_candidate(input: PlanInput, budget: Option<u64>) -> Result<Planned, PlanError> {
    let blocks = blocks_to_swap(&input, budget)?;
    let s = sizes(&input)?;
    let (phase, _) = sampling_phase(&input);
    let lines = step_lines(&input, &s, phase.as_ref(), blocks.0);
    let sampling = phase
        .as_ref()
        .map(|p| sampling::sampling_lines(&input, &s, p, blocks.0));
    let host = |keep: &dyn Fn(Placement) -> bool| {
        let step = sum_of(&lines, keep);
        sampling
            .as_ref()
            .map_or(step, |l| step.max(sum_of(l, keep)))
    };
    // A CPU run keeps every line in RAM.
    let ram = host(&|p| input.on_cpu || p.is_host());
    let pinned = sum_of(&lines, &|p| p == Placement::HostPinned);
    let vram = run_peak(&input, &s, phase.as_ref(), blocks.0);
    let ranks = input.ranks_on_machine.max(1) as u64;
    let mut tight = Vec::new();
    if budget.is_some_and(|b| vram > b.saturating_sub(auto_margin_bytes(b))) {
        tight.push(Limit::Vram);
    }
    if ram_limit(&input).is_some_and(|(limit, _)| {
        ram.saturating_mul(ranks) > limit.saturating_sub(ram_margin_bytes(limit))
    }) {
        tight.push(Limit::Ram);
    }
    let mut over = Vec::new();
    if !input.on_cpu && budget.is_some_and(|b| vram > b) {
        over.push(Limit::Vram);
    }
    if ram_limit(&input).is_some_and(|(limit, _)| ram.saturating_mul(ranks) > limit) {
        over.push(Limit::Ram);
    }
    if !input.on_cpu && pinned_limit(&input).is_some_and(|l| pinned.saturating_mul(ranks) > l) {
        over.push(Limit::PinnedRam);
    }
    let cost = cost(
        input.checkpointing,
        sum_of(&lines, &|p| p == Placement::Host),
        pinned,
    );
    Ok(Planned {
        input,
        blocks,
        over,
        tight,
        cost,
        ram,
    })
}

/// The RAM `auto` leaves free below a RAM limit of `limit` bytes when it can: the process holds more than the
/// plan's lines (the CUDA runtime, the code, the loaders' buffers), and `framesmith train` runs measured 0.8–1.6
/// GiB above the plan's RAM (bench/RESULTS.md).
pub const RAM_MARGIN_MIN_BYTES: u64 = 3 << 29;

/// [`RAM_MARGIN_MIN_BYTES`], or 4% of the limit when that is more.
pub fn ram_margin_bytes(limit: u64) -> u64 {
    (limit / 100 * 4).max(RAM_MARGIN_MIN_BYTES)
}

/// What a combination costs beyond the step's compute, to order them fastest first: first the recompute its
/// checkpointing leaves (kept values skip part of it: about 11% of a 14B step for kept attention), then the
/// host-device copies of a step, weighted by their speed. Everything in RAM crosses the bus twice a step
/// (streamed blocks in for the forward and the backward, saved activations out and back), and a copy from
/// pageable memory goes through the driver's staging buffers at well under the page-locked rate (weighted
/// 5 : 2). A proxy, not a timing: copies overlap the compute, so it ranks, it does not predict.
fn cost(checkpointing: Checkpointing, pageable_bytes: u64, pinned_bytes: u64) -> (u8, u64) {
    let recompute = match checkpointing {
        Checkpointing::Off => 0,
        Checkpointing::AttentionProjection => 1,
        Checkpointing::Attention => 2,
        Checkpointing::Blocks | Checkpointing::Auto => 3,
    };
    let copies = pageable_bytes
        .saturating_mul(5)
        .saturating_add(pinned_bytes.saturating_mul(2));
    (recompute, copies)
}

/// The report's placements of the settled `chosen` (of `input`, the settings), with `blocks` streamed.
fn placements_of(input: &PlanInput, chosen: &PlanInput, blocks: usize) -> Placements {
    let mut keys = Vec::new();
    if input.streaming.mode == StreamingMode::Auto {
        keys.push("memory.streaming".to_string());
    }
    if input.streaming.activations == ActivationPlacement::Auto {
        keys.push("memory.activations".to_string());
    }
    if input.checkpointing == Checkpointing::Auto {
        keys.push("memory.checkpointing".to_string());
    }
    let streaming = if blocks == 0 {
        StreamingMode::Off
    } else {
        chosen.streaming.mode
    };
    Placements {
        streaming,
        saved: saved_placement(chosen),
        checkpointing: chosen.checkpointing,
        chosen: keys,
    }
}

/// Where an input's saved block inputs wait, for its lines (`activations::kept_lines`) and the report. `"host"`
/// is page-locked RAM, except with `staged` streaming, whose promise is little page-locked memory; an unsettled
/// `"auto"` (a caller that plans without choosing) is planned as `"host"`.
pub(super) fn saved_placement(input: &PlanInput) -> Placement {
    use ActivationPlacement::{Auto, Device, Host, Pageable, Pinned};
    if input.on_cpu || input.checkpointing == Checkpointing::Off {
        return Placement::Device;
    }
    let staged = input.streaming.mode == StreamingMode::Staged;
    match input.streaming.activations {
        Device => Placement::Device,
        Pageable => Placement::Host,
        Host | Auto if staged => Placement::Host,
        Host | Pinned | Auto => Placement::HostPinned,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
