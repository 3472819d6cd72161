//! Building a [`PlanInput`] from a run config (the CLI, the app) or a validated `RunPlan` (the engine's setup).

use std::path::Path;

use super::bytes::{adapter_kind, BaseFormat};
use super::machine;
use super::working_set::WORKING_SET;
use super::{LoraShape, PlanError, PlanInput, PlanModel, StreamingSetup};
use crate::demo::project::{DEMO_FRAMES, DEMO_SIZE};
use framesmith_config::plan::{PlanDevice, RunPlan};
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::run::{Checkpointing, DeviceSpec, RunConfig};
use framesmith_config::training::DEFAULT_GPU_SLOTS;

/// The clip one training step sees: the largest bucket of the dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClipShape {
    pub width: usize,
    pub height: usize,
    /// Video frames (4k+1; 1 for an image).
    pub frames: usize,
    /// Samples per step.
    pub batch: usize,
}

/// The generated demo clips (`dataset.synthetic`), one per step.
pub const DEMO_CLIP: ClipShape = ClipShape {
    width: DEMO_SIZE,
    height: DEMO_SIZE,
    frames: DEMO_FRAMES,
    batch: 1,
};

/// The clip planned when nothing names one: 480p video, 832×480, 81 frames, batch 1.
pub const DEFAULT_CLIP: ClipShape = ClipShape {
    width: 832,
    height: 480,
    frames: 81,
    batch: 1,
};

impl ClipShape {
    /// The clip a config's dataset overrides name (`dataset.resolution`, the longest of `dataset.target_frames`),
    /// each missing part taken from `fallback`; the flag is true when any part was.
    pub fn from_config(cfg: &RunConfig, fallback: ClipShape) -> (Self, bool) {
        let d = &cfg.dataset;
        let (width, height) = d
            .resolution
            .map_or((fallback.width, fallback.height), |[w, h]| (w, h));
        let frames = d
            .target_frames
            .as_ref()
            .and_then(|f| f.iter().copied().max())
            .unwrap_or(fallback.frames);
        let assumed = d.resolution.is_none() || d.target_frames.is_none();
        (
            Self {
                width,
                height,
                frames,
                batch: fallback.batch,
            },
            assumed,
        )
    }
}

/// The largest clip a run trains on: the dataset config's largest (resolution × longest clip × batch), then the run
/// config's overrides (`dataset.resolution`, `dataset.target_frames`), then [`DEFAULT_CLIP`] for whatever is
/// still unknown. The note says what was assumed.
pub fn clip_for_config(cfg: &RunConfig) -> (ClipShape, Option<String>) {
    clip_with_dataset(cfg, None)
}

/// [`clip_for_config`], with the text of the dataset TOML the run will write (the app's Project tab) used when the
/// config names no dataset file.
pub fn clip_with_dataset(
    cfg: &RunConfig,
    dataset_toml: Option<&str>,
) -> (ClipShape, Option<String>) {
    let d = &cfg.dataset;
    // What will train is what is cached: the caches decide the clip, whatever the config's overrides say.
    if !d.synthetic && !d.config.as_os_str().is_empty() {
        if let Some(cached) = largest_cached_clip(&d.config, cfg.model.demo) {
            let (asked, _) = ClipShape::from_config(cfg, cached);
            let note = (asked != cached).then(|| {
                format!(
                    "planned for the largest cached clip ({}x{}, {} frames, batch {}): the run trains what is \
                     cached, and dataset.resolution / dataset.target_frames in the run config do not change the \
                     caches; to train other sizes, set them in {} and run `framesmith cache latents` again",
                    cached.width,
                    cached.height,
                    cached.frames,
                    cached.batch,
                    d.config.display()
                )
            });
            return (cached, note);
        }
    }
    let from_dataset = if d.synthetic {
        Some(DEMO_CLIP)
    } else if !d.config.as_os_str().is_empty() {
        framesmith_config::text_file::read_text(&d.config)
            .ok()
            .and_then(|text| largest_dataset_clip(&text, &d.config))
    } else {
        dataset_toml.and_then(|text| largest_dataset_clip(text, Path::new("dataset.toml")))
    };
    let known = from_dataset.is_some();
    let (clip, assumed) = ClipShape::from_config(cfg, from_dataset.unwrap_or(DEFAULT_CLIP));
    let note = (assumed && !known).then(|| {
        format!(
            "the clip size is assumed ({}x{}, {} frames, batch {}): set dataset.resolution and dataset.target_frames \
             or the dataset config",
            clip.width, clip.height, clip.frames, clip.batch
        )
    });
    (clip, note)
}

/// The largest clip among the latent caches of the datasets in the dataset TOML at `path`, as each family reads its
/// caches ([`crate::family::Family::largest_cached_clip`]); `None` when the TOML cannot be read or nothing is cached
/// yet. Entries that cannot be read do not change what is cached, so they do not stop the plan.
fn largest_cached_clip(path: &Path, demo: bool) -> Option<ClipShape> {
    let valid = framesmith_data::load_valid_with(path, framesmith_data::Unreadable::Skip).ok()?;
    crate::family::largest_cached_clip(&valid, demo)
}

/// The dataset of a musubi-tuner dataset TOML (read from `path`) with the most pixels per step; `None` when it
/// cannot be read.
fn largest_dataset_clip(text: &str, path: &Path) -> Option<ClipShape> {
    let parsed = framesmith_data::config::DatasetConfig::parse(text, path).ok()?;
    let base = path.parent().unwrap_or(Path::new("."));
    parsed
        .config
        .resolve(base)
        .iter()
        .map(|ds| {
            let frames = ds
                .video
                .as_ref()
                .and_then(|v| v.target_frames.iter().copied().max())
                .unwrap_or(1);
            ClipShape {
                width: ds.resolution.0 as usize,
                height: ds.resolution.1 as usize,
                frames: frames as usize,
                batch: ds.batch_size.max(1) as usize,
            }
        })
        .max_by_key(clip_pixels)
}

/// The largest clip among the latent caches of `valid`'s datasets whose file names `is_cache` takes (for the
/// dataset's kind), read from the files' headers, not their tensors: each latent shape `[c, f, h, w]` becomes a
/// clip through `clip` with the dataset's batch size. `None` when nothing is cached for the family.
pub(crate) fn largest_cached_clip_of(
    valid: &framesmith_data::ValidConfig,
    is_cache: impl Fn(&str, framesmith_data::DatasetKind) -> bool,
    clip: impl Fn([usize; 4], usize) -> ClipShape,
) -> Option<ClipShape> {
    valid
        .datasets
        .iter()
        .filter_map(|ds| {
            let dir = ds.cache_directory.as_ref()?;
            let batch = (ds.batch_size as usize).max(1);
            std::fs::read_dir(dir)
                .ok()?
                .filter_map(|entry| {
                    let name = entry.ok()?.file_name().into_string().ok()?;
                    if !is_cache(&name, ds.kind()) {
                        return None;
                    }
                    framesmith_data::cache::read_latent_shape(&dir.join(&name)).ok()
                })
                .map(|shape| clip(shape, batch))
                .max_by_key(clip_pixels)
        })
        .max_by_key(clip_pixels)
}

/// Pixels of a step of `c` (saturating: a dataset config can name any size), to find the largest clip.
pub(crate) fn clip_pixels(c: &ClipShape) -> u128 {
    [c.width, c.height, c.frames, c.batch]
        .into_iter()
        .fold(1u128, |n, d| n.saturating_mul(d as u128))
}

/// The model a config trains, as its family describes it: the demo model, a named variant, or the model read from
/// the DiT's header when `model.variant = "auto"` (reads the checkpoint's headers, not its weights).
pub fn model_for_config(cfg: &RunConfig) -> Result<PlanModel, PlanError> {
    crate::family::plan_model_of(cfg)
}

impl PlanInput {
    /// The plan of a raw run config (the CLI and the app plan before validation) for `model` and `clip`. The
    /// machine-dependent parts (`free_vram_bytes`, `host_ram_bytes`, `available_ram_bytes`, `windows`) are left
    /// for the caller.
    pub fn from_config(cfg: &RunConfig, model: impl Into<PlanModel>, clip: ClipShape) -> Self {
        let model = model.into();
        let base = BaseFormat::from_config(cfg.model.base_dtype, cfg.model.effective_fp8_scale());
        let mem = &cfg.memory;
        let mut input = Self {
            start_frame: false,
            sampling: None,
            model: model.clone(),
            compute: base.compute_dtype(),
            base,
            residual: cfg.model.residual_dtype,
            clip,
            lora: LoraShape {
                kind: adapter_kind(&cfg.lora),
                rank: cfg.lora.rank,
                include_patterns: cfg.lora.include_patterns.clone(),
                exclude_patterns: cfg.lora.exclude_patterns.clone(),
            },
            streaming: StreamingSetup {
                mode: mem.streaming,
                blocks_to_swap: mem.blocks_to_swap,
                activations: mem.activations,
                gpu_slots: DEFAULT_GPU_SLOTS,
                staging_slots: mem.staging_slots,
            },
            vram_budget_bytes: mem
                .vram_budget_gb
                .filter(|gb| gb.is_finite() && *gb > 0.0)
                .map(|gb| (gb * (1u64 << 30) as f64) as u64),
            free_vram_bytes: None,
            host_ram_bytes: None,
            ram_budget_bytes: mem
                .ram_budget_gb
                .filter(|gb| gb.is_finite() && *gb > 0.0)
                .map(|gb| (gb * (1u64 << 30) as f64) as u64),
            available_ram_bytes: None,
            pinned_budget_bytes: mem
                .pinned_budget_gb
                .filter(|gb| gb.is_finite() && *gb > 0.0)
                .map(|gb| (gb * (1u64 << 30) as f64) as u64),
            ranks_on_machine: 1,
            windows: cfg!(windows),
            working_set: WORKING_SET,
            checkpointing: mem.checkpointing,
            optimizer_and_context: true,
            on_cpu: cfg.training.device == DeviceSpec::Cpu,
            experts: None,
            fp8_products: cfg.model.fp8_matmul && matches!(base, BaseFormat::Fp8(_)),
        };
        model.settle(cfg, &mut input);
        input
    }

    /// The plan of a validated run: its resolved dtypes and memory settings, the loaded model's config and the
    /// step's largest clip. Set `free_vram_bytes` (and `host_ram_bytes`) from the device before planning.
    pub fn from_run_plan(plan: &RunPlan, model: impl Into<PlanModel>, clip: ClipShape) -> Self {
        let mut input = Self::from_config(&plan.config, model, clip);
        input.base = match plan.model.fp8_scale {
            Some(scale) => BaseFormat::Fp8(scale),
            None => BaseFormat::Dense(plan.model.compute_dtype),
        };
        input.compute = plan.model.compute_dtype;
        input.residual = plan.model.residual_dtype;
        input.fp8_products = plan.model.fp8_matmul;
        input.vram_budget_bytes = plan.memory.vram_budget_bytes;
        input.ram_budget_bytes = plan.memory.ram_budget_bytes;
        input.pinned_budget_bytes = plan.memory.pinned_budget_bytes;
        input.streaming.staging_slots = plan.memory.staging_slots;
        input.checkpointing = plan.memory.checkpointing;
        input.on_cpu = plan.device == PlanDevice::Cpu;
        input.ranks_on_machine = plan.memory.ranks_on_machine.max(1);
        input
    }
}

/// Plans a run config on this machine: the model it names (or its DiT's header), its largest clip (from its
/// dataset file, else `dataset_toml`, see [`clip_with_dataset`]), the free memory of the card `training.device`
/// names and the RAM. What the app's "Will it fit?" shows.
pub fn plan_config(cfg: &RunConfig, dataset_toml: Option<&str>) -> Result<PlanReport, PlanError> {
    let model = model_for_config(cfg)?;
    let (clip, clip_note) = clip_with_dataset(cfg, dataset_toml);
    let mut input = PlanInput::from_config(cfg, model, clip);
    input.probe_machine(cfg.training.device);
    let mut report = super::plan(&input)?;
    report.notes.extend(clip_note);
    Ok(report)
}

/// The plan of a validated run on this machine, for the engine's setup: call it before the DiT is loaded (the
/// free memory it reads must not include the model's own), with the loaded checkpoint's config and the largest
/// clip of the training set. `report.blocks_to_swap` is what to stream (the planner's choice for
/// `blocks_to_swap = "auto"`, else the configured count); `report.verdict_line()` is worth logging, and
/// `Verdict::DoesNotFit` worth a warning with `report.suggestions`.
pub fn plan_run(
    plan: &RunPlan,
    model: impl Into<PlanModel>,
    clip: ClipShape,
) -> Result<PlanReport, PlanError> {
    let mut input = PlanInput::from_run_plan(plan, model, clip);
    input.probe_machine(match plan.device {
        PlanDevice::Cpu => DeviceSpec::Cpu,
        PlanDevice::Cuda(n) => DeviceSpec::Cuda(n),
    });
    super::plan(&input)
}

/// What the step of a validated run keeps in RAM for each block when its saved activations wait there
/// ([`super::host_activation_block_bytes`]) under `checkpointing` (the run's, settled), for the loaded
/// checkpoint's config and the step's largest clip, as [`plan_run`] plans them.
pub fn host_activation_blocks(
    plan: &RunPlan,
    model: impl Into<PlanModel>,
    clip: ClipShape,
    checkpointing: Checkpointing,
) -> Result<Vec<u64>, PlanError> {
    let input = PlanInput::from_run_plan(plan, model, clip);
    let sizes = super::sizes(&input)?;
    Ok(super::host_activation_block_bytes(checkpointing, &sizes))
}

impl PlanInput {
    /// Reads the free memory of the card `device` names (none for the CPU), the total RAM and what of it the
    /// machine can give now.
    pub fn probe_machine(&mut self, device: DeviceSpec) {
        self.host_ram_bytes = machine::host_ram_bytes();
        self.available_ram_bytes = machine::available_ram_bytes();
        self.free_vram_bytes = match device {
            DeviceSpec::Cpu => None,
            DeviceSpec::Auto => machine::free_vram_bytes(0),
            DeviceSpec::Cuda(n) => machine::free_vram_bytes(n),
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use framesmith_config::protocol::memory::Placement;

    #[test]
    fn the_demo_plans_its_own_cpu_run() {
        let config = framesmith_config::presets::builtin("demo-cpu")
            .and_then(|p| p.apply(&RunConfig::default()))
            .expect("demo-cpu applies")
            .config;
        let report = plan_config(&config, None).expect("the demo plans");
        assert!(report.on_cpu);
        assert_eq!(report.peak_vram_bytes, 0);
        assert!(report
            .breakdown
            .iter()
            .all(|l| l.placement == Placement::Host));
        assert!(!report.breakdown.iter().any(|l| l.label.contains("CUDA")));
        // 64×64 pixels → 16×16 demo-codec latents and 1×1 patches, 5 frames → 2 latent frames (the first, then 4).
        assert_eq!(report.tokens, 2 * 16 * 16);
        assert!(
            report.workload.starts_with("64x64, 5 frames"),
            "{}",
            report.workload
        );
        assert!(
            report.model.starts_with("tiny demo model"),
            "{}",
            report.model
        );
        assert!(
            report.verdict_line().contains("CPU"),
            "{}",
            report.verdict_line()
        );
        assert!(report.peak_ram_bytes < 1 << 30, "{}", report.peak_ram_bytes);
    }
}
