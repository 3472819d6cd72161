//! `RunPlan`: a validated run with every value resolved (device, dtypes, LoRA scale, schedules), the only input
//! the engine accepts. Built by `config::validate`.

use std::path::PathBuf;

use super::run::{
    ActivationPlacement, BaseDtype, BlocksToSwap, Checkpointing, ExpertMode, FluxStreamOrder,
    Fp8ScaleMode, LoraKind, LrScheduler, ResidualDtype, RunConfig, StreamingMode, TrainingMode,
};
use crate::schedule::LrSchedule;
use crate::training::{AdamWConfig, TimestepConfig, NUM_TRAIN_TIMESTEPS};

/// What validation needs to know about the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostInfo {
    /// CUDA devices usable by this build (0 without the `cuda` feature).
    pub cuda_devices: usize,
    /// Whether this is Windows (the shared-memory guard acts only there).
    pub windows: bool,
}

impl HostInfo {
    /// This operating system with `cuda_devices` CUDA devices.
    pub fn new(cuda_devices: usize) -> Self {
        Self {
            cuda_devices,
            windows: cfg!(windows),
        }
    }

    /// This operating system with no CUDA device.
    pub fn cpu_only() -> Self {
        Self::new(0)
    }
}

/// The model family a run trains: it decides which files and settings apply. The config does not say it (the
/// family is read from `model.dit`'s header), so whoever can read the file passes it to
/// [`crate::validate::validate_for`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFamily {
    /// Wan2.1 / Wan2.2 (and the built-in demo model).
    #[default]
    Wan,
    /// FLUX.1 [dev].
    Flux,
    /// Qwen-Image.
    QwenImage,
    /// HunyuanVideo 1.5.
    HunyuanVideo15,
    /// LTX-2 and LTX-2.3.
    Ltx2,
}

impl std::fmt::Display for ModelFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Wan => "Wan",
            Self::Flux => "FLUX.1",
            Self::QwenImage => "Qwen-Image",
            Self::HunyuanVideo15 => "HunyuanVideo 1.5",
            Self::Ltx2 => "LTX-2",
        })
    }
}

/// The device a run trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanDevice {
    Cpu,
    /// CUDA device by ordinal.
    Cuda(usize),
}

impl PlanDevice {
    /// True for a CUDA device.
    pub fn is_cuda(self) -> bool {
        matches!(self, Self::Cuda(_))
    }
}

/// As configs spell it: `cpu`, `cuda:N`.
impl std::fmt::Display for PlanDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Floating-point dtypes of computation and of saved LoRAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatDtype {
    F32,
    Bf16,
    F16,
}

/// Where the DiT comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The built-in tiny demo model.
    Demo,
    /// A checkpoint file or folder (checked to exist).
    File(PathBuf),
}

/// Resolved `[model]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    pub source: ModelSource,
    /// A named variant (`t2v-14b`, …); `None` detects it from the checkpoint.
    pub variant: Option<String>,
    pub vae: Option<PathBuf>,
    pub text_encoder: Option<PathBuf>,
    /// The image encoder of the start images of samples: Wan2.1 I2V's CLIP, HunyuanVideo 1.5's SigLIP (FLUX.1:
    /// CLIP-L, a text encoder).
    pub clip: Option<PathBuf>,
    /// Wan2.2 A14B's low-noise expert, trained in the same run (`model.source` is then the high-noise one).
    pub low_noise: Option<LowNoisePlan>,
    pub base_dtype: BaseDtype,
    /// FP8 scale granularity; `Some` only for an FP8 base (per channel with `fp8_matmul`).
    pub fp8_scale: Option<Fp8ScaleMode>,
    pub residual_dtype: ResidualDtype,
    /// The block linears multiply on FP8 tensor cores (`model.fp8_matmul`; only with an FP8 base on a GPU).
    pub fp8_matmul: bool,
    /// Attention runs cuDNN's FP8 fused kernels (`model.fp8_attention`; only on a GPU, computing in bf16).
    pub fp8_attention: bool,
    /// Dtype activations and dequantised weights are computed in (bf16 for an FP8 base).
    pub compute_dtype: FloatDtype,
}

/// The second Wan2.2 A14B expert of a run that trains both.
#[derive(Debug, Clone, PartialEq)]
pub struct LowNoisePlan {
    pub dit: PathBuf,
    pub mode: ExpertMode,
    /// The boundary as a fraction of the timesteps; `None` uses the model's.
    pub boundary: Option<f64>,
    /// The device the low-noise expert lives on (`training.low_noise_device`); `None`: the run's device, where
    /// it is parked while the high-noise expert works.
    pub device: Option<PlanDevice>,
}

/// Where training samples come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetSource {
    /// Generated latents and text embeddings.
    Synthetic,
    /// A musubi-tuner dataset TOML (checked to exist).
    Config(PathBuf),
}

/// Resolved `[dataset]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetPlan {
    pub source: DatasetSource,
    /// Resolution override as (width, height), multiples of 16.
    pub resolution: Option<(usize, usize)>,
    /// `target_frames` override, each 4k+1.
    pub target_frames: Option<Vec<usize>>,
    /// Entries that cannot be read are left out with a warning rather than refused.
    pub skip_unreadable: bool,
}

/// Resolved `[lora]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPlan {
    pub kind: LoraKind,
    pub rank: usize,
    pub alpha: f64,
    /// LoKr's options (defaults for the other kinds).
    pub factor: i64,
    pub decompose_both: bool,
    pub full_matrix: bool,
    /// `alpha / rank`, the factor on `up(down(x))`.
    pub scale: f64,
    /// Regexes (checked to compile) on module paths.
    pub include_patterns: Vec<String>,
    pub exclude_patterns: Vec<String>,
    pub init_from: Option<PathBuf>,
}

/// The learning-rate schedule before the run's length is known (epochs depend on the dataset).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulePlan {
    pub kind: LrScheduler,
    pub base_lr: f64,
    pub warmup_steps: usize,
    pub num_cycles: usize,
    pub power: f64,
}

impl SchedulePlan {
    /// The schedule for a run of `total_steps` optimizer steps.
    pub fn with_total_steps(&self, total_steps: usize) -> LrSchedule {
        LrSchedule {
            kind: self.kind,
            base_lr: self.base_lr,
            warmup_steps: self.warmup_steps,
            total_steps,
            num_cycles: self.num_cycles,
            power: self.power,
        }
    }
}

/// How long the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainLength {
    /// Optimizer steps.
    Steps(usize),
    /// Whole passes over the dataset.
    Epochs(usize),
}

/// Resolved `[training]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingPlan {
    /// `training.mode`, checked against `model.variant` when one is named; the engine resolves `Auto` against the
    /// loaded model ([`crate::catalog::StartImage::training_mode`]).
    pub mode: TrainingMode,
    pub length: TrainLength,
    pub gradient_accumulation_steps: usize,
    pub seed: u64,
    pub max_consecutive_nonfinite: usize,
    pub timesteps: TimestepConfig,
}

impl TrainingPlan {
    /// Optimizer steps of the run, given the batches in one epoch (musubi-tuner: epochs × ⌈batches / accumulation⌉).
    pub fn total_steps(&self, batches_per_epoch: usize) -> usize {
        match self.length {
            TrainLength::Steps(n) => n,
            TrainLength::Epochs(e) => {
                e * batches_per_epoch.div_ceil(self.gradient_accumulation_steps.max(1))
            }
        }
    }
}

/// Resolved `[memory]`. These act on a CUDA device only; `applies` is false on a CPU run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    pub applies: bool,
    pub streaming: StreamingMode,
    pub blocks_to_swap: BlocksToSwap,
    pub activations: ActivationPlacement,
    /// What the step keeps from each block's forward; applies on every device (on a CPU it trades RAM).
    pub checkpointing: Checkpointing,
    /// VRAM budget in bytes (GiB × 2³⁰); `None`: free memory minus headroom.
    pub vram_budget_bytes: Option<u64>,
    /// RAM budget in bytes (GiB × 2³⁰); `None`: the RAM available when the run is planned.
    pub ram_budget_bytes: Option<u64>,
    /// Page-locked RAM budget in bytes (GiB × 2³⁰); `None`: on Windows about half of RAM, elsewhere the RAM limit.
    pub pinned_budget_bytes: Option<u64>,
    pub staging_slots: usize,
    /// Which FLUX.1 block kind streams first (ignored by Wan runs).
    pub flux_stream_order: FluxStreamOrder,
    /// Shared-memory guard; false where it cannot act (not Windows, or CPU).
    pub shared_memory_guard: bool,
    /// Processes of this run on this machine, whose host RAM adds up (1; `framesmith train --gpus` sets one per
    /// GPU it launches).
    pub ranks_on_machine: usize,
}

impl Default for MemoryPlan {
    /// `[memory]` left out, as a CUDA run off Windows resolves it (no budgets, one rank).
    fn default() -> Self {
        let m = super::run::MemorySection::default();
        Self {
            applies: true,
            streaming: m.streaming,
            blocks_to_swap: m.blocks_to_swap,
            activations: m.activations,
            checkpointing: m.checkpointing,
            vram_budget_bytes: None,
            ram_budget_bytes: None,
            pinned_budget_bytes: None,
            staging_slots: m.staging_slots,
            flux_stream_order: m.flux_stream_order,
            shared_memory_guard: false,
            ranks_on_machine: 1,
        }
    }
}

/// Resolved `[output]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPlan {
    pub output_dir: PathBuf,
    pub output_name: String,
    pub save_every_n_steps: Option<usize>,
    pub save_every_n_epochs: Option<usize>,
    pub save_state: bool,
    /// LoRA dtype on disk (`dit` resolved to the compute dtype).
    pub save_dtype: FloatDtype,
}

/// Resolved `[sampling]`; absent from the plan when no prompt file is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingPlan {
    pub prompts: PathBuf,
    pub every_n_steps: Option<usize>,
    pub every_n_epochs: Option<usize>,
    pub at_first: bool,
}

/// Resolved `[validation]`; absent from the plan when no evaluation is scheduled.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationPlan {
    pub every_n_steps: Option<usize>,
    pub every_n_epochs: Option<usize>,
    pub at_save: bool,
    /// Fraction of the training items held out, in (0, 1); `None`: none.
    pub split: Option<f64>,
    /// Seed of the split and of the evaluation noise.
    pub seed: u64,
    /// The fixed timesteps as flow-matching t in (0, 1), evenly spread over the training range.
    pub sigmas: Vec<f64>,
}

impl ValidationPlan {
    /// Whether an evaluation falls on `step` (`epoch_done`: the epoch that step completed, if any; `saved`:
    /// a LoRA is saved at that step).
    pub fn due(&self, step: usize, epoch_done: Option<usize>, saved: bool) -> bool {
        let by_steps = self.every_n_steps.is_some_and(|n| step % n == 0);
        let by_epochs = self
            .every_n_epochs
            .zip(epoch_done)
            .is_some_and(|(n, e)| e > 0 && e % n == 0);
        step > 0 && (by_steps || by_epochs || (self.at_save && saved))
    }
}

/// `count` timesteps evenly spread over [min_timestep, max_timestep] (timestep units, 0..=1000), as t in (0, 1):
/// the midpoints of `count` equal slices, so neither end (pure data, pure noise) is taken.
pub fn validation_sigmas(count: usize, min_timestep: f64, max_timestep: f64) -> Vec<f64> {
    let (lo, hi) = (
        min_timestep / NUM_TRAIN_TIMESTEPS as f64,
        max_timestep / NUM_TRAIN_TIMESTEPS as f64,
    );
    (0..count)
        .map(|k| lo + (hi - lo) * (k as f64 + 0.5) / count as f64)
        .collect()
}

/// A validated, resolved run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    /// The config it was made from (for LoRA metadata and the training-state folder).
    pub config: RunConfig,
    /// The family the config was validated for.
    pub family: ModelFamily,
    pub device: PlanDevice,
    pub model: ModelPlan,
    pub dataset: DatasetPlan,
    pub lora: LoraPlan,
    pub optimizer: AdamWConfig,
    pub schedule: SchedulePlan,
    pub training: TrainingPlan,
    pub memory: MemoryPlan,
    pub output: OutputPlan,
    pub sampling: Option<SamplingPlan>,
    pub validation: Option<ValidationPlan>,
    /// Things the user should know that are not errors (ignored settings, knobs that do not apply here).
    pub notes: Vec<String>,
}
