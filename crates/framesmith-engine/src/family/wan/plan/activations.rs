//! The activations of a Wan step as the planner counts them: what the step keeps from each block's forward (the
//! kept self-attention outputs, a block's whole tape; exact counts of the tensors `models::wan::block::grad`
//! records), the tensors every block reads, and the widths the calibrated working set scales with.

use framesmith_models::wan::WanConfig;

use crate::plan::{BlockWidths, StepShape, WorkingSet};

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
/// residual): 2.257 GiB per block, 2.069 GiB beyond the saved input, 62.1 GiB over 30 blocks. The H200 measured
/// 61.1 GiB more peak than per-block checkpointing (2.04 GiB per block): the step without recompute also needs a
/// slightly smaller working set, which the plan does not subtract. On the CPU, the tiny model's step allocates
/// within 1% of this per block (`tests/step_memory.rs`).
pub fn block_tape_bytes(cfg: &WanConfig, batch: u64, rank: u64, shape: &StepShape) -> u64 {
    let (l, c, s) = (shape.tokens, shape.compute_bytes, shape.residual_bytes);
    let (d, f, h) = (cfg.dim as u64, cfg.ffn_dim as u64, cfg.num_heads as u64);
    let text = batch * cfg.text_len as u64;
    let (token_copies, context_copies) = if cfg.qk_norm { (12, 3) } else { (9, 2) };
    let modulation = if shape.per_token_time {
        per_token_modulation_bytes(cfg, shape)
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

/// Bytes of the working set `set` for a step of `shape` on Wan model `cfg`.
pub fn working_set_bytes(set: &WorkingSet, cfg: &WanConfig, shape: &StepShape) -> u64 {
    let widths = BlockWidths {
        dim: cfg.dim as u64,
        ffn_dim: cfg.ffn_dim as u64,
        heads: cfg.num_heads as u64,
        per_token_modulation_bytes: per_token_modulation_bytes(cfg, shape),
    };
    set.bytes_for(&widths, shape)
}

/// The per-token time modulation `e0` `[L, 6, dim]` in f32 where the step has one (`shape.per_token_time`); 0
/// where `e0` is one row per sample.
pub fn per_token_modulation_bytes(cfg: &WanConfig, shape: &StepShape) -> u64 {
    if shape.per_token_time {
        shape.tokens * 6 * cfg.dim as u64 * 4
    } else {
        0
    }
}

/// Tensors every block reads, alive for the whole step: the embedded text context (and CLIP tokens), the time
/// modulation `e0` and the RoPE tables, as (label, bytes).
pub fn shared_inputs(cfg: &WanConfig, batch: u64, shape: &StepShape) -> Vec<(&'static str, u64)> {
    let d = cfg.dim as u64;
    let mut context_tokens = cfg.text_len as u64;
    if cfg.has_clip() {
        context_tokens += cfg.clip_tokens as u64;
    }
    let time = if shape.per_token_time {
        per_token_modulation_bytes(cfg, shape)
    } else {
        batch * 6 * d * 4
    };
    // cos and sin over each token's head dimension, in f32.
    let rope = 2 * shape.tokens * cfg.head_dim() as u64 * 4;
    vec![
        (
            "text context",
            batch * context_tokens * d * shape.compute_bytes,
        ),
        ("time modulation and RoPE tables", time + rope),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::plan::{peak_vram_bytes, plan, PlanInput, DEFAULT_CLIP, WORKING_SET};
    use framesmith_config::protocol::memory::Suggestion;
    use framesmith_config::run::{ActivationPlacement, BaseDtype, Checkpointing, StreamingMode};
    use framesmith_config::RunConfig;

    const GIB: f64 = (1u64 << 30) as f64;

    /// Wan2.1-1.3B, bf16 base and f32 residual, 480×832×81, rank 32: the H200 measurement's setup.
    fn wan13b(checkpointing: Checkpointing) -> PlanInput {
        let mut cfg = RunConfig::default();
        cfg.model.variant = "t2v-1.3b".into();
        cfg.model.base_dtype = BaseDtype::Bf16;
        cfg.lora.rank = 32;
        cfg.memory.checkpointing = checkpointing;
        let mut input = PlanInput::from_config(&cfg, WanConfig::wan21_t2v_1_3b(), DEFAULT_CLIP);
        input.working_set = WORKING_SET;
        input
    }

    fn line_bytes(input: &PlanInput, prefix: &str) -> Option<u64> {
        plan(input)
            .unwrap()
            .breakdown
            .iter()
            .find(|l| l.label.starts_with(prefix))
            .map(|l| l.bytes)
    }

    #[test]
    fn the_three_settings_cost_what_they_keep() {
        let peak = |c| peak_vram_bytes(&wan13b(c), 0).unwrap();
        let (blocks, attention, off) = (
            peak(Checkpointing::Blocks),
            peak(Checkpointing::Attention),
            peak(Checkpointing::Off),
        );
        assert!(
            attention > blocks && off > attention,
            "{blocks} {attention} {off}"
        );
        // from_config carried the setting: 30 blocks of bf16 output (96 MiB) and 12 heads of f32 LSE.
        assert_eq!(
            attention - blocks,
            30 * (32_760 * 1536 * 2 + 32_760 * 12 * 4)
        );
        // The projection's output is one more bf16 [tokens, dim] per block.
        let projection = peak(Checkpointing::AttentionProjection);
        assert_eq!(projection - attention, 30 * 32_760 * 1536 * 2);
        // The H200: 'off' peaked 61.1 GiB above 'blocks', 'attention' 2.76 GiB above it. The plan keeps the
        // recompute's whole working set for both (a recompute without the attention kernel, or none at all,
        // needs a little less), so it may only err high, and by little.
        let off_extra = (off - blocks) as f64 / GIB;
        assert!((61.1..61.1 * 1.05).contains(&off_extra), "{off_extra} GiB");
        let attention_extra = (attention - blocks) as f64 / GIB;
        assert!(
            (2.76..2.76 * 1.05).contains(&attention_extra),
            "{attention_extra} GiB"
        );
        eprintln!("beyond per-block checkpointing: off {off_extra:.2} GiB, attention {attention_extra:.3} GiB");
    }

    #[test]
    fn off_keeps_tapes_instead_of_saved_inputs() {
        let off = wan13b(Checkpointing::Off);
        assert_eq!(line_bytes(&off, "saved block inputs"), None);
        assert_eq!(line_bytes(&off, "kept self-attention"), None);
        // The derivation in `block_tape_bytes`, for L = 32,760, d = 1536, f = 8960, h = 12, T = 512, r = 32,
        // c = 2, s = 4: L·d·(3s + 12c) + L·f·c + 2·L·h·4 + (8·L + 2·T)·r·c + 3·T·d·c + 6·d·4.
        let (l, d, f, h, t, r) = (32_760u64, 1536, 8960, 12, 512, 32);
        let per_block = l * d * (3 * 4 + 12 * 2)
            + l * f * 2
            + 2 * l * h * 4
            + (8 * l + 2 * t) * r * 2
            + 3 * t * d * 2
            + 6 * d * 4;
        assert_eq!(per_block, 2_423_295_232);
        assert_eq!(line_bytes(&off, "kept block tapes"), Some(30 * per_block));
        let blocks = wan13b(Checkpointing::Blocks);
        assert_eq!(line_bytes(&blocks, "kept block tapes"), None);
        let saved = line_bytes(&blocks, "saved block inputs").unwrap();
        assert_eq!(saved, 30 * l * d * 4);
        // Activations in RAM move the saved inputs, never the tapes (validation refuses the pair).
        let mut host = off.clone();
        host.streaming.activations = ActivationPlacement::Host;
        assert_eq!(plan(&host).unwrap().peak_ram_bytes, 0);
        assert_eq!(
            peak_vram_bytes(&host, 0).unwrap(),
            peak_vram_bytes(&off, 0).unwrap()
        );
    }

    #[test]
    fn tapes_grow_with_the_batch_and_the_image_branch() {
        let shape = |tokens| StepShape {
            tokens,
            compute_bytes: 2,
            residual_bytes: 4,
            dequantised_weight_bytes: 0,
            quantised_input_bytes: 0,
            per_token_time: false,
        };
        let t2v = WanConfig::wan21_t2v_14b();
        let one = block_tape_bytes(&t2v, 1, 32, &shape(32_760));
        let two = block_tape_bytes(&t2v, 2, 32, &shape(2 * 32_760));
        // Everything scales with the batch except the six modulation rows, which are per sample too.
        assert_eq!(two, 2 * one);
        let i2v = WanConfig::wan21_i2v_14b();
        let with_image = block_tape_bytes(&i2v, 1, 32, &shape(32_760));
        let (d, h, ti) = (5120u64, 40, 257);
        assert_eq!(
            with_image - one,
            2 * 32_760 * d * 2 + 32_760 * h * 4 + 3 * ti * d * 2 + 2 * ti * 32 * 2
        );
        // A step with per-token timesteps (TI2V-5B's start frame) keeps its modulation rows in every tape.
        let ti2v = WanConfig::wan22_ti2v_5b();
        let per_token = StepShape {
            per_token_time: true,
            ..shape(1000)
        };
        let per_token = block_tape_bytes(&ti2v, 1, 32, &per_token);
        let plain = block_tape_bytes(&ti2v, 1, 32, &shape(1000));
        assert_eq!(
            per_token - plain,
            1000 * 6 * ti2v.dim as u64 * 4 - 6 * ti2v.dim as u64 * 4
        );
    }

    #[test]
    fn kept_tapes_are_the_first_thing_a_tight_budget_gives_up() {
        let mut off = wan13b(Checkpointing::Off);
        off.streaming.mode = StreamingMode::Pinned;
        let blocks = wan13b(Checkpointing::Blocks);
        // Fits with per-block checkpointing and nothing streamed, not with 'off' however much is streamed.
        off.vram_budget_bytes = Some(peak_vram_bytes(&blocks, 0).unwrap());
        let r = plan(&off).unwrap();
        assert_eq!(
            r.suggestions,
            vec![Suggestion::CheckpointBlocks { blocks_to_swap: 0 }]
        );
        assert!(r.suggestions[0]
            .to_string()
            .contains("memory.checkpointing = \"blocks\""));
        // A budget streaming alone meets keeps the setting.
        off.vram_budget_bytes = Some(peak_vram_bytes(&off, 20).unwrap());
        assert_eq!(
            plan(&off).unwrap().suggestions,
            vec![Suggestion::StreamBlocks { blocks_to_swap: 20 }]
        );
    }
}
