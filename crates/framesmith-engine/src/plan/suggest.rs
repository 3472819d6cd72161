//! What would make a configuration fit a budget, cheapest change first: more streamed blocks, per-block
//! checkpointing, activations in RAM, FP8 weights, then a shorter clip or a lower resolution with every saving on.

use super::{auto_blocks, sizes, BaseFormat, PlanError, PlanInput};
use framesmith_config::plan::FloatDtype;
use framesmith_config::protocol::memory::Suggestion;
use framesmith_config::run::{ActivationPlacement, Checkpointing, Fp8ScaleMode, StreamingMode};

/// The input with every memory saving that keeps the clip: per-block checkpointing, activations in RAM, FP8
/// block-64 weights, streaming on.
fn leanest(input: &PlanInput) -> PlanInput {
    let mut lean = with_checkpointed_streaming(input);
    lean.streaming.activations = ActivationPlacement::Host;
    if !matches!(lean.base, BaseFormat::Fp8(_)) {
        lean.base = BaseFormat::Fp8(Fp8ScaleMode::Block64);
        lean.compute = FloatDtype::Bf16;
    }
    lean
}

fn with_streaming(input: &PlanInput) -> PlanInput {
    let mut out = input.clone();
    if out.streaming.mode == StreamingMode::Off {
        out.streaming.mode = StreamingMode::Pinned;
    }
    out.streaming.gpu_slots = out.streaming.gpu_slots.max(1);
    out
}

/// Streaming on and per-block checkpointing: every later suggestion assumes it (the kept tapes or attention
/// outputs are the first thing to give up after streaming, which costs far less step time).
fn with_checkpointed_streaming(input: &PlanInput) -> PlanInput {
    let mut out = with_streaming(input);
    out.checkpointing = Checkpointing::Blocks;
    out
}

/// What would fit `budget`, cheapest change first; the first that fits ends the search.
pub(super) fn suggest(input: &PlanInput, budget: u64) -> Result<Vec<Suggestion>, PlanError> {
    if let Some(blocks_to_swap) = auto_blocks(&with_streaming(input), budget)? {
        return Ok(vec![Suggestion::StreamBlocks { blocks_to_swap }]);
    }
    let streaming = with_checkpointed_streaming(input);
    if input.checkpointing != Checkpointing::Blocks {
        if let Some(blocks_to_swap) = auto_blocks(&streaming, budget)? {
            return Ok(vec![Suggestion::CheckpointBlocks { blocks_to_swap }]);
        }
    }
    let mut host = streaming.clone();
    host.streaming.activations = ActivationPlacement::Host;
    if input.streaming.activations == ActivationPlacement::Device {
        if let Some(blocks_to_swap) = auto_blocks(&host, budget)? {
            return Ok(vec![Suggestion::HostActivations { blocks_to_swap }]);
        }
    }
    let lean = leanest(input);
    if !matches!(input.base, BaseFormat::Fp8(_)) {
        if let Some(blocks_to_swap) = auto_blocks(&lean, budget)? {
            return Ok(vec![Suggestion::Fp8Base { blocks_to_swap }]);
        }
    }
    Ok(vec![smaller_clip(&lean, budget)?])
}

/// The longest clip, then the largest resolution, that fits with every memory saving on.
fn smaller_clip(lean: &PlanInput, budget: u64) -> Result<Suggestion, PlanError> {
    let described = sizes(lean)?;
    let step = described.frame_step;
    let fits = |candidate: &PlanInput| -> Result<bool, PlanError> {
        Ok(auto_blocks(candidate, budget)?.is_some())
    };
    // Shorter clips need less, so the longest that fits is found by bisection over the frame counts below.
    let mut shorter = lean.clone();
    let frames_with = |cut: usize| lean.clip.frames - step * cut;
    let most_cut = lean
        .clip
        .frames
        .saturating_sub(1)
        .checked_div(step)
        .unwrap_or(0);
    shorter.clip.frames = frames_with(most_cut);
    if most_cut > 0 && fits(&shorter)? {
        // `fewest` does not fit (the clip itself did not), `most` does.
        let (mut fewest, mut most) = (0, most_cut);
        while most - fewest > 1 {
            let mid = fewest + (most - fewest) / 2;
            shorter.clip.frames = frames_with(mid);
            if fits(&shorter)? {
                most = mid;
            } else {
                fewest = mid;
            }
        }
        return Ok(Suggestion::FewerFrames {
            frames: frames_with(most),
        });
    }
    let multiple = described.pixel_multiple.max(1);
    let mut smaller = lean.clone();
    for eighths in (2..8).rev() {
        let scale = |n: usize| (n * eighths / 8) / multiple * multiple;
        smaller.clip.width = scale(lean.clip.width);
        smaller.clip.height = scale(lean.clip.height);
        if smaller.clip.width == 0 || smaller.clip.height == 0 {
            break;
        }
        if fits(&smaller)? {
            return Ok(Suggestion::LowerResolution {
                width: smaller.clip.width,
                height: smaller.clip.height,
            });
        }
    }
    Ok(Suggestion::LargerCard)
}
