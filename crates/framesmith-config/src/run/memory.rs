//! `[memory]`: block streaming and its budgets, where saved activations live, and checkpointing.

use serde::{Deserialize, Serialize};

/// Block streaming mode (DESIGN.md §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamingMode {
    Off,
    /// Streamed blocks live in page-locked RAM (the fastest copies).
    Pinned,
    /// Streamed blocks live in pageable RAM and reach the GPU through a small page-locked staging ring.
    Staged,
    /// The planner picks `pinned` or `staged`: the faster one that fits the RAM and page-locked budgets.
    Auto,
}

/// Where the checkpointed step keeps saved block inputs. In RAM (`host`) they are page-locked, except with
/// `streaming = "staged"`, whose promise is little page-locked memory: there they are pageable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationPlacement {
    Device,
    Host,
    /// Page-locked RAM, whatever the streaming mode (the fastest copies).
    Pinned,
    /// Pageable RAM, whatever the streaming mode (copied through a small page-locked ring).
    Pageable,
    /// The planner picks the GPU, page-locked or pageable RAM: the fastest that fits every budget.
    Auto,
}

impl ActivationPlacement {
    /// Whether saved inputs leave the GPU (`"auto"` may keep them there, so it is not counted).
    pub fn is_host(self) -> bool {
        matches!(self, Self::Host | Self::Pinned | Self::Pageable)
    }
}

/// How much of each block's forward the training step keeps for the backward (`train::step::StepOptions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// Per-block checkpointing: only each block's input is saved and the block is recomputed in the backward
    /// (the least memory).
    #[default]
    Blocks,
    /// Selective checkpointing: each block's self-attention output and log-sum-exp are kept as well, so the
    /// recompute skips the attention kernel (about 15% faster steps at 32k tokens, for a few GiB). They wait
    /// where the saved block inputs do: with `activations = "host"` in RAM, brought back a block ahead of the
    /// backward, so a card that cannot hold them gets the speed for RAM (14B at 480×832×81: 12.5 GiB).
    Attention,
    /// As `Attention`, and the outputs of the products that feed the block's gated residuals are kept as well, so
    /// the recompute also skips those products: Wan's `self_attn.o` (as much again as `Attention` keeps; 14B at
    /// 480×832×81: 12.5 GiB more RAM with `activations = "host"`, about 1% faster 14B steps); FLUX.1's `proj` and
    /// `mlp.2` of each stream of a double-stream block and `linear2` of a single-stream block.
    #[serde(rename = "attention_projection")]
    AttentionProjection,
    /// No checkpointing: every block's whole forward tape is kept and nothing is recomputed (the fastest steps,
    /// about 2 GiB per Wan2.1-1.3B block at 480×832×81).
    Off,
    /// The planner picks `attention_projection`, `attention` or `blocks`: the most kept (the least recompute) that
    /// fits every budget. Where there is no plan (a CPU run) it is `blocks`.
    Auto,
}

impl Checkpointing {
    /// Whether the step keeps self-attention outputs ([`Checkpointing::Attention`] and
    /// [`Checkpointing::AttentionProjection`]).
    pub fn keeps_attention(self) -> bool {
        matches!(self, Self::Attention | Self::AttentionProjection)
    }

    /// Whether the step keeps the self-attention's projected output too
    /// ([`Checkpointing::AttentionProjection`]).
    pub fn keeps_projection(self) -> bool {
        self == Self::AttentionProjection
    }

    /// Whether the step keeps every block's whole tape ([`Checkpointing::Off`]).
    pub fn keeps_tapes(self) -> bool {
        self == Self::Off
    }
}

/// Which FLUX.1 blocks stream first when only some do (`memory.flux_stream_order`): the single-stream blocks
/// (smaller, so a count streams fewer bytes), the double-stream blocks (larger, so fewer blocks free as much), or
/// blocks of both kinds spread evenly through the model. Wan models have one kind of block and ignore it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FluxStreamOrder {
    #[default]
    SingleFirst,
    DoubleFirst,
    Spread,
}

impl FluxStreamOrder {
    /// Every order by its TOML name, as the app and `framesmith plan` list them.
    pub const NAMES: [&'static str; 3] = ["single_first", "double_first", "spread"];

    /// The name as configuration files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleFirst => "single_first",
            Self::DoubleFirst => "double_first",
            Self::Spread => "spread",
        }
    }
}

/// Number of streamed blocks: a count, or `"auto"` (the planner picks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BlocksToSwap {
    Count(usize),
    Auto(AutoKeyword),
}

/// The literal `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoKeyword {
    Auto,
}

/// Memory: block streaming and budgets (these act on a CUDA device only) and checkpointing (on every device).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySection {
    pub streaming: StreamingMode,
    pub blocks_to_swap: BlocksToSwap,
    pub activations: ActivationPlacement,
    /// What the training step keeps from each block's forward for its backward (memory against recompute).
    pub checkpointing: Checkpointing,
    /// Use at most this much VRAM (GB); `None`: the card's free memory minus headroom.
    pub vram_budget_gb: Option<f64>,
    /// Use at most this much RAM (GB); `None`: what the machine can give without swapping (its available RAM when
    /// the run is planned).
    pub ram_budget_gb: Option<f64>,
    /// Page-lock at most this much RAM (GB); `None`: on Windows about half of RAM (its cap, where page-locked
    /// memory shows as shared GPU memory), elsewhere the RAM budget.
    pub pinned_budget_gb: Option<f64>,
    /// Page-locked staging buffers (8 MiB chunks) of `staged` streaming.
    pub staging_slots: usize,
    /// FLUX.1 only: which block kind streams first.
    pub flux_stream_order: FluxStreamOrder,
    /// When Windows starts spilling into shared GPU memory: the app pauses the run, `framesmith train` stops it
    /// (saving), once per run.
    pub shared_memory_guard: bool,
}

impl Default for MemorySection {
    fn default() -> Self {
        Self {
            streaming: StreamingMode::Off,
            blocks_to_swap: BlocksToSwap::Count(0),
            activations: ActivationPlacement::Device,
            checkpointing: Checkpointing::Blocks,
            vram_budget_gb: None,
            ram_budget_gb: None,
            pinned_budget_gb: None,
            staging_slots: crate::training::STAGING_SLOTS,
            flux_stream_order: FluxStreamOrder::SingleFirst,
            shared_memory_guard: false,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
