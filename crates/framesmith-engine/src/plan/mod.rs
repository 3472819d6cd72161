//! The memory planner (DESIGN.md §2 "Fits", §4.4): peak VRAM and host RAM of a training configuration, from the
//! model's description (each family describes itself: [`DescribeModel`]), clip size, LoRA, weight format and
//! streaming setup — pure arithmetic, no tensor is allocated.
//! Picks the smallest number of streamed blocks that fits a VRAM budget and, when nothing fits, says what would.
//! Weight sizes are exact (`bytes`), and so are the activations the step keeps for its backward (`activations`);
//! the step's transient working set is a calibrated model (`working_set`).

mod activations;
mod breakdown;
mod bytes;
mod input;
pub mod machine;
mod model;
mod placement;
mod ram;
mod sampling;
mod suggest;
mod working_set;

pub use activations::host_activation_block_bytes;
pub use bytes::{
    adapter_kind, dtype_bytes, dtype_name, elements, fp8_scale, fp8_weight_buffers,
    fp8_weight_bytes, lora_parameters_of, AdapterCount, BaseFormat,
};
pub use input::{
    clip_for_config, clip_with_dataset, host_activation_blocks, model_for_config, plan_config,
    plan_run, ClipShape, DEFAULT_CLIP,
};
pub(crate) use input::{clip_pixels, largest_cached_clip_of};
pub use model::{BlockKind, DescribeModel, ModelMemory, PlanModel};
pub use sampling::{chunked_decode_bytes, settle_sampling, SampleShape, SamplingMemory};
pub use working_set::{
    auto_margin_bytes, pool_fragmentation_bytes, BlockWidths, StepShape, WorkingSet,
    CUDA_CONTEXT_BYTES, POOL_FRAGMENTATION_MIN_BYTES, POOL_FRAGMENTATION_PERCENT,
    VRAM_HEADROOM_BYTES, WORKING_SET,
};

use breakdown::{breakdown, device_total};
use framesmith_config::plan::FloatDtype;
use framesmith_config::protocol::memory::{
    format_gib, Placement, PlanLine, PlanReport, SamplingPhase, Verdict,
};
use framesmith_config::run::{
    ActivationPlacement, BlocksToSwap, Checkpointing, ExpertMode, ResidualDtype, StreamingMode,
};
use framesmith_nn::adapter::AdapterKind;
use framesmith_nn::lora::LoraError;
use ram::{pinned_limit, ram_limit, ram_shortfall};
use sampling::SamplingSizes;

/// Which linears get a LoRA, and its rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraShape {
    /// LoRA, LoKr, LoHa or DoRA, with its options.
    pub kind: AdapterKind,
    pub rank: usize,
    /// `lora.include_patterns` / `lora.exclude_patterns` (musubi-tuner's rules; the family's default exclude is added).
    pub include_patterns: Vec<String>,
    pub exclude_patterns: Vec<String>,
}

/// Block streaming and where saved activations live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamingSetup {
    pub mode: StreamingMode,
    pub blocks_to_swap: BlocksToSwap,
    pub activations: ActivationPlacement,
    /// GPU slots streamed blocks are copied into ([`DEFAULT_GPU_SLOTS`]).
    pub gpu_slots: usize,
    /// Page-locked staging buffers of `staged` streaming.
    pub staging_slots: usize,
}

/// Everything the planner reads.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInput {
    pub model: PlanModel,
    pub base: BaseFormat,
    /// Dtype of activations and dequantised weights (bf16 for an FP8 base).
    pub compute: FloatDtype,
    pub residual: ResidualDtype,
    pub clip: ClipShape,
    pub lora: LoraShape,
    pub streaming: StreamingSetup,
    /// An explicit budget (`memory.vram_budget_gb`); wins over `free_vram_bytes`.
    pub vram_budget_bytes: Option<u64>,
    /// The card's free memory now; the budget is this minus [`VRAM_HEADROOM_BYTES`] when no budget is set.
    pub free_vram_bytes: Option<u64>,
    /// Total host RAM, for RAM warnings.
    pub host_ram_bytes: Option<u64>,
    /// An explicit RAM budget (`memory.ram_budget_gb`); wins over `available_ram_bytes`.
    pub ram_budget_bytes: Option<u64>,
    /// What the machine can give now without swapping (its available RAM); the RAM limit when no budget is set.
    pub available_ram_bytes: Option<u64>,
    /// An explicit page-locked budget (`memory.pinned_budget_gb`); else on Windows about half of RAM, else the
    /// RAM limit.
    pub pinned_budget_bytes: Option<u64>,
    /// Processes of the run on this machine, one per GPU (`framesmith train --gpus`): each plans its VRAM against
    /// its own GPU, and their host RAM (streamed blocks, saved activations, a parked expert: each rank's own)
    /// adds up against `host_ram_bytes`.
    pub ranks_on_machine: usize,
    /// Windows caps page-locked memory near half of RAM and shows it as shared GPU memory.
    pub windows: bool,
    /// The activation model ([`WORKING_SET`] unless measuring or comparing).
    pub working_set: WorkingSet,
    /// `memory.checkpointing`: what the step keeps from each block's forward (`train::step::StepOptions`'s
    /// `keep_attention` / `keep_projection` / `keep_tapes`): saved inputs only, plus self-attention outputs (and
    /// their projection), or every block's tape.
    pub checkpointing: Checkpointing,
    /// Count AdamW's moments and the CUDA context. Both false reproduces what `framesmith-bench step|stream`
    /// measure (the allocator's peak of steps without an optimizer), for calibrating [`WORKING_SET`].
    pub optimizer_and_context: bool,
    /// A CPU run (`training.device = "cpu"`): everything lives in RAM and the verdict is against the RAM.
    pub on_cpu: bool,
    /// Two experts of one model in one run (`model.dit_low_noise`) sharing this device, one parked while the other
    /// works, and how they train (`None` also when the low-noise expert has a GPU of its own: each card then holds
    /// one expert, as a one-expert run does).
    pub experts: Option<ExpertMode>,
    /// The block linears multiply on FP8 tensor cores (`model.fp8_matmul`): each holds its input quantised to
    /// FP8 for the product, beside the dequantised weight its backward still needs.
    pub fp8_products: bool,
    /// The step keeps each clip's first latent frame as the start image at timestep 0 (`training.mode =
    /// "image_to_video"` on TI2V-5B, the demo model), so its time modulation is per token. Otherwise it is one row
    /// per sample, also for a model that takes per-token timesteps: it collapses timesteps equal across a sample's
    /// tokens.
    pub start_frame: bool,
    /// The largest sample the run makes during training (`[sampling]`), `None` when it makes none.
    pub sampling: Option<SampleShape>,
}

/// Why a configuration cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "{width}x{height} does not divide into this model's patches: use multiples of {multiple}"
    )]
    Resolution {
        width: usize,
        height: usize,
        multiple: usize,
    },
    #[error("{frames} frames is not 1 + a multiple of {step} (the VAE packs {step} frames after the first)")]
    Frames { frames: usize, step: usize },
    #[error("the batch must hold at least 1 sample")]
    ZeroBatch,
    #[error(
        "{width}x{height} is more than {MAX_SIDE_PIXELS} pixels a side, past what the models' positions cover: \
         lower dataset.resolution (--width / --height)"
    )]
    ResolutionTooLarge { width: usize, height: usize },
    #[error(
        "{frames} frames is more than {MAX_FRAMES}, past the video models' 1024 latent frame positions: lower \
         dataset.target_frames (--frames)"
    )]
    TooManyFrames { frames: usize },
    #[error(
        "{per_sample} tokens a sample × batch {batch} is more than {MAX_STEP_TOKENS} tokens a step: lower the \
         batch (batch_size of the dataset config, --batch), the resolution or the frames"
    )]
    TooManyTokens { per_sample: u64, batch: usize },
    #[error("{requested} blocks to stream, but the model has {blocks}: stream at most {}", blocks - 1)]
    TooManyBlocks { requested: usize, blocks: usize },
    #[error("{0} blocks to stream, but streaming is off: set memory.streaming = \"pinned\" or \"staged\"")]
    StreamingOff(usize),
    #[error("streaming needs at least 1 GPU slot")]
    ZeroGpuSlots,
    #[error("staged streaming needs at least 1 staging slot")]
    ZeroStagingSlots,
    #[error("model.variant is \"auto\" and no DiT file is set: name the variant (e.g. t2v-14b)")]
    UnknownModel,
    #[error("unknown variant `{0}`: use one of {known}", known = framesmith_config::catalog::variant_names())]
    UnknownVariant(String),
    #[error("cannot read the DiT to find its variant: {0}")]
    Inspect(String),
    #[error(transparent)]
    Lora(#[from] LoraError),
}

/// Most pixels a clip side may have: the rotary tables cover 1024 latent positions a side, 16 pixels each with an
/// 8× VAE and 2× patches, and no model here trains larger.
pub const MAX_SIDE_PIXELS: usize = 16_384;

/// Most frames a clip may have: the rotary tables cover 1024 latent frames, 4 video frames each after the first.
pub const MAX_FRAMES: usize = 1 + 4 * 1023;

/// Most transformer tokens in one step (every sample of the batch). A cube of the largest sides and frames fits
/// it; with it every byte count of the plan stays far inside `u64`.
pub const MAX_STEP_TOKENS: u64 = 1 << 30;

/// The tokens of a step of `batch` samples of `per_sample` tokens, refused past [`MAX_STEP_TOKENS`].
pub(crate) fn step_tokens(per_sample: u64, batch: usize) -> Result<u64, PlanError> {
    per_sample
        .checked_mul(batch as u64)
        .filter(|&tokens| tokens <= MAX_STEP_TOKENS)
        .ok_or(PlanError::TooManyTokens { per_sample, batch })
}

/// Refuses a clip past [`MAX_SIDE_PIXELS`] or [`MAX_FRAMES`], whatever the model.
fn check_clip(clip: &ClipShape) -> Result<(), PlanError> {
    if clip.width > MAX_SIDE_PIXELS || clip.height > MAX_SIDE_PIXELS {
        return Err(PlanError::ResolutionTooLarge {
            width: clip.width,
            height: clip.height,
        });
    }
    if clip.frames > MAX_FRAMES {
        return Err(PlanError::TooManyFrames {
            frames: clip.frames,
        });
    }
    Ok(())
}

/// The model's description for `input`: the sizes that do not depend on how many blocks are streamed.
pub(crate) fn sizes(input: &PlanInput) -> Result<ModelMemory, PlanError> {
    check_clip(&input.clip)?;
    input.model.describe(input)
}

pub(crate) fn residual_bytes(r: ResidualDtype) -> u64 {
    match r {
        ResidualDtype::F32 => 4,
        ResidualDtype::Bf16 => 2,
    }
}

/// The training step's lines with `streamed` blocks streamed: the step's own, and what the samples keep on the
/// device for the whole run.
fn step_lines(
    input: &PlanInput,
    s: &ModelMemory,
    phase: Option<&SamplingSizes>,
    streamed: usize,
) -> Vec<PlanLine> {
    let mut lines = breakdown(input, s, streamed);
    if let Some(phase) = phase {
        let at = lines
            .iter()
            .rposition(|l| l.placement == Placement::Device)
            .map_or(0, |i| i + 1);
        lines.splice(at..at, sampling::held_lines(phase));
    }
    lines
}

/// Peak VRAM of the run with `streamed` blocks streamed: the larger of the training step's and the sampling
/// phase's.
fn run_peak(
    input: &PlanInput,
    s: &ModelMemory,
    phase: Option<&SamplingSizes>,
    streamed: usize,
) -> u64 {
    let step = device_total(&step_lines(input, s, phase, streamed));
    let sampling = phase.map_or(0, |p| {
        device_total(&sampling::sampling_lines(input, s, p, streamed))
    });
    step.max(sampling)
}

/// The sampling phase's sizes, or a note saying why it is not planned (a prompt file that cannot be read or a
/// sample size the model cannot make: the run refuses those at its start).
fn sampling_phase(input: &PlanInput) -> (Option<SamplingSizes>, Option<String>) {
    match sampling::sampling_sizes(input) {
        Ok(phase) => (phase, None),
        Err(e) => (
            None,
            Some(format!("the samples during training are not planned: {e}")),
        ),
    }
}

/// Peak VRAM with `streamed` blocks streamed (whatever `blocks_to_swap` says): the training step's, or the
/// sampling phase's when it needs more.
pub fn peak_vram_bytes(input: &PlanInput, streamed: usize) -> Result<u64, PlanError> {
    let s = sizes(input)?;
    let (phase, _) = sampling_phase(input);
    Ok(run_peak(input, &s, phase.as_ref(), streamed))
}

/// The budget the verdict is against: the explicit one, else the free memory minus [`VRAM_HEADROOM_BYTES`].
pub fn budget_bytes(input: &PlanInput) -> Option<u64> {
    input
        .vram_budget_bytes
        .or_else(|| default_budget(input.free_vram_bytes?))
}

/// The default budget for a card with `free_vram_bytes` free: that minus [`VRAM_HEADROOM_BYTES`].
pub fn default_budget(free_vram_bytes: u64) -> Option<u64> {
    free_vram_bytes.checked_sub(VRAM_HEADROOM_BYTES)
}

/// The smallest number of streamed blocks whose peak VRAM (the training step's and, for a run that samples, the
/// sampling phase's) fits `budget_bytes`, or `None` when even streaming all blocks but one does not fit. Ignores `blocks_to_swap` and the streaming mode (the device side is the same for
/// `pinned` and `staged`).
pub fn auto_blocks(input: &PlanInput, budget_bytes: u64) -> Result<Option<usize>, PlanError> {
    let s = sizes(input)?;
    let (phase, _) = sampling_phase(input);
    Ok((0..s.num_blocks()).find(|&n| run_peak(input, &s, phase.as_ref(), n) <= budget_bytes))
}

fn check_streaming(input: &PlanInput) -> Result<(), PlanError> {
    let st = &input.streaming;
    if st.mode != StreamingMode::Off && st.gpu_slots == 0 {
        return Err(PlanError::ZeroGpuSlots);
    }
    if st.mode == StreamingMode::Staged && st.staging_slots == 0 {
        return Err(PlanError::ZeroStagingSlots);
    }
    Ok(())
}

/// How many blocks the plan streams, whether the planner chose it, and a note when it could not.
fn blocks_to_swap(
    input: &PlanInput,
    budget: Option<u64>,
) -> Result<(usize, bool, Option<String>), PlanError> {
    let blocks = input.model.num_blocks();
    let streams = input.streaming.mode != StreamingMode::Off;
    match input.streaming.blocks_to_swap {
        BlocksToSwap::Count(0) => Ok((0, false, None)),
        BlocksToSwap::Count(n) if !streams => Err(PlanError::StreamingOff(n)),
        BlocksToSwap::Count(n) if n >= blocks => Err(PlanError::TooManyBlocks {
            requested: n,
            blocks,
        }),
        BlocksToSwap::Count(n) => Ok((n, false, None)),
        BlocksToSwap::Auto(_) if !streams => Ok((
            0,
            false,
            Some("blocks_to_swap = \"auto\" with streaming off: nothing is streamed".into()),
        )),
        BlocksToSwap::Auto(_) => match budget {
            Some(b) => {
                // The fewest blocks that leave the margin free; failing that, the fewest that fit at all.
                let margin = auto_margin_bytes(b);
                match auto_blocks(input, b.saturating_sub(margin))? {
                    Some(n) => Ok((
                        n,
                        true,
                        Some(format!(
                            "\"auto\" streams the fewest blocks that leave {} of the budget free for what the plan \
                             cannot see",
                            format_gib(margin)
                        )),
                    )),
                    None => Ok((
                        auto_blocks(input, b)?.unwrap_or(blocks - 1),
                        true,
                        Some(format!(
                            "no block count leaves {} of the budget free, so \"auto\" streams as few as fit \
                             at all: close to the budget, the run may still run out of memory",
                            format_gib(margin)
                        )),
                    )),
                }
            }
            None => Ok((
                0,
                true,
                Some(
                    "no VRAM budget known, so \"auto\" streams nothing: set memory.vram_budget_gb"
                        .into(),
                ),
            )),
        },
    }
}

/// Plans `input`: the placements it leaves to the planner ([`placement`]), peak VRAM and RAM, the breakdown, the
/// verdict against the budgets and, when it does not fit, what would.
pub fn plan(input: &PlanInput) -> Result<PlanReport, PlanError> {
    check_streaming(input)?;
    let budget = budget_bytes(input);
    let choice = placement::choose(input, budget)?;
    let input = &choice.input;
    let s = sizes(input)?;
    let (blocks_to_swap, chosen, note) = choice.blocks;
    let (phase, phase_note) = sampling_phase(input);
    let mut lines = step_lines(input, &s, phase.as_ref(), blocks_to_swap);
    if input.on_cpu {
        for l in &mut lines {
            l.placement = Placement::Host;
        }
    }
    let sampling = phase
        .as_ref()
        .map(|p| sampling_report(input, &s, p, blocks_to_swap));
    let phase_peak = |f: &dyn Fn(&SamplingPhase) -> u64| sampling.as_ref().map_or(0, f);
    let peak_vram = device_total(&lines).max(phase_peak(&|p| p.peak_vram_bytes));
    let peak_ram = sum_of(&lines, &|p| p.is_host()).max(phase_peak(&|p| p.peak_ram_bytes));
    let pinned = sum_of(&lines, &|p| p == Placement::HostPinned);
    let ranks = input.ranks_on_machine.max(1) as u64;
    let (used, limit) = if input.on_cpu {
        (
            peak_ram.saturating_mul(ranks),
            ram_limit(input).map(|(bytes, _)| bytes),
        )
    } else {
        (peak_vram, budget)
    };
    let ram_shortfall = ram_shortfall(input, peak_ram, pinned);
    let verdict = match limit {
        _ if ram_shortfall.is_some() => Verdict::DoesNotFit,
        Some(b) if used <= b => Verdict::Fits,
        Some(_) => Verdict::DoesNotFit,
        None => Verdict::NoBudget,
    };
    let suggestions = match (verdict, budget) {
        (Verdict::DoesNotFit, Some(b)) if !input.on_cpu && peak_vram > b => {
            suggest::suggest(input, b)?
        }
        _ => Vec::new(),
    };
    let notes: Vec<String> = note.into_iter().chain(phase_note).collect();
    let c = &input.clip;
    let mut report = PlanReport {
        model: format!("{} ({})", s.name, input.base.label()),
        workload: format!(
            "{}x{}, {} frames, batch {}, {} tokens",
            c.width, c.height, c.frames, c.batch, s.shape.tokens
        ),
        tokens: s.shape.tokens,
        num_blocks: s.num_blocks(),
        blocks_to_swap,
        blocks_chosen: chosen,
        block_bytes: s.largest_packed_bytes(),
        peak_vram_bytes: peak_vram,
        peak_ram_bytes: peak_ram,
        pinned_ram_bytes: pinned,
        vram_budget_bytes: budget,
        host_ram_bytes: input.host_ram_bytes,
        ram_budget_bytes: ram_limit(input).map(|(bytes, _)| bytes),
        ram_budget_set: input.ram_budget_bytes.is_some(),
        verdict,
        breakdown: lines,
        suggestions,
        notes,
        on_cpu: input.on_cpu,
        busy_gpu: busy_gpu_note(input, peak_vram),
        ranks_on_machine: input.ranks_on_machine.max(1),
        ram_shortfall,
        sampling,
        pinned_budget_bytes: pinned_limit(input),
        placements: (!input.on_cpu).then_some(choice.placements),
        binding_limit: choice.binding,
    };
    let ram = report.ram_pressure();
    report.notes.extend(ram);
    report.notes.extend(report.busy_gpu.clone());
    Ok(report)
}

/// The report's sampling phase with `blocks_to_swap` blocks streamed.
fn sampling_report(
    input: &PlanInput,
    s: &ModelMemory,
    phase: &SamplingSizes,
    blocks_to_swap: usize,
) -> SamplingPhase {
    let lines = sampling::sampling_lines(input, s, phase, blocks_to_swap);
    SamplingPhase {
        workload: phase.workload.clone(),
        peak_vram_bytes: device_total(&lines),
        peak_ram_bytes: sum_of(&lines, &|p| p.is_host()),
        breakdown: lines,
    }
}

/// Bytes of the lines of `lines` whose placement `keep` takes.
fn sum_of(lines: &[PlanLine], keep: &dyn Fn(Placement) -> bool) -> u64 {
    lines
        .iter()
        .filter(|l| keep(l.placement))
        .fold(0, |total: u64, l| total.saturating_add(l.bytes))
}

/// A budget (`memory.vram_budget_gb`) the card cannot give now: other processes hold so much of it that the
/// planned peak is above what is free. Says how much is free and what to do.
fn busy_gpu_note(input: &PlanInput, peak_vram: u64) -> Option<String> {
    let (Some(budget), Some(free)) = (input.vram_budget_bytes, input.free_vram_bytes) else {
        return None;
    };
    let usable = default_budget(free).unwrap_or(0);
    if input.on_cpu || peak_vram <= usable {
        return None;
    }
    Some(format!(
        "the GPU has only {} free now (other processes hold the rest), so this run's {} peak may not get the {}          budget it plans for: close what uses the GPU, pick another GPU, or lower memory.vram_budget_gb to {}",
        format_gib(free),
        format_gib(peak_vram),
        format_gib(budget),
        format_gib(usable)
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
