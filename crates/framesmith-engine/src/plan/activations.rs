//! What the training step keeps from each block's forward until that block's backward, by `memory.checkpointing`:
//! the saved block inputs (every setting but "off"), the kept self-attention outputs ("attention"), or every
//! block's whole tape ("off"). The bytes are each family's exact counts ([`BlockKind`]), no calibration.

use super::breakdown::{blocks_label, line, total_bytes};
use super::model::{BlockKind, ModelMemory};
use framesmith_config::protocol::memory::{format_gib, Placement, PlanLine};
use framesmith_config::run::Checkpointing;

/// The plan's lines for what the step keeps between a block's forward and its backward, the saved inputs (and kept
/// attention outputs) waiting at `saved_at` ([`super::placement::saved_placement`]).
pub(super) fn kept_lines(
    checkpointing: Checkpointing,
    saved_at: Placement,
    s: &ModelMemory,
) -> Vec<PlanLine> {
    let n = s.num_blocks();
    let l = s.shape.tokens;
    let counts = s.kind_counts();
    if checkpointing == Checkpointing::Off {
        // The tape holds the block input, so there is no separate saved input (and nothing to move to RAM).
        return vec![line(
            format!(
                "kept block tapes, no checkpointing ({})",
                blocks_label(s, &counts, |k| k.tape_bytes)
            ),
            total_bytes(s, &counts, |k| k.tape_bytes),
            Placement::Device,
        )];
    }
    let in_ram = saved_at.is_host();
    let residual = if s.shape.residual_bytes == 4 {
        "f32"
    } else {
        "bf16"
    };
    let saved_input = s.saved_input_bytes;
    let mut out = vec![line(
        format!("saved block inputs ({n} × {l} tokens, {residual})"),
        n as u64 * saved_input,
        saved_at,
    )];
    if in_ram {
        // `nn::offload::activations` copies the next block's input back while this block's backward runs.
        out.push(line(
            "saved input prefetched from RAM (1 block)",
            saved_input,
            Placement::Device,
        ));
        if saved_at == Placement::Host {
            out.push(pageable_ring_line("saved inputs"));
        }
    }
    if checkpointing.keeps_attention() {
        let projection = checkpointing.keeps_projection();
        let kept = |k: &BlockKind| {
            k.kept_attention_bytes
                + if projection {
                    k.kept_projection_bytes
                } else {
                    0
                }
        };
        let what = if projection {
            "kept self-attention and projection outputs"
        } else {
            "kept self-attention outputs"
        };
        // They wait where the saved inputs do (`train::step`'s `KeptValues`).
        out.push(line(
            format!("{what} ({})", blocks_label(s, &counts, kept)),
            total_bytes(s, &counts, kept),
            saved_at,
        ));
        if in_ram {
            // The block before's outputs come back while a block's backward runs, and the last block's never
            // leave the device.
            let largest = s.kinds.iter().map(kept).max().unwrap_or(0);
            out.push(line(
                format!("{what} on the device (2 blocks)"),
                2 * largest,
                Placement::Device,
            ));
            if saved_at == Placement::Host {
                out.push(pageable_ring_line("kept attention"));
            }
        }
    }
    out
}

/// What the step keeps in RAM for each block, in block order, when its saved activations wait there: the block's
/// saved input and what it keeps of its attention, exactly as [`kept_lines`] counts them (nothing with
/// `checkpointing = "off"`, whose tapes stay on the device). Page-locked buffers of these sizes are set aside
/// while the model is built, one per block, so that the first step does not lock them itself.
pub fn host_activation_block_bytes(checkpointing: Checkpointing, s: &ModelMemory) -> Vec<u64> {
    if checkpointing == Checkpointing::Off {
        return Vec::new();
    }
    let kept = |k: &BlockKind| {
        if !checkpointing.keeps_attention() {
            0
        } else if checkpointing.keeps_projection() {
            k.kept_attention_bytes + k.kept_projection_bytes
        } else {
            k.kept_attention_bytes
        }
    };
    s.blocks
        .iter()
        .map(|&kind| s.saved_input_bytes + s.kinds.get(kind).map_or(0, kept))
        .collect()
}

/// The small page-locked ring that pageable activations of one kind (`what`) move through.
fn pageable_ring_line(what: &str) -> PlanLine {
    let (slots, chunk) = (
        framesmith_nn::offload::ACTIVATION_RING_SLOTS as u64,
        framesmith_nn::offload::ACTIVATION_RING_CHUNK_BYTES as u64,
    );
    line(
        format!("pinned ring for {what} ({slots} × {})", format_gib(chunk)),
        slots * chunk,
        Placement::HostPinned,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::plan::tests::fp8_14b;
    use crate::plan::{plan, sizes};
    use framesmith_config::run::ActivationPlacement;

    /// The buffers set aside before the first step are the plan's page-locked activations, block by block: as
    /// many as there are blocks, and together exactly what the plan's lines say RAM holds for them.
    #[test]
    fn the_buffers_set_aside_are_the_plans_page_locked_activations() {
        let mut input = fp8_14b();
        input.streaming.activations = ActivationPlacement::Host;
        for checkpointing in [
            Checkpointing::Blocks,
            Checkpointing::Attention,
            Checkpointing::AttentionProjection,
            Checkpointing::Off,
        ] {
            input.checkpointing = checkpointing;
            let s = sizes(&input).unwrap();
            let blocks = host_activation_block_bytes(checkpointing, &s);
            let report = plan(&input).unwrap();
            let planned: u64 = report
                .breakdown
                .iter()
                .filter(|l| l.placement == Placement::HostPinned)
                .map(|l| l.bytes)
                .sum();
            assert_eq!(blocks.iter().sum::<u64>(), planned, "{checkpointing:?}");
            if checkpointing == Checkpointing::Off {
                assert!(blocks.is_empty());
                continue;
            }
            assert_eq!(blocks.len(), s.num_blocks(), "{checkpointing:?}");
            // One block: its saved input and, when kept, its attention (and projection) outputs.
            let k = &s.kinds[0];
            let expected = s.saved_input_bytes
                + match checkpointing {
                    Checkpointing::Attention => k.kept_attention_bytes,
                    Checkpointing::AttentionProjection => {
                        k.kept_attention_bytes + k.kept_projection_bytes
                    }
                    _ => 0,
                };
            assert!(blocks.iter().all(|&b| b == expected), "{checkpointing:?}");
        }
    }
}
