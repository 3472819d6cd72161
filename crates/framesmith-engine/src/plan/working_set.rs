//! The activation side of the plan: the working set of one block's recompute + backward, modelled as counts of
//! named tensor shapes over the widths a family gives ([`BlockWidths`]). **Every calibration constant of the planner
//! lives in this file.**

/// Tensors alive at the peak of one block's recompute + backward (DESIGN.md §4.3), counted by shape. `L` is the
/// step's token count (all samples), `dim` / `ffn_dim` / `heads` come from the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkingSet {
    /// `[L, dim]` in f32: layer norms, modulation, gated residuals and their gradients.
    pub tokens_dim_f32: u64,
    /// `[L, dim]` in the compute dtype: q/k/v/o projections (with LoRA branches), RMSNorm and RoPE outputs,
    /// attention outputs, and their gradients.
    pub tokens_dim_compute: u64,
    /// `[L, dim]` in the residual dtype: the recomputed block input, its output and the incoming gradient.
    pub tokens_dim_residual: u64,
    /// `[L, ffn_dim]` in the compute dtype: `ffn.0`'s output, the GELU output, their gradients.
    pub tokens_ffn_compute: u64,
    /// `[L, heads]` in f32: attention log-sum-exp (self and cross) and the backward's row sums.
    pub tokens_heads_f32: u64,
    /// Copies of the per-token time modulation `[L, 6, dim]` f32 (a model with per-token timesteps: `modulation + e0` per block).
    pub per_token_modulation: u64,
    /// Dense copies (compute dtype) of the largest block linear that an FP8 base is dequantised into inside the
    /// linear op, forward and backward; 0 bytes for a dense base.
    pub dequantised_weights: u64,
    /// Inputs of the widest block linear quantised to FP8 for its product (`[L, ffn_dim]` codes and `[L]` scales;
    /// 0 bytes without FP8 products).
    pub quantised_inputs: u64,
    /// `[L, dim]` f32 tensors of the head and the loss (held with every saved input, but not with a block's
    /// working set: the larger of the two counts).
    pub head_tokens_dim_f32: u64,
}

impl WorkingSet {
    /// candle autograd over the block (`train::step::BlockBackward::Autograd`: every gradient accumulated into a
    /// fresh tensor). Fitted to the two measured peaks of the training-step benchmark (bench/RESULTS.md, run 7:
    /// the 14B in FP8 block64 and the 1.3B in bf16 on the H200, 480×832×81 = 32,760 tokens, LoRA rank 32 on every
    /// block linear, f32 residual, no optimizer state). Subtracting weights, LoRA parameters and gradients and
    /// the saved block inputs leaves ≈ 41 `[L, dim]` f32-sized and ≈ 13 `[L, ffn_dim]` bf16 tensors; the split
    /// among the `[L, dim]` kinds follows the block's structure and needs an H200 measurement with a bf16 residual
    /// to pin down.
    pub const CANDLE_AUTOGRAD: Self = Self {
        tokens_dim_f32: 27,
        tokens_dim_compute: 22,
        tokens_dim_residual: 3,
        tokens_ffn_compute: 13,
        tokens_heads_f32: 4,
        per_token_modulation: 1,
        dequantised_weights: 1,
        quantised_inputs: 1,
        head_tokens_dim_f32: 6,
    };

    /// The engine's hand-written block backward (`train::step::BlockBackward::Manual`), which frees each
    /// intermediate as soon as it is used and accumulates gradients in place. First fitted to the PyTorch
    /// reference step (14B bf16 63.39 GiB, 1.3B bf16 13.08 GiB: ≈ 11 `[L, dim]` f32-sized and ≈ 4 `[L, ffn_dim]`
    /// bf16 tensors), then refitted to our own step's used peaks on the H200 (bench/RESULTS.md, block streaming,
    /// session 3: 1.3B f32 resident, 1.3B bf16 with 20 and 21 blocks streamed, 14B FP8 at 480p and 720p): the
    /// fused backward holds one `[L, ffn_dim]` tensor fewer than PyTorch's. What makes a 14B model train on a
    /// 24 GB card at 480×832×81. FP8 attention (`model.fp8_attention`) is planned the same: with it on, the
    /// block's peak was not above the bf16 kernels' on the H200 (its one-byte codes stand where cuDNN's bf16
    /// backward keeps wider tensors; bench/RESULTS.md, session 35).
    pub const FUSED_BACKWARD: Self = Self {
        tokens_dim_f32: 4,
        tokens_dim_compute: 8,
        tokens_dim_residual: 3,
        tokens_ffn_compute: 3,
        tokens_heads_f32: 4,
        per_token_modulation: 1,
        dequantised_weights: 1,
        quantised_inputs: 1,
        head_tokens_dim_f32: 6,
    };

    /// One block's forward without gradients (a sample's denoising: `forward_untracked`), at its peak: the
    /// block's input and output in the residual dtype, the normed input, q/k/v and the attention output in the
    /// compute dtype, the log-sum-exp, one f32 `[L, dim]` (norm statistics, modulation), and the MLP's hidden
    /// layer with its activation; the head keeps two f32 `[L, dim]`. Counted from the block's code, not yet
    /// measured (bench/run-sampling.sh measures the phase).
    pub const FORWARD: Self = Self {
        tokens_dim_f32: 1,
        tokens_dim_compute: 5,
        tokens_dim_residual: 2,
        tokens_ffn_compute: 2,
        tokens_heads_f32: 1,
        per_token_modulation: 1,
        dequantised_weights: 1,
        quantised_inputs: 1,
        head_tokens_dim_f32: 2,
    };

    /// Bytes of this working set for a step of `shape` through blocks of `widths`.
    pub fn bytes_for(&self, widths: &BlockWidths, shape: &StepShape) -> u64 {
        let l = shape.tokens;
        let (d, f, h) = (widths.dim, widths.ffn_dim, widths.heads);
        let block =
            l * d * (4 * self.tokens_dim_f32 + shape.compute_bytes * self.tokens_dim_compute)
                + l * d * shape.residual_bytes * self.tokens_dim_residual
                + l * f * shape.compute_bytes * self.tokens_ffn_compute
                + l * h * 4 * self.tokens_heads_f32
                + self.per_token_modulation * widths.per_token_modulation_bytes
                + self.dequantised_weights * shape.dequantised_weight_bytes
                + self.quantised_inputs * shape.quantised_input_bytes;
        let head = l * d * 4 * self.head_tokens_dim_f32;
        block.max(head)
    }
}

/// The widths a block's working set scales with, as a model family gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockWidths {
    /// The residual stream's width.
    pub dim: u64,
    /// The widest linear output inside the block (an FFN's hidden layer, or a fused projection's output).
    pub ffn_dim: u64,
    pub heads: u64,
    /// One copy of a per-token time modulation, 0 where there is none.
    pub per_token_modulation_bytes: u64,
}

/// The working set the planner uses unless told otherwise: the engine's default block backward (the manual one).
/// Keep it in step with `train::step::BlockBackward`'s default and recalibrate when the backward changes.
pub const WORKING_SET: WorkingSet = WorkingSet::FUSED_BACKWARD;

/// The CUDA context, cuBLAS / cuDNN workspaces and loaded kernels: device memory the allocator's high-water mark
/// does not show but the card loses. Measured on a driver's first context; varies ±200 MiB by GPU and driver.
pub const CUDA_CONTEXT_BYTES: u64 = 600 << 20;

/// Default headroom below the card's free memory when no `vram_budget_gb` is set: room for the caching
/// allocator's fragmentation and for other programs (the desktop, a browser) that grow during a long run. On
/// Windows the driver spills into shared memory instead of failing, so erring high costs a streamed block, erring
/// low costs 3–10× speed.
pub const VRAM_HEADROOM_BYTES: u64 = 1 << 30;

/// What `blocks_to_swap = "auto"` leaves free below the budget, as a percentage of it (at least
/// `AUTO_MARGIN_MIN_BYTES`): room for what the plan does not see (library workspaces that differ by GPU and
/// driver, the pool's chunking). `framesmith train` runs measured up to 2% above the plan (bench/RESULTS.md); a
/// count chosen at the budget's very edge then fails in the first step, where one more streamed block costs little.
pub const AUTO_MARGIN_PERCENT: u64 = 4;

/// The least margin `auto` keeps below the budget.
pub const AUTO_MARGIN_MIN_BYTES: u64 = 512 << 20;

/// The margin `auto` keeps below a budget of `budget` bytes.
pub fn auto_margin_bytes(budget: u64) -> u64 {
    (budget / 100 * AUTO_MARGIN_PERCENT).max(AUTO_MARGIN_MIN_BYTES)
}

/// The CUDA memory pool reserves more than the tensors alive at its peak: freed blocks of other sizes sit in it.
/// Measured on the H200 (reserved − used high-water, session 3): 0.75–1.45 GiB for 1.3B at 480p, 0.92 GiB for
/// 14B FP8 at 480p and 2.76 GiB at 720p. Planned as this percentage of the working set, but at least
/// `POOL_FRAGMENTATION_MIN_BYTES`.
pub const POOL_FRAGMENTATION_PERCENT: u64 = 13;

/// The least fragmentation planned: small working sets still leave about a GiB of freed blocks in the pool.
pub const POOL_FRAGMENTATION_MIN_BYTES: u64 = 1 << 30;

/// The pool's fragmentation planned for a working set of `working` bytes.
pub fn pool_fragmentation_bytes(working: u64) -> u64 {
    (working * POOL_FRAGMENTATION_PERCENT / 100).max(POOL_FRAGMENTATION_MIN_BYTES)
}

/// Shapes and dtypes of one step, as the working set needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Tokens of the whole batch.
    pub tokens: u64,
    pub compute_bytes: u64,
    pub residual_bytes: u64,
    /// The largest block linear dequantised to the compute dtype (FP8 bases), else 0.
    pub dequantised_weight_bytes: u64,
    /// The widest block linear's input quantised to FP8 (FP8 products), else 0.
    pub quantised_input_bytes: u64,
    /// The time modulation is per token ([`PlanInput::start_frame`](super::PlanInput::start_frame)).
    pub per_token_time: bool,
}
