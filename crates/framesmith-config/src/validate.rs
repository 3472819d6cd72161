//! `validate`: checks a `RunConfig` against itself and the machine and resolves it into a `RunPlan`. Every
//! problem is collected (not only the first), each naming its TOML key, what is wrong and the fix.

use std::fmt;
use std::path::{Path, PathBuf};

use super::family::rules;
use super::plan::{
    DatasetPlan, DatasetSource, FloatDtype, HostInfo, LoraPlan, ModelFamily, OutputPlan,
    PlanDevice, RunPlan, SamplingPlan,
};
use super::run::{DeviceSpec, LoraKind, LoraSection, RunConfig, SaveDtype, SCHEMA_VERSION};
use super::validate_model::{check_low_noise_device, check_model};
use super::validate_train::{
    check_first_frame_conditioning, check_memory, check_mode, check_optimizer, check_training,
};
use super::validate_validation::check_validation;
use crate::catalog;

/// One thing wrong with a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted TOML key, e.g. `optimizer.learning_rate`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}; {}", self.key, self.message, self.fix)
    }
}

/// Every problem found in a config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    pub problems: Vec<Problem>,
}

impl ValidationErrors {
    /// The problem about `key`, if any.
    pub fn for_key(&self, key: &str) -> Option<&Problem> {
        self.problems.iter().find(|p| p.key == key)
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "the run config has {n} problem{}:",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// Collects problems and notes while the sections are checked.
#[derive(Default)]
pub(crate) struct Checker {
    pub(crate) problems: Vec<Problem>,
    pub(crate) notes: Vec<String>,
    /// Only the settings are checked ([`check_settings`]): files that are not there (yet) and devices this
    /// machine does not have are not problems.
    pub(crate) settings_only: bool,
}

impl Checker {
    pub(crate) fn problem(
        &mut self,
        key: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.problems.push(Problem {
            key: key.to_string(),
            message: message.into(),
            fix: fix.into(),
        });
    }

    /// A problem of an input the run needs and the config does not name (the DiT, the dataset); `plan` takes
    /// them from its flags, so [`check_settings`] does not ask for them.
    pub(crate) fn required(&mut self, key: &str, message: &str, fix: &str) {
        if !self.settings_only {
            self.problem(key, message, fix);
        }
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// `value` must be finite and > 0.
    pub(crate) fn positive(&mut self, key: &str, value: f64, fix: &str) {
        if !(value.is_finite() && value > 0.0) {
            self.problem(key, format!("must be a positive number, not {value}"), fix);
        }
    }

    /// A path that is set must exist, as a file or a folder: a FIFO, device or socket would block or never end
    /// when read.
    pub(crate) fn existing(&mut self, key: &str, path: &Path, what: &str) {
        match std::fs::metadata(path) {
            Err(_) if self.settings_only => {}
            Err(_) => self.problem(
                key,
                format!("{what} not found: {}", path.display()),
                "check the path (relative paths start from the folder Framesmith runs in)",
            ),
            Ok(meta) if !meta.is_file() && !meta.is_dir() => self.problem(
                key,
                format!(
                    "{what} is {}, not a file: {}",
                    crate::file_read::special_kind(&meta.file_type()),
                    path.display()
                ),
                "give the path of the file itself",
            ),
            Ok(_) => {}
        }
    }
}

/// Checks `cfg` on a machine described by `host` and resolves it, as a Wan (or demo) run. Returns every problem
/// when there is any.
pub fn validate(cfg: &RunConfig, host: &HostInfo) -> Result<RunPlan, ValidationErrors> {
    validate_for(cfg, host, ModelFamily::Wan)
}

/// [`validate`] for a run of `family` (read from `model.dit` by the caller): a FLUX.1 run is also checked for the
/// Wan-only settings it cannot take and for the files its samples need.
pub fn validate_for(
    cfg: &RunConfig,
    host: &HostInfo,
    family: ModelFamily,
) -> Result<RunPlan, ValidationErrors> {
    checked(cfg, host, family, Checker::default())
}

/// The checks of [`validate_for`] that hold on any machine, for `framesmith plan`, which plans runs before their
/// files are there or for another machine: every setting is checked as training would, and a special file (a
/// FIFO, a device) where a file belongs is refused; files that do not exist, a CUDA device when this machine
/// has none, and the DiT and dataset the config does not name (plan's flags give them) are not problems.
pub fn check_settings(
    cfg: &RunConfig,
    host: &HostInfo,
    family: ModelFamily,
) -> Result<(), ValidationErrors> {
    let c = Checker {
        settings_only: true,
        ..Checker::default()
    };
    checked(cfg, host, family, c).map(|_| ())
}

fn checked(
    cfg: &RunConfig,
    host: &HostInfo,
    family: ModelFamily,
    mut c: Checker,
) -> Result<RunPlan, ValidationErrors> {
    if cfg.schema_version != SCHEMA_VERSION {
        c.problem(
            "schema_version",
            format!(
                "is {}, this Framesmith reads {SCHEMA_VERSION}",
                cfg.schema_version
            ),
            format!("set schema_version = {SCHEMA_VERSION}"),
        );
    }
    let device = check_device(&mut c, cfg.training.device, host);
    let mut model = check_model(&mut c, cfg, device, family);
    let low_device = check_low_noise_device(&mut c, &cfg.training.low_noise_device, device, host);
    match model.low_noise.as_mut() {
        Some(low) => low.device = low_device,
        None if low_device.is_some() => c.note(
            "training.low_noise_device is ignored: it places Wan2.2 A14B's low-noise expert, and model.dit_low_noise \
             is not set",
        ),
        None => {}
    }
    let pixel_step = model
        .variant
        .as_deref()
        .and_then(catalog::variant)
        .map_or(16, |v| v.pixel_step);
    let dataset = check_dataset(&mut c, cfg, pixel_step);
    let lora = check_lora(&mut c, cfg);
    let (optimizer, schedule) = check_optimizer(&mut c, cfg);
    let training = check_training(&mut c, cfg);
    check_mode(&mut c, cfg, model.variant.as_deref());
    let num_layers = model
        .variant
        .as_deref()
        .and_then(catalog::variant)
        .map(|v| v.blocks);
    let memory = check_memory(&mut c, &cfg.memory, device, host, num_layers);
    let output = check_output(&mut c, cfg, model.compute_dtype);
    let sampling = check_sampling(&mut c, cfg, family);
    let validation = check_validation(&mut c, cfg);
    rules(family).check(&mut c, cfg, validation.is_some());
    let conditioning = rules(family).first_frame_conditioning();
    check_first_frame_conditioning(&mut c, cfg, (family, conditioning));
    if !c.problems.is_empty() {
        return Err(ValidationErrors {
            problems: c.problems,
        });
    }
    Ok(RunPlan {
        config: cfg.clone(),
        family,
        device,
        model,
        dataset,
        lora,
        optimizer,
        schedule,
        training,
        memory,
        output,
        sampling,
        validation,
        notes: c.notes,
    })
}

fn check_device(c: &mut Checker, spec: DeviceSpec, host: &HostInfo) -> PlanDevice {
    match spec {
        DeviceSpec::Cpu => PlanDevice::Cpu,
        DeviceSpec::Auto if host.cuda_devices > 0 => PlanDevice::Cuda(0),
        DeviceSpec::Auto => {
            c.note(
                "no CUDA device found: training on the CPU (slow for anything but the demo model)",
            );
            PlanDevice::Cpu
        }
        DeviceSpec::Cuda(n) if n < host.cuda_devices => PlanDevice::Cuda(n),
        // Planning a GPU run on a machine without one: its devices are not known here.
        DeviceSpec::Cuda(n) if c.settings_only && host.cuda_devices == 0 => PlanDevice::Cuda(n),
        DeviceSpec::Cuda(n) => {
            c.problem(
                "training.device",
                format!("cuda:{n} is not available: {}", cuda_devices_here(host)),
                "set training.device = \"auto\", \"cpu\" or an existing \"cuda:N\"",
            );
            PlanDevice::Cpu
        }
    }
}

/// What CUDA devices this machine has, for a device that is not there.
pub(crate) fn cuda_devices_here(host: &HostInfo) -> String {
    match host.cuda_devices {
        0 => "no CUDA device is available (or this build has no CUDA support)".to_string(),
        k => format!(
            "this machine has {k} CUDA device{}",
            if k == 1 { "" } else { "s" }
        ),
    }
}

/// A period of 0 turns it off (a TOML overlay cannot unset a key, but it can write 0).
pub(crate) fn period(value: Option<usize>) -> Option<usize> {
    value.filter(|&n| n > 0)
}

pub(crate) fn non_empty(path: &Path) -> Option<PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

/// Largest clip side `dataset.resolution` may name: Wan's rotary table covers 1024 positions a side, 16 pixels
/// each.
pub const MAX_SIDE_PIXELS: usize = 16_384;

/// Most frames `dataset.target_frames` may name: Wan's rotary table covers 1024 latent frames.
pub const MAX_FRAMES: usize = 1 + 4 * 1023;

/// `[dataset]`; `pixel_step` is what the named variant's clip sides must be multiples of (16 when detected later).
fn check_dataset(c: &mut Checker, cfg: &RunConfig, pixel_step: usize) -> DatasetPlan {
    let d = &cfg.dataset;
    let source = if d.synthetic {
        if non_empty(&d.config).is_some() {
            c.note("dataset.config is ignored: dataset.synthetic = true generates the data");
        }
        DatasetSource::Synthetic
    } else if let Some(p) = non_empty(&d.config) {
        c.existing("dataset.config", &p, "dataset config");
        DatasetSource::Config(p)
    } else {
        c.required(
            "dataset.config",
            "no dataset config is set",
            "set dataset.config to a musubi-tuner dataset TOML, or dataset.synthetic = true for generated data",
        );
        DatasetSource::Synthetic
    };
    if let Some([w, h]) = d.resolution {
        let s = pixel_step;
        if w > MAX_SIDE_PIXELS || h > MAX_SIDE_PIXELS {
            c.problem(
                "dataset.resolution",
                format!(
                    "[{w}, {h}] is more than {MAX_SIDE_PIXELS} pixels a side, past what Wan's positions cover"
                ),
                "train at a size such as [1280, 720], or remove the key to use the dataset config's",
            );
        } else if w == 0 || h == 0 || w % s != 0 || h % s != 0 {
            let why = if s == 16 {
                "VAE 8× and patch 2×"
            } else {
                "the Wan2.2 VAE's 16× and patch 2×"
            };
            c.problem(
                "dataset.resolution",
                format!("[{w}, {h}] is not a multiple of {s} ({why})"),
                format!(
                    "use [width, height] in multiples of {s}, e.g. [{}, {}]",
                    (w / s).max(1) * s,
                    (h / s).max(1) * s
                ),
            );
        }
    }
    if let Some(frames) = &d.target_frames {
        let bad: Vec<String> = frames
            .iter()
            .filter(|&&n| n == 0 || (n - 1) % 4 != 0)
            .map(|n| n.to_string())
            .collect();
        if let Some(&longest) = frames.iter().filter(|&&n| n > MAX_FRAMES).max() {
            c.problem(
                "dataset.target_frames",
                format!("{longest} frames is more than {MAX_FRAMES}, past Wan's 1024 latent frame positions"),
                "use clip lengths such as 33, 49 or 81",
            );
        }
        if frames.is_empty() || !bad.is_empty() {
            c.problem(
                "dataset.target_frames",
                format!("frame counts must be 4k+1 (the VAE packs 4 frames after the first); bad: [{}]", bad.join(", ")),
                "use counts such as 1, 17, 33, 49, 81, or remove the key to use the dataset config's",
            );
        }
    }
    DatasetPlan {
        source,
        resolution: d.resolution.map(|[w, h]| (w, h)),
        target_frames: d.target_frames.clone(),
        skip_unreadable: d.skip_unreadable,
    }
}

fn check_lora(c: &mut Checker, cfg: &RunConfig) -> LoraPlan {
    let l = &cfg.lora;
    if l.rank == 0 {
        c.problem(
            "lora.rank",
            "must be at least 1",
            "use a rank such as 16 or 32",
        );
    }
    c.positive(
        "lora.alpha",
        l.alpha,
        "use alpha = rank (scale 1) or a positive value such as 1.0",
    );
    for (key, patterns) in [
        ("lora.include_patterns", &l.include_patterns),
        ("lora.exclude_patterns", &l.exclude_patterns),
    ] {
        for (i, p) in patterns.iter().enumerate() {
            if let Err(e) = regex::Regex::new(p) {
                let shown = e.to_string();
                let last = shown.lines().last().unwrap_or_default();
                let first_line = last.strip_prefix("error: ").unwrap_or(last).to_string();
                c.problem(
                    &format!("{key}[{i}]"),
                    format!("`{p}` is not a valid regular expression: {first_line}"),
                    "fix the pattern (escape dots as `\\\\.`), e.g. \"blocks\\\\.\\\\d+\\\\.self_attn\"",
                );
            }
        }
    }
    if let Some(p) = &l.init_from {
        c.existing("lora.init_from", p, "LoRA file");
    }
    check_lora_kind(c, l);
    LoraPlan {
        kind: l.kind,
        rank: l.rank,
        alpha: l.alpha,
        factor: l.factor,
        decompose_both: l.decompose_both,
        full_matrix: l.full_matrix,
        scale: if l.rank == 0 {
            0.0
        } else {
            l.alpha / l.rank as f64
        },
        include_patterns: l.include_patterns.clone(),
        exclude_patterns: l.exclude_patterns.clone(),
        init_from: l.init_from.clone(),
    }
}

/// LoKr's options: a factor of -1 or a positive width, and none of them set for another kind.
fn check_lora_kind(c: &mut Checker, l: &LoraSection) {
    if l.factor == 0 || l.factor < -1 {
        c.problem(
            "lora.factor",
            format!(
                "is {}; it must be -1 (the most square split) or a positive width",
                l.factor
            ),
            "use -1, or a factor such as 4, 8 or 16",
        );
    }
    if l.kind == LoraKind::Lokr {
        return;
    }
    for (key, set) in [
        ("lora.factor", l.factor != -1),
        ("lora.decompose_both", l.decompose_both),
        ("lora.full_matrix", l.full_matrix),
    ] {
        if set {
            c.problem(
                key,
                "applies only to LoKr",
                "remove it, or set lora.kind = \"lokr\"",
            );
        }
    }
}

/// Characters Windows refuses in file names (and the path separators).
const BAD_NAME_CHARS: &[char] = &['<', '>', ':', '"', '/', '\\', '|', '?', '*'];

fn check_output(c: &mut Checker, cfg: &RunConfig, compute: FloatDtype) -> OutputPlan {
    let o = &cfg.output;
    if o.output_dir.as_os_str().is_empty() {
        c.problem(
            "output.output_dir",
            "is empty",
            "set the folder LoRA files are written to, e.g. \"output\"",
        );
    } else if let Some(file) = o
        .output_dir
        .ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        .filter(|p| !p.is_dir())
    {
        c.problem(
            "output.output_dir",
            format!(
                "{} is a file, so the folder {} cannot be made",
                file.display(),
                o.output_dir.display()
            ),
            "pick a folder path (a new folder is made when it does not exist)",
        );
    }
    let name = o.output_name.as_str();
    let bad_char = name
        .chars()
        .any(|ch| BAD_NAME_CHARS.contains(&ch) || ch.is_control());
    if name.trim().is_empty()
        || bad_char
        || name.ends_with('.')
        || name.ends_with(' ')
        || name == ".."
    {
        c.problem(
            "output.output_name",
            format!("`{name}` is not a usable file name"),
            "use letters, digits, `-` and `_` (no path separators or any of < > : \" | ? *)",
        );
    }
    let save_dtype = match o.save_dtype {
        SaveDtype::Fp32 => FloatDtype::F32,
        SaveDtype::Bf16 => FloatDtype::Bf16,
        SaveDtype::Fp16 => FloatDtype::F16,
        SaveDtype::Dit => compute,
    };
    OutputPlan {
        output_dir: o.output_dir.clone(),
        output_name: o.output_name.clone(),
        save_every_n_steps: period(o.save_every_n_steps),
        save_every_n_epochs: period(o.save_every_n_epochs),
        save_state: o.save_state,
        save_dtype,
    }
}

fn check_sampling(c: &mut Checker, cfg: &RunConfig, family: ModelFamily) -> Option<SamplingPlan> {
    let s = &cfg.sampling;
    let (every_n_steps, every_n_epochs) = (
        period(s.sample_every_n_steps),
        period(s.sample_every_n_epochs),
    );
    let scheduled = every_n_steps.is_some() || every_n_epochs.is_some() || s.sample_at_first;
    let Some(prompts) = &s.prompts else {
        if scheduled {
            c.problem(
                "sampling.prompts",
                "samples are scheduled but no prompt file is set",
                "set sampling.prompts to a musubi-tuner prompt file, or remove sample_every_n_* / sample_at_first",
            );
        }
        return None;
    };
    c.existing("sampling.prompts", prompts, "prompt file");
    if !cfg.model.demo {
        for (key, path, what) in rules(family).sampling_files(cfg) {
            if path.as_os_str().is_empty() {
                c.problem(
                    key,
                    format!("sampling needs {what}"),
                    format!("set {key}, or remove sampling.prompts"),
                );
            }
        }
    }
    if !scheduled {
        c.note(
            "sampling.prompts is set but no sample is scheduled; samples come only when asked for",
        );
    }
    Some(SamplingPlan {
        prompts: prompts.clone(),
        every_n_steps,
        every_n_epochs,
        at_first: s.sample_at_first,
    })
}

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
