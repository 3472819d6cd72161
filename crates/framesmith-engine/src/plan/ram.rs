//! The host-RAM limits a GPU plan must fit: the RAM (`memory.ram_budget_gb`, else what the machine can give
//! without swapping) and its page-locked part (`memory.pinned_budget_gb`; on Windows about half of RAM, where
//! page-locked memory is the "shared GPU memory"), and why a plan does not fit them, with what to change.

use super::PlanInput;
use framesmith_config::protocol::memory::format_gib;

/// Where the RAM limit a plan is checked against comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RamLimit {
    /// `memory.ram_budget_gb`.
    Budget,
    /// What the machine could give without swapping when the plan was made.
    Available,
    /// The machine's RAM (what it could give is unknown).
    Total,
}

impl RamLimit {
    /// "the RAM budget is …" in words, for a limit of `limit` bytes on a machine of `total`.
    fn describe(self, limit: u64, total: u64) -> String {
        match self {
            Self::Budget => format!(
                "the RAM budget (memory.ram_budget_gb) is {}",
                format_gib(limit)
            ),
            Self::Available => format!(
                "this machine can give {} without swapping ({} in all; the rest is in use)",
                format_gib(limit),
                format_gib(total)
            ),
            Self::Total => format!("this machine has {}", format_gib(limit)),
        }
    }
}

/// The RAM a plan must fit, and where that limit comes from: `memory.ram_budget_gb`, else what the machine can
/// give now, else its RAM; `None` when nothing is known.
pub(super) fn ram_limit(input: &PlanInput) -> Option<(u64, RamLimit)> {
    if let Some(budget) = input.ram_budget_bytes {
        return Some((budget, RamLimit::Budget));
    }
    if let Some(available) = input.available_ram_bytes {
        return Some((available, RamLimit::Available));
    }
    input.host_ram_bytes.map(|total| (total, RamLimit::Total))
}

/// Where the page-locked limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PinnedLimit {
    /// `memory.pinned_budget_gb`.
    Budget,
    /// Windows' cap: about half of the RAM.
    WindowsHalf,
    /// The RAM limit (page-locked memory is RAM that cannot be swapped out).
    Ram,
}

/// The page-locked RAM a plan must fit: `memory.pinned_budget_gb`; else on Windows about half of the machine's
/// RAM (its cap on page-locked memory), within the RAM limit; else the RAM limit. `None` when nothing is known.
pub(super) fn pinned_limit(input: &PlanInput) -> Option<u64> {
    pinned_limit_of(input).map(|(bytes, _)| bytes)
}

fn pinned_limit_of(input: &PlanInput) -> Option<(u64, PinnedLimit)> {
    if let Some(budget) = input.pinned_budget_bytes {
        return Some((budget, PinnedLimit::Budget));
    }
    let ram = ram_limit(input).map(|(bytes, _)| bytes);
    match (input.windows, input.host_ram_bytes.or(ram)) {
        (true, Some(total)) if ram.is_none_or(|r| total / 2 < r) => {
            Some((total / 2, PinnedLimit::WindowsHalf))
        }
        _ => ram.map(|bytes| (bytes, PinnedLimit::Ram)),
    }
}

/// Why this machine's RAM cannot hold a GPU run whose ranks each need `peak_ram` of RAM, `pinned` of it
/// page-locked (`None` when it can, or when the RAM is unknown). Page-locked memory cannot be swapped out, so it
/// must fit its own limit ([`pinned_limit`]); the rest could swap, but a step that pages its own streamed blocks
/// and saved activations through the disk does not train.
pub(super) fn ram_shortfall(input: &PlanInput, peak_ram: u64, pinned: u64) -> Option<String> {
    if input.on_cpu {
        return None;
    }
    let ranks = input.ranks_on_machine.max(1) as u64;
    let needed = |bytes: u64| match ranks {
        1 => format_gib(bytes),
        n => format!(
            "{} ({n} ranks × {})",
            format_gib(bytes.saturating_mul(n)),
            format_gib(bytes)
        ),
    };
    let fewer_gpus = if ranks > 1 {
        "fewer GPUs (--gpus), "
    } else {
        ""
    };
    if let Some((cap, source)) = pinned_limit_of(input) {
        if pinned.saturating_mul(ranks) > cap {
            let total = input.host_ram_bytes.unwrap_or(cap);
            let has = match source {
                PinnedLimit::Budget => format!(
                    "the page-locked budget (memory.pinned_budget_gb) is {}",
                    format_gib(cap)
                ),
                PinnedLimit::WindowsHalf => format!(
                    "Windows allows about half of RAM, {} of this machine's {}",
                    format_gib(cap),
                    format_gib(total)
                ),
                PinnedLimit::Ram => ram_words(input)?,
            };
            return Some(format!(
                "the plan needs {} of page-locked RAM, which cannot be swapped out, and {has}: use \
                 memory.streaming = \"staged\" (a small page-locked ring), memory.activations = \"pageable\" \
                 (or \"auto\" for both), {fewer_gpus}fewer streamed blocks or activations on the GPU",
                needed(pinned)
            ));
        }
    }
    let (limit, _) = ram_limit(input)?;
    (peak_ram.saturating_mul(ranks) > limit).then(|| {
        format!(
            "the plan needs {} of RAM and {}: use {fewer_gpus}fewer streamed blocks, activations on the GPU, \
             memory.checkpointing = \"blocks\" or shorter clips",
            needed(peak_ram),
            ram_words(input).unwrap_or_default(),
        )
    })
}

/// The RAM limit in words ("the RAM budget (memory.ram_budget_gb) is 32.00 GiB").
fn ram_words(input: &PlanInput) -> Option<String> {
    let (limit, source) = ram_limit(input)?;
    Some(source.describe(limit, input.host_ram_bytes.unwrap_or(limit)))
}
