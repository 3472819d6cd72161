//! `RunConfig`: everything a training run reads, as the user writes it in TOML (and as the GUI edits it).
//! Plain data with defaults; validation into a `RunPlan` lives in `config::validate`.

mod lora_file;
mod memory;
mod sampling;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use memory::{
    ActivationPlacement, AutoKeyword, BlocksToSwap, Checkpointing, FluxStreamOrder, MemorySection,
    StreamingMode,
};
pub use sampling::{SamplingKind, ShiftLine, TimestepSampling};

/// Current `schema_version` of run configs.
pub const SCHEMA_VERSION: u32 = 1;

/// A whole run configuration. Every section has defaults, so an empty file is a valid starting point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    pub schema_version: u32,
    pub model: ModelSection,
    pub dataset: DatasetSection,
    pub lora: LoraSection,
    pub optimizer: OptimizerSection,
    pub training: TrainingSection,
    pub memory: MemorySection,
    pub output: OutputSection,
    pub sampling: SamplingSection,
    pub validation: ValidationSection,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            model: ModelSection::default(),
            dataset: DatasetSection::default(),
            lora: LoraSection::default(),
            optimizer: OptimizerSection::default(),
            training: TrainingSection::default(),
            memory: MemorySection::default(),
            output: OutputSection::default(),
            sampling: SamplingSection::default(),
            validation: ValidationSection::default(),
        }
    }
}

/// Base weight dtype of the DiT during training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseDtype {
    F32,
    Bf16,
    F16,
    Fp8,
}

/// FP8 scale granularity (DESIGN.md §4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8ScaleMode {
    Tensor,
    Channel,
    Block64,
}

impl Fp8ScaleMode {
    /// Every mode by its TOML name, as the app lists them (nn's `Fp8Scale::NAMES` are the same; an engine test
    /// keeps them so).
    pub const NAMES: [&'static str; 3] = ["tensor", "channel", "block64"];
}

/// Residual-stream dtype (DESIGN.md §4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResidualDtype {
    F32,
    Bf16,
}

/// Model files and numerics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// DiT checkpoint (file or folder). Empty with `demo = true` uses the built-in tiny model.
    pub dit: PathBuf,
    /// `auto` (detected from the file) or a variant name (`t2v-1.3b`, `t2v-14b`, `i2v-14b`, `t2v-a14b`, …).
    pub variant: String,
    /// The Wan VAE, or FLUX.1's autoencoder `ae.safetensors` (decodes samples during training).
    pub vae: PathBuf,
    /// umT5 for Wan, T5-XXL for FLUX.1 (encodes the sample prompts).
    pub text_encoder: PathBuf,
    /// CLIP image encoder of Wan2.1 I2V (models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth or ComfyUI's
    /// clip_vision_h.safetensors): encodes the start images of samples during training. For HunyuanVideo 1.5
    /// image-to-video, the SigLIP image encoder (`sigclip_vision_patch14_384.safetensors`, or FLUX.1-Redux's
    /// `image_encoder` folder), which encodes those start images too. For FLUX.1, CLIP-L (`clip_l.safetensors`),
    /// which encodes the sample prompts with T5-XXL.
    pub clip: PathBuf,
    /// Wan2.2 A14B's low-noise expert (file or folder). With it one run trains both experts, `model.dit` being
    /// the high-noise one; each step's timestep picks the expert that owns it.
    pub dit_low_noise: PathBuf,
    /// How both experts train: `joint` (one LoRA for both, as musubi-tuner trains them) or `split` (one LoRA per
    /// expert, saved as `{name}_high_noise` and `{name}_low_noise`).
    pub experts: ExpertMode,
    /// Where the low-noise expert takes over, as a fraction of the timesteps; 0 uses the model's (0.875 for
    /// text-to-video, 0.9 for image-to-video).
    pub expert_boundary: f64,
    pub base_dtype: BaseDtype,
    pub fp8_scale: Fp8ScaleMode,
    pub residual_dtype: ResidualDtype,
    /// FP8 tensor-core matrix products for an FP8 base (`base_dtype = "fp8"`, on a GPU with FP8 tensor cores):
    /// the block linears' inputs are quantised to e4m3 per token and multiplied with the FP8 weights (one scale
    /// per output channel) without dequantising them, and their input gradients likewise (the output gradient
    /// quantised per token); the LoRA and its gradients stay in bf16. Faster and less exact, so off by default;
    /// bench/RESULTS.md measures its effect on the loss and the LoRA.
    pub fp8_matmul: bool,
    /// Attention (forward and backward) in FP8 through cuDNN's fused FP8 attention, on GPUs that have it (Hopper,
    /// compute capability 9.0, or newer): q, k, v, the softmax and the gradients are scaled per tensor into e4m3;
    /// inputs and outputs stay bf16. Faster and less exact, so off by default; recorded in the LoRA's metadata.
    pub fp8_attention: bool,
    /// Train the built-in tiny demo model (no files needed).
    pub demo: bool,
}

impl ModelSection {
    /// The FP8 scale layout the base is held in: `fp8_scale`, except that FP8 products need one scale per output
    /// channel, so `fp8_matmul` holds block-64 and per-tensor weights per channel.
    pub fn effective_fp8_scale(&self) -> Fp8ScaleMode {
        if self.fp8_matmul {
            Fp8ScaleMode::Channel
        } else {
            self.fp8_scale
        }
    }
}

/// How a run with both Wan2.2 A14B experts trains them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertMode {
    /// One LoRA shared by both experts (musubi-tuner's; its files and ours load interchangeably).
    #[default]
    Joint,
    /// One LoRA per expert, each with its own optimizer state.
    Split,
}

impl ExpertMode {
    /// The mode as configs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Joint => "joint",
            Self::Split => "split",
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            dit: PathBuf::new(),
            variant: "auto".into(),
            vae: PathBuf::new(),
            text_encoder: PathBuf::new(),
            clip: PathBuf::new(),
            dit_low_noise: PathBuf::new(),
            experts: ExpertMode::Joint,
            expert_boundary: 0.0,
            base_dtype: BaseDtype::Bf16,
            fp8_scale: Fp8ScaleMode::Block64,
            residual_dtype: ResidualDtype::F32,
            fp8_matmul: false,
            fp8_attention: false,
            demo: false,
        }
    }
}

/// The dataset: a musubi-tuner dataset TOML.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatasetSection {
    pub config: PathBuf,
    /// Train on generated latents and text embeddings instead of files (the demo model, smoke tests).
    pub synthetic: bool,
    /// Overrides `resolution` ([width, height]) of every dataset in the dataset config.
    pub resolution: Option<[usize; 2]>,
    /// Overrides `target_frames` of every video dataset in the dataset config (each 4k+1).
    pub target_frames: Option<Vec<usize>>,
    /// Leave out, with a counted warning, dataset entries that cannot be read (a dangling link, a FIFO, a device,
    /// a listed file that is gone) instead of refusing to train until they are fixed or removed.
    pub skip_unreadable: bool,
}

/// The kind of adapter trained, named as LyCORIS, musubi-tuner and ComfyUI name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraKind {
    /// `up(down(x)) · alpha / rank`.
    #[default]
    Lora,
    /// Kronecker product `w1 ⊗ w2` (LyCORIS' LoKr).
    Lokr,
    /// Hadamard product of two low-rank products (LyCORIS' LoHa).
    Loha,
    /// A LoRA with a trained magnitude per output row (weight-decomposed LoRA).
    Dora,
}

impl LoraKind {
    /// `alpha` when a config leaves it out: for LoHa 1, the low end of LyCORIS' recommended range (1 to half the
    /// rank) and musubi-tuner's `network_alpha` default (from LyCORIS' initialisation one LoHa step moves the
    /// layer about `0.1·√(3·rank·in)` times as much as a LoRA step at the same `alpha / rank`); for the other
    /// kinds the default section's 32.
    pub fn default_alpha(self) -> f64 {
        match self {
            Self::Loha => 1.0,
            _ => LoraSection::default().alpha,
        }
    }
}

/// The LoRA being trained. Read through `lora_file::LoraFile`, which gives a left-out `alpha` the kind's
/// default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "lora_file::LoraFile")]
pub struct LoraSection {
    /// `lora`, `lokr`, `loha` or `dora`.
    pub kind: LoraKind,
    pub rank: usize,
    pub alpha: f64,
    /// LoKr: the largest factor of each width given to the small Kronecker factor `w1`; -1 picks the most
    /// square split (LyCORIS' `factor`).
    pub factor: i64,
    /// LoKr: `w1` too as a product of two rank-`rank` factors where that is smaller (LyCORIS' `decompose_both`).
    pub decompose_both: bool,
    /// LoKr: `w1` and `w2` full matrices whatever the rank (LyCORIS' `full_matrix`).
    pub full_matrix: bool,
    /// Regexes on module paths (`blocks.3.self_attn.q`); empty includes every target.
    pub include_patterns: Vec<String>,
    pub exclude_patterns: Vec<String>,
    /// Continue from an existing LoRA file's weights.
    pub init_from: Option<PathBuf>,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            kind: LoraKind::Lora,
            rank: 32,
            alpha: 32.0,
            factor: -1,
            decompose_both: false,
            full_matrix: false,
            include_patterns: Vec::new(),
            exclude_patterns: Vec::new(),
            init_from: None,
        }
    }
}

/// Learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrScheduler {
    Constant,
    ConstantWithWarmup,
    Linear,
    Cosine,
    CosineWithRestarts,
    Polynomial,
}

/// AdamW and the learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerSection {
    pub learning_rate: f64,
    pub betas: [f64; 2],
    pub eps: f64,
    pub weight_decay: f64,
    /// Gradient clipping by global norm; 0 disables.
    pub max_grad_norm: f64,
    pub lr_scheduler: LrScheduler,
    pub lr_warmup_steps: usize,
    pub lr_scheduler_num_cycles: usize,
    pub lr_scheduler_power: f64,
}

impl Default for OptimizerSection {
    fn default() -> Self {
        Self {
            learning_rate: 2e-4,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
            lr_scheduler: LrScheduler::Constant,
            lr_warmup_steps: 0,
            lr_scheduler_num_cycles: 1,
            lr_scheduler_power: 1.0,
        }
    }
}

/// Per-sample loss weighting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightingScheme {
    None,
    SigmaSqrt,
    Cosmap,
}

/// What the LoRA learns to do (`training.mode`): generate from the caption alone, or continue a given start image.
/// TI2V-5B does either; other models do one of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainingMode {
    /// What the model does by itself: image-to-video for I2V models (and the demo model), text-to-video for
    /// text-to-video models and TI2V-5B.
    #[default]
    Auto,
    /// Every latent frame is noised and learnt from the caption alone.
    #[serde(alias = "t2v")]
    TextToVideo,
    /// Each clip's first frame is the given start image: I2V models take it as conditioning channels (cached by
    /// `framesmith cache latents --dit`); TI2V-5B keeps the clip's first latent frame clean at timestep 0 and leaves
    /// it out of the loss, as its image-to-video generation does (no extra cache).
    #[serde(alias = "i2v")]
    ImageToVideo,
}

impl TrainingMode {
    /// Every mode by its TOML name, as the app lists them.
    pub const NAMES: [&'static str; 3] = ["auto", "text_to_video", "image_to_video"];
}

/// The training loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingSection {
    /// Text-to-video or image-to-video training (see [`TrainingMode`]).
    pub mode: TrainingMode,
    pub max_train_steps: usize,
    /// When set (and not 0), overrides `max_train_steps` by whole epochs.
    pub max_train_epochs: Option<usize>,
    pub gradient_accumulation_steps: usize,
    pub seed: u64,
    pub timestep_sampling: TimestepSampling,
    pub discrete_flow_shift: f64,
    pub sigmoid_scale: f64,
    pub min_timestep: f64,
    pub max_timestep: f64,
    pub weighting_scheme: WeightingScheme,
    /// Stop the run after this many non-finite steps in a row.
    pub max_consecutive_nonfinite: usize,
    /// Where to train: `"auto"` (the first CUDA device, else the CPU), `"cpu"`, `"cuda"` or `"cuda:N"`.
    pub device: DeviceSpec,
    /// Wan2.2 A14B with both experts (`model.dit_low_noise`): the GPU the low-noise expert lives on (`"cuda:1"`),
    /// so each expert stays on its own card and neither is parked. Empty (the default): it shares
    /// `training.device`, one expert on the GPU at a time.
    pub low_noise_device: String,
    /// Mean of the logSNR normal for `logsnr` / `qinglong` sampling.
    pub logit_mean: f64,
    /// Standard deviation of the logSNR normal for `logsnr` / `qinglong` sampling.
    pub logit_std: f64,
    /// Keep the sampling distribution's shape inside [min_timestep, max_timestep] by rejection instead of
    /// scaling [0, 1] onto the range.
    pub preserve_distribution_shape: bool,
    /// First-frame conditioning (LTX-2, as its official trainer's `first_frame_conditioning_p`): the probability
    /// that a clip's first latent frame is given clean as conditioning (timestep 0 on its tokens, left out of the
    /// loss), drawn per clip and step: image-to-video training mixed into text-to-video. Unset: the family's
    /// default (LTX-2: 0.1, the official trainer's); 0: never; 1: every clip. Other families refuse it.
    pub first_frame_conditioning_p: Option<f64>,
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            mode: TrainingMode::Auto,
            max_train_steps: 1600,
            max_train_epochs: None,
            gradient_accumulation_steps: 1,
            seed: 42,
            timestep_sampling: TimestepSampling::Shift,
            discrete_flow_shift: 3.0,
            sigmoid_scale: 1.0,
            min_timestep: 0.0,
            max_timestep: 1000.0,
            weighting_scheme: WeightingScheme::None,
            max_consecutive_nonfinite: 5,
            device: DeviceSpec::Auto,
            low_noise_device: String::new(),
            logit_mean: 0.0,
            logit_std: 1.0,
            preserve_distribution_shape: false,
            first_frame_conditioning_p: None,
        }
    }
}

/// Which device trains: written `"auto"`, `"cpu"`, `"cuda"` (= `"cuda:0"`) or `"cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceSpec {
    /// The first CUDA device when there is one, else the CPU.
    Auto,
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let lower = text.trim().to_ascii_lowercase();
        match lower.as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => lower
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| {
                    format!("unknown device `{text}`, expected `auto`, `cpu`, `cuda` or `cuda:N`")
                }),
        }
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<DeviceSpec> for String {
    fn from(spec: DeviceSpec) -> Self {
        spec.to_string()
    }
}

/// LoRA dtype on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaveDtype {
    Fp32,
    Bf16,
    Fp16,
    /// The DiT's compute dtype (bf16 for an FP8 or bf16 base), as musubi-tuner saves.
    Dit,
}

/// Where and when outputs are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutputSection {
    pub output_dir: PathBuf,
    pub output_name: String,
    /// Save a LoRA every N optimizer steps; unset or 0: off.
    pub save_every_n_steps: Option<usize>,
    /// Save a LoRA every N epochs; unset or 0: off.
    pub save_every_n_epochs: Option<usize>,
    /// Also write a resumable training-state folder at each save.
    pub save_state: bool,
    pub save_dtype: SaveDtype,
}

impl Default for OutputSection {
    fn default() -> Self {
        Self {
            output_dir: PathBuf::from("output"),
            output_name: "lora".into(),
            save_every_n_steps: None,
            save_every_n_epochs: Some(1),
            save_state: true,
            save_dtype: SaveDtype::Fp32,
        }
    }
}

/// Sample clips generated during training.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingSection {
    /// musubi-tuner prompt file (`.txt` with `--w --h --f --d --s` options, or `.toml`).
    pub prompts: Option<PathBuf>,
    /// Unset or 0: off.
    pub sample_every_n_steps: Option<usize>,
    /// Unset or 0: off.
    pub sample_every_n_epochs: Option<usize>,
    pub sample_at_first: bool,
}

/// Validation loss on held-out data: evaluated at fixed timesteps with fixed noise, so the curve is comparable
/// across steps and across runs with the same seed. The data is the dataset config's `[[validation_datasets]]`
/// and/or `validation_split` of the training items. Names follow musubi-tuner's forks (`--validate_every_n_steps`,
/// `--validate_every_n_epochs`) and sd-scripts (`validation_split`, `validation_seed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidationSection {
    /// Evaluate every N optimizer steps; unset or 0: off.
    pub validate_every_n_steps: Option<usize>,
    /// Evaluate at the end of every N epochs; unset or 0: off.
    pub validate_every_n_epochs: Option<usize>,
    /// Also evaluate at each LoRA save (periodic and final).
    pub validate_at_save: bool,
    /// Hold out this fraction of the training items (chosen by `validation_seed`, never trained on); 0: none.
    pub validation_split: f64,
    /// Seed of the held-out split and of the evaluation noise; unset: `training.seed`.
    pub validation_seed: Option<u64>,
    /// Timesteps each item is evaluated at, evenly spread over [min_timestep, max_timestep].
    pub num_timesteps: usize,
}

impl Default for ValidationSection {
    fn default() -> Self {
        Self {
            validate_every_n_steps: None,
            validate_every_n_epochs: None,
            validate_at_save: false,
            validation_split: 0.0,
            validation_seed: None,
            num_timesteps: 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Fp8ScaleMode, TrainingMode};

    #[test]
    fn training_mode_names_are_the_toml_names_and_t2v_i2v_are_aliases() {
        let modes = [
            TrainingMode::Auto,
            TrainingMode::TextToVideo,
            TrainingMode::ImageToVideo,
        ];
        for (mode, name) in modes.into_iter().zip(TrainingMode::NAMES) {
            assert_eq!(serde_json::to_value(mode).ok(), Some(name.into()));
        }
        let parse = |text: &str| serde_json::from_value::<TrainingMode>(text.into()).ok();
        assert_eq!(parse("i2v"), Some(TrainingMode::ImageToVideo));
        assert_eq!(parse("t2v"), Some(TrainingMode::TextToVideo));
        assert_eq!(parse("v2v"), None);
    }

    #[test]
    fn fp8_scale_names_are_the_toml_names() {
        let modes = [
            Fp8ScaleMode::Tensor,
            Fp8ScaleMode::Channel,
            Fp8ScaleMode::Block64,
        ];
        for (mode, name) in modes.into_iter().zip(Fp8ScaleMode::NAMES) {
            assert_eq!(serde_json::to_value(mode).ok(), Some(name.into()));
        }
    }
}
