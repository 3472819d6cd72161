//! What the app needs from the rest of Framesmith, as one small trait. `main.rs` implements it with the real
//! modules (model inspector, dataset scanner, presets, validation, engine); tests implement it with fakes.
//! Everything here is plain data: the app never sees tensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use framesmith_config::protocol::doctor::SystemReport;
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::protocol::EngineHandle;
use framesmith_config::RunConfig;

/// Which model file a slot holds.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum ModelRole {
    Dit,
    Vae,
    TextEncoder,
}

impl ModelRole {
    pub const ALL: [Self; 3] = [Self::Dit, Self::Vae, Self::TextEncoder];

    /// Name shown in the UI.
    pub fn label(self) -> &'static str {
        match self {
            Self::Dit => "DiT",
            Self::Vae => "VAE",
            Self::TextEncoder => "Text encoder",
        }
    }

    /// The `RunConfig` key that holds this file's path.
    pub fn config_key(self) -> &'static str {
        match self {
            Self::Dit => "model.dit",
            Self::Vae => "model.vae",
            Self::TextEncoder => "model.text_encoder",
        }
    }

    /// Guesses the slot of a dropped file from its name (VAE and umT5 files say what they are).
    pub fn guess(path: &Path) -> Self {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        if name.contains("vae") {
            Self::Vae
        } else if name.contains("t5") || name.contains("text_enc") || name.contains("clip") {
            Self::TextEncoder
        } else {
            Self::Dit
        }
    }
}

/// A small RGBA preview image (row-major, 4 bytes per pixel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thumbnail {
    pub path: PathBuf,
    pub width: u32,
    pub height: u32,
    pub rgba: Vec<u8>,
}

/// What a dataset scan found in the dropped folders.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatasetSummary {
    pub folders: Vec<PathBuf>,
    pub videos: usize,
    pub images: usize,
    pub captions: usize,
    /// Media files with no caption file beside them.
    pub missing_captions: Vec<PathBuf>,
    /// Files that could not be read, each with the reason.
    pub unreadable: Vec<(PathBuf, String)>,
    /// (width, height) → number of items.
    pub resolutions: BTreeMap<(u32, u32), usize>,
    /// Shortest and longest video in frames (`None` when unknown or there are no videos).
    pub frame_range: Option<(u32, u32)>,
    /// Every other finding of the scanner, one line each (errors first).
    pub problems: Vec<String>,
    /// Which of the folders hold mostly videos (the rest are image folders).
    pub video_folders: Vec<PathBuf>,
    pub thumbnails: Vec<Thumbnail>,
}

/// A preset as the UI offers it.
#[derive(Debug, Clone, PartialEq)]
pub struct PresetView {
    pub name: String,
    /// One line shown on hover.
    pub summary: String,
    /// Why the preset sets each key (dotted `RunConfig` key → one line).
    pub reasons: BTreeMap<String, String>,
}

/// How bad a validation finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The run cannot start.
    Error,
    /// The run can start, but the user should know.
    Warning,
}

/// One validation finding, attached to a dotted `RunConfig` key (`lora.rank`) or `""` for the whole config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldIssue {
    pub key: String,
    pub message: String,
    pub severity: Severity,
}

/// What "try my LoRA" generates: a LoRA at a strength on the project's models, with the prompt and settings of
/// the Samples tab's generate panel. Plain data; the engine-backed `Backend` turns it into the engine's request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateSettings {
    pub lora: PathBuf,
    pub strength: f64,
    pub prompt: String,
    /// The start image of an image-to-video model (the demo model's clips start from one).
    pub image: Option<PathBuf>,
    pub seed: u64,
    pub steps: usize,
    pub width: usize,
    pub height: usize,
    /// Frames of a clip (unused by image models).
    pub frames: usize,
    /// Where to write, without the extension: the backend adds the model's (`.mp4` for a clip, its frames in a
    /// folder beside it; `.png` for an image).
    pub out: PathBuf,
}

/// The generate panel's settings for the project `config` before anything is read: the LoRA its run writes into
/// the output folder, outputs in `generated/` there, a 480p video's size (832×480, 81 frames).
pub fn default_generate_settings(config: &RunConfig) -> GenerateSettings {
    let out = &config.output;
    GenerateSettings {
        lora: out
            .output_dir
            .join(format!("{}.safetensors", out.output_name)),
        strength: 1.0,
        prompt: String::new(),
        image: None,
        seed: 42,
        steps: 20,
        width: 832,
        height: 480,
        frames: 81,
        out: out.output_dir.join("generated").join("try"),
    }
}

/// What a generation reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateUpdate {
    /// Denoising step `step` (from 0) of `steps` is starting.
    Step { step: usize, steps: usize },
    /// A line for the log.
    Log(String),
}

/// What a generation wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedClip {
    /// The MP4 (or PNG image).
    pub file: PathBuf,
    /// What the player opens: the clip's frames folder, or the image.
    pub frames: PathBuf,
}

/// A key layout the LoRA tools convert to (`framesmith lora convert --to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraLayout {
    /// musubi-tuner's `lora_unet_…` names.
    Musubi,
    /// ComfyUI's `diffusion_model.…` names.
    ComfyUi,
    /// diffusers / PEFT's `transformer.….lora_A.weight` names.
    Diffusers,
}

impl LoraLayout {
    pub const ALL: [Self; 3] = [Self::Musubi, Self::ComfyUi, Self::Diffusers];

    /// Name shown in the UI.
    pub fn label(self) -> &'static str {
        match self {
            Self::Musubi => "musubi-tuner",
            Self::ComfyUi => "ComfyUI",
            Self::Diffusers => "diffusers",
        }
    }

    /// What a converted file's name ends in, and the name `framesmith lora convert --to` takes.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Musubi => "musubi",
            Self::ComfyUi => "comfyui",
            Self::Diffusers => "diffusers",
        }
    }
}

/// What the LoRA tools do (`framesmith lora inspect|convert|resize|merge`). The outputs are new files: the
/// backend refuses one that exists.
#[derive(Debug, Clone, PartialEq)]
pub enum LoraTask {
    Inspect {
        file: PathBuf,
    },
    Convert {
        input: PathBuf,
        output: PathBuf,
        to: LoraLayout,
    },
    /// Lower the rank by SVD, reporting the energy kept.
    Resize {
        input: PathBuf,
        output: PathBuf,
        rank: usize,
    },
    /// Fold the LoRA at `strength` into a copy of the base model file.
    Merge {
        base: PathBuf,
        lora: PathBuf,
        strength: f64,
        output: PathBuf,
    },
}

/// What a LoRA tool reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraReport {
    /// What it found or did, one line each, as `framesmith lora` prints them.
    pub lines: Vec<String>,
    /// `‖ΔW‖` per block by block group (`inspect`): (group, [(block, norm)]).
    pub norms: Vec<(String, Vec<(usize, f64)>)>,
    /// The file it wrote (`convert`, `resize`, `merge`).
    pub written: Option<PathBuf>,
}

/// Everything the app asks of the rest of Framesmith. Calls other than `presets` and `demo_project` run on
/// background threads, so they may block (read files, open drivers) but must not panic.
pub trait Backend: Send + Sync {
    /// One line saying what the file is (variant, layout, dtype, FP8 scaling, size), or the loader's clear error.
    fn inspect_model(&self, role: ModelRole, path: &Path) -> Result<String, String>;

    /// Scans dataset folders (counts, captions, unreadable files, resolution and frame spread, thumbnails).
    fn scan_dataset(&self, folders: &[PathBuf]) -> Result<DatasetSummary, String>;

    /// The presets, in the order the UI shows them.
    fn presets(&self) -> Vec<PresetView>;

    /// `config` with the named preset applied on top.
    fn apply_preset(&self, name: &str, config: &RunConfig) -> Result<RunConfig, String>;

    /// Every problem in `config`, each attached to the key it concerns.
    fn validate(&self, config: &RunConfig) -> Vec<FieldIssue>;

    /// Peak VRAM and RAM of training `config` on this machine, and how many blocks to stream ("Will it fit?").
    /// `dataset_toml` is the Project tab's dataset when the run will use it (`config` names no dataset file). May
    /// read the DiT's header and the GPU's free memory.
    fn plan_memory(
        &self,
        config: &RunConfig,
        dataset_toml: Option<&str>,
    ) -> Result<PlanReport, String> {
        let _ = (config, dataset_toml);
        Err("the memory planner is not connected".into())
    }

    /// The system check (`framesmith doctor`): this build and machine, and what stops or slows training into
    /// `output_dir`. May block for a moment (NVML, CUDA, `ffmpeg -version`).
    fn system_check(&self, output_dir: &Path) -> Result<SystemReport, String> {
        let _ = output_dir;
        Err("the system check is not connected".into())
    }

    /// The generate panel's starting settings for the project `config`: its LoRA (in the output folder) and its
    /// first sample prompt's text, start image, size, steps and seed when it has sample prompts. May read files.
    fn generate_defaults(&self, config: &RunConfig) -> GenerateSettings {
        default_generate_settings(config)
    }

    /// Generates with the models of the project `config` and `settings`' LoRA ("try my LoRA"); runs on a job
    /// thread. `updates` hears each denoising step and the log; a true `cancelled` stops it between steps.
    fn generate(
        &self,
        config: &RunConfig,
        settings: &GenerateSettings,
        updates: &mut dyn FnMut(GenerateUpdate),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<GeneratedClip, String> {
        let _ = (config, settings, updates, cancelled);
        Err("generation is not connected".into())
    }

    /// Runs a LoRA tool on a job thread: the same library calls as `framesmith lora`. Errors name the file and
    /// the fix.
    fn lora_tool(&self, task: &LoraTask) -> Result<LoraReport, String> {
        let _ = task;
        Err("the LoRA tools are not connected".into())
    }

    /// The built-in demo project: trains at once with no downloads and no GPU.
    fn demo_project(&self) -> RunConfig;

    /// Starts the engine for runs on `gpus` and returns the UI's end of its channels: none trains on the config's
    /// `training.device`, one on that GPU, several in one process per GPU as `framesmith train --gpus` starts them
    /// (the events are rank 0's).
    fn spawn_engine(&self, gpus: &[usize]) -> Result<EngineHandle, String>;
}
