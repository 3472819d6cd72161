//! What the training step keeps from each block's forward until that block's backward, by `memory.checkpointing`:
//! the saved block inputs (every setting but "off"), the kept self-attention outputs ("attention"), or every
//! block's whole tape ("off"). Exact counts of the tensors `models::wan::block::grad` records, no calibration.

use super::{line, Sizes};
use crate::config::run::{ActivationPlacement, Checkpointing};
use crate::models::wan::WanConfig;
use crate::protocol::memory::{format_gib, Placement, PlanLine};

use super::working_set::{per_token_modulation_bytes, StepShape};

/// One block's self-attention output (compute dtype) and log-sum-exp (f32, one per head and token), as
/// `train::step`'s selective checkpointing keeps them.
pub fn kept_attention_bytes(cfg: &WanConfig, shape: &StepShape) -> u64 {
    let l = shape.tokens;
    l * cfg.dim as u64 * shape.compute_bytes + l * cfg.num_heads as u64 * 4
}

/// One block's whole tape (`BlockTape` of `models::wan::block::grad`), as the step keeps it with checkpointing off,
/// for a batch of `batch` samples and `rank`-r LoRAs on every block linear. `L` is the batch's tokens, `d` / `f` /
/// `h` the width, FFN width and heads, `T` the text tokens per sample (`Ti` CLIP tokens), `c` / `s` the compute
/// and residual dtype bytes. Counted field by field:
///
/// - residual stream, dtype `s`: the block input `x` (SelfTape), `x1` (CrossTape), `x2` (FfnTape): `3·L·d·s`;
/// - `[L, d]` in the compute dtype, 12 of them: SelfTape `h1`, q and k before their RMSNorm (`Projection::pre_norm`),
///   the attention's roped q and k, its v and output (`AttentionTape`; the `o` input is a view of the output);
///   CrossTape `n3`, q before its RMSNorm, the normed q and the text attention's output (`ac` is a view of it);
///   FfnTape `h2`. Without q/k norms the three pre-norm tensors are the projections themselves: 9;
/// - FfnTape `f0` (`ffn.0`'s output): `L·f·c`;
/// - log-sum-exp of self- and cross-attention, f32: `2·L·h·4`;
/// - each LoRA's `[m, r]` activation (`LinearTape::mid`): self q/k/v/o, cross q/o, `ffn.0`, `ffn.2` over the
///   tokens, cross k/v over the text: `8·L·r·c + 2·b·T·r·c`;
/// - cross-attention k before its norm, the normed k and v over the text: `3·b·T·d·c` (2 without q/k norms);
/// - the six modulation rows (`Common::chunks`, f32): `[L, 6, d]` for Wan 2.2's per-token time, else `6·b·d·4`;
/// - Wan 2.1 I2V's image branch: its attention output and `ac` (now a sum, not a view), `2·L·d·c`, one more
///   log-sum-exp `L·h·4`, k (and its pre-norm) and v over the CLIP tokens `3·b·Ti·d·c`, LoRA activations
///   `2·b·Ti·r·c`.
///
/// Wan2.1-1.3B at 480×832×81 (L = 32,760, d = 1536, f = 8960, h = 12, T = 512, r = 32, bf16 compute, f32
/// residual): 2.257 GiB per block, 2.070 GiB beyond the saved input; the H200 measured 61.1 GiB more peak than
/// per-block checkpointing over 30 blocks, 2.04 GiB per block (the step with no recompute also needs a slightly
/// smaller working set, which the plan does not subtract).
pub fn block_tape_bytes(cfg: &WanConfig, batch: u64, rank: u64, shape: &StepShape) -> u64 {
    let (l, c, s) = (shape.tokens, shape.compute_bytes, shape.residual_bytes);
    let (d, f, h) = (cfg.dim as u64, cfg.ffn_dim as u64, cfg.num_heads as u64);
    let text = batch * cfg.text_len as u64;
    let (token_copies, context_copies) = if cfg.qk_norm { (12, 3) } else { (9, 2) };
    let modulation = if cfg.per_token_time() {
        per_token_modulation_bytes(cfg, l)
    } else {
        batch * 6 * d * 4
    };
    let mut bytes = 3 * l * d * s
        + token_copies * l * d * c
        + l * f * c
        + 2 * l * h * 4
        + (8 * l + 2 * text) * rank * c
        + context_copies * text * d * c
        + modulation;
    if cfg.has_clip() {
        let image = batch * cfg.clip_tokens as u64;
        bytes += 2 * l * d * c + l * h * 4 + context_copies * image * d * c + 2 * image * rank * c;
    }
    bytes
}

/// The plan's lines for what the step keeps between a block's forward and its backward.
pub(super) fn kept_lines(
    cfg: &WanConfig,
    checkpointing: Checkpointing,
    activations: ActivationPlacement,
    batch: u64,
    rank: u64,
    s: &Sizes,
) -> Vec<PlanLine> {
    let n = cfg.num_layers;
    let l = s.shape.tokens;
    if checkpointing == Checkpointing::Off {
        // The tape holds the block input, so there is no separate saved input (and nothing to move to RAM).
        let per_block = block_tape_bytes(cfg, batch, rank, &s.shape);
        return vec![line(
            format!(
                "kept block tapes, no checkpointing ({n} × {})",
                format_gib(per_block)
            ),
            n as u64 * per_block,
            Placement::Device,
        )];
    }
    let saved_at = match activations {
        ActivationPlacement::Device => Placement::Device,
        ActivationPlacement::Host => Placement::HostPinned,
    };
    let residual = if s.shape.residual_bytes == 4 {
        "f32"
    } else {
        "bf16"
    };
    let mut out = vec![line(
        format!("saved block inputs ({n} × {l} tokens, {residual})"),
        n as u64 * l * cfg.dim as u64 * s.shape.residual_bytes,
        saved_at,
    )];
    if checkpointing == Checkpointing::Attention {
        let per_block = kept_attention_bytes(cfg, &s.shape);
        out.push(line(
            format!(
                "kept self-attention outputs ({n} × {})",
                format_gib(per_block)
            ),
            n as u64 * per_block,
            Placement::Device,
        ));
    }
    out
}
