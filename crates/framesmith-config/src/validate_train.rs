//! Validation of the numeric training sections: `[optimizer]` (AdamW and the LR schedule), `[training]`
//! (length, timestep sampling) and `[memory]` (CUDA-only streaming knobs, checkpointing).

use super::plan::{
    HostInfo, MemoryPlan, ModelFamily, PlanDevice, SchedulePlan, TrainLength, TrainingPlan,
};
use super::run::{
    BlocksToSwap, Checkpointing, LrScheduler, MemorySection, RunConfig, StreamingMode,
    TimestepSampling,
};
use super::validate::Checker;
use crate::catalog::TrainingModeError;
use crate::schedule::POLYNOMIAL_LR_END;
use crate::training::{AdamWConfig, TimestepConfig, DEFAULT_GPU_SLOTS, NUM_TRAIN_TIMESTEPS};

const GIB: f64 = (1u64 << 30) as f64;

pub(crate) fn check_optimizer(c: &mut Checker, cfg: &RunConfig) -> (AdamWConfig, SchedulePlan) {
    let o = &cfg.optimizer;
    c.positive(
        "optimizer.learning_rate",
        o.learning_rate,
        "use e.g. 1e-4 (LoRA usually trains at 5e-5 to 5e-4)",
    );
    if o.learning_rate.is_finite() && o.learning_rate > 1.0 {
        c.problem(
            "optimizer.learning_rate",
            format!(
                "{} is above 1: AdamW moves each LoRA weight by about the learning rate every step, so the run \
                 diverges at once",
                o.learning_rate
            ),
            "use e.g. 1e-4 (LoRA usually trains at 5e-5 to 5e-4)",
        );
    } else if o.learning_rate.is_finite() && o.learning_rate > 0.1 {
        c.note(format!("optimizer.learning_rate = {} is very high for AdamW; LoRAs usually train at 5e-5 to 5e-4", o.learning_rate));
    }
    for (i, beta) in o.betas.iter().enumerate() {
        if !(0.0..1.0).contains(beta) {
            c.problem(
                &format!("optimizer.betas[{i}]"),
                format!("must be in [0, 1), not {beta}"),
                "use betas = [0.9, 0.999]",
            );
        }
    }
    c.positive("optimizer.eps", o.eps, "use eps = 1e-8");
    if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
        c.problem(
            "optimizer.weight_decay",
            format!("must be 0 or more, not {}", o.weight_decay),
            "use weight_decay = 0.01",
        );
    }
    if !(o.max_grad_norm.is_finite() && o.max_grad_norm >= 0.0) {
        c.problem(
            "optimizer.max_grad_norm",
            format!("must be 0 (off) or more, not {}", o.max_grad_norm),
            "use max_grad_norm = 1.0",
        );
    }
    check_schedule(c, cfg);
    let adamw = AdamWConfig {
        beta1: o.betas[0],
        beta2: o.betas[1],
        eps: o.eps,
        weight_decay: o.weight_decay,
        max_grad_norm: (o.max_grad_norm > 0.0).then_some(o.max_grad_norm),
    };
    let schedule = SchedulePlan {
        kind: o.lr_scheduler,
        base_lr: o.learning_rate,
        warmup_steps: o.lr_warmup_steps,
        num_cycles: o.lr_scheduler_num_cycles,
        power: o.lr_scheduler_power,
    };
    (adamw, schedule)
}

fn check_schedule(c: &mut Checker, cfg: &RunConfig) {
    let o = &cfg.optimizer;
    match o.lr_scheduler {
        LrScheduler::Constant if o.lr_warmup_steps > 0 => c.problem(
            "optimizer.lr_warmup_steps",
            "the constant schedule has no warmup",
            "set lr_scheduler = \"constant_with_warmup\", or lr_warmup_steps = 0",
        ),
        LrScheduler::CosineWithRestarts if o.lr_scheduler_num_cycles == 0 => c.problem(
            "optimizer.lr_scheduler_num_cycles",
            "must be at least 1",
            "use lr_scheduler_num_cycles = 1 (no restart) or more",
        ),
        LrScheduler::Polynomial => {
            c.positive(
                "optimizer.lr_scheduler_power",
                o.lr_scheduler_power,
                "use lr_scheduler_power = 1.0 (linear)",
            );
            if o.learning_rate <= POLYNOMIAL_LR_END {
                c.problem(
                    "optimizer.learning_rate",
                    format!("the polynomial schedule decays to {POLYNOMIAL_LR_END:e}, so it must start above that"),
                    "raise learning_rate or use another lr_scheduler",
                );
            }
        }
        _ => {}
    }
    let steps = cfg.training.max_train_steps;
    if o.lr_scheduler != LrScheduler::Constant
        && cfg.training.max_train_epochs.unwrap_or(0) == 0
        && o.lr_warmup_steps > steps
    {
        c.problem(
            "optimizer.lr_warmup_steps",
            format!(
                "{} warmup steps is more than the run's {steps} steps",
                o.lr_warmup_steps
            ),
            "lower lr_warmup_steps (a few percent of the run is typical)",
        );
    }
}

/// `training.mode` against the named `variant` (a detected model is checked when the engine loads it).
pub(crate) fn check_mode(c: &mut Checker, cfg: &RunConfig, variant: Option<&str>) {
    let Some(v) = variant.and_then(crate::catalog::variant) else {
        return;
    };
    if let Err(e) = v.start_image.training_mode(cfg.training.mode, v.name) {
        let fix = match e {
            TrainingModeError::NoStartImage { .. } => {
                "remove training.mode or set it to \"text_to_video\""
            }
            TrainingModeError::NeedsStartImage { .. } => {
                "remove training.mode or set it to \"image_to_video\""
            }
        };
        c.problem("training.mode", e.to_string(), fix);
    }
}

/// `training.first_frame_conditioning_p`: a probability, and only for a family whose runs read it (`supported`).
pub(crate) fn check_first_frame_conditioning(
    c: &mut Checker,
    cfg: &RunConfig,
    (family, supported): (ModelFamily, bool),
) {
    let Some(p) = cfg.training.first_frame_conditioning_p else {
        return;
    };
    let key = "training.first_frame_conditioning_p";
    if !supported {
        c.problem(
            key,
            format!("{family} runs have no first-frame conditioning"),
            "remove training.first_frame_conditioning_p",
        );
    } else if !(0.0..=1.0).contains(&p) {
        c.problem(
            key,
            format!("is {p}, not a probability"),
            "set it between 0 and 1 (0.1 is the official trainer's default)",
        );
    }
}

pub(crate) fn check_training(c: &mut Checker, cfg: &RunConfig) -> TrainingPlan {
    let t = &cfg.training;
    // max_train_epochs = 0 means "by steps", so an overlay can switch back from epochs.
    let length = match t.max_train_epochs.filter(|&e| e > 0) {
        Some(e) => TrainLength::Epochs(e),
        None => {
            if t.max_train_steps == 0 {
                c.problem(
                    "training.max_train_steps",
                    "must be at least 1",
                    "set the number of optimizer steps, e.g. 1600",
                );
            }
            TrainLength::Steps(t.max_train_steps)
        }
    };
    if t.gradient_accumulation_steps == 0 {
        c.problem(
            "training.gradient_accumulation_steps",
            "must be at least 1",
            "use 1 (no accumulation) or more",
        );
    }
    if i64::try_from(t.seed).is_err() {
        c.problem(
            "training.seed",
            "does not fit a TOML integer (at most 9223372036854775807)",
            "use a smaller seed",
        );
    }
    if t.max_consecutive_nonfinite == 0 {
        c.problem(
            "training.max_consecutive_nonfinite",
            "must be at least 1",
            "use e.g. 5",
        );
    }
    TrainingPlan {
        mode: t.mode,
        length,
        gradient_accumulation_steps: t.gradient_accumulation_steps,
        seed: t.seed,
        max_consecutive_nonfinite: t.max_consecutive_nonfinite,
        timesteps: check_timesteps(c, cfg),
    }
}

fn check_timesteps(c: &mut Checker, cfg: &RunConfig) -> TimestepConfig {
    let t = &cfg.training;
    c.positive(
        "training.discrete_flow_shift",
        t.discrete_flow_shift,
        "use e.g. 3.0 (Wan 480p) or 5.0 (720p)",
    );
    c.positive(
        "training.sigmoid_scale",
        t.sigmoid_scale,
        "use sigmoid_scale = 1.0",
    );
    c.positive("training.logit_std", t.logit_std, "use logit_std = 1.0");
    if !t.logit_mean.is_finite() {
        c.problem(
            "training.logit_mean",
            "must be a finite number",
            "use logit_mean = 0.0",
        );
    }
    let max = NUM_TRAIN_TIMESTEPS as f64;
    let (lo, hi) = (t.min_timestep, t.max_timestep);
    if !(0.0..max).contains(&lo) {
        c.problem(
            "training.min_timestep",
            format!("must be in [0, {max}), not {lo}"),
            "use min_timestep = 0",
        );
    }
    if !(hi > 0.0 && hi <= max) {
        c.problem(
            "training.max_timestep",
            format!("must be in (0, {max}], not {hi}"),
            "use max_timestep = 1000",
        );
    } else if lo.is_finite() && hi.floor() - lo.floor() < 1.0 {
        c.problem(
            "training.max_timestep",
            format!("must be at least 1 above min_timestep ({lo})"),
            "widen the range [min_timestep, max_timestep]",
        );
    }
    if t.preserve_distribution_shape && t.timestep_sampling == TimestepSampling::Sigma {
        c.note(
            "training.preserve_distribution_shape has no effect with timestep_sampling = \"sigma\"",
        );
    }
    TimestepConfig {
        sampling: t.timestep_sampling,
        discrete_flow_shift: t.discrete_flow_shift,
        sigmoid_scale: t.sigmoid_scale,
        logit_mean: t.logit_mean,
        logit_std: t.logit_std,
        min_timestep: lo,
        max_timestep: hi,
        preserve_distribution_shape: t.preserve_distribution_shape,
        weighting: t.weighting_scheme,
    }
}

/// `num_layers` is known when the config names the variant; `None` leaves the block count to the loader.
pub(crate) fn check_memory(
    c: &mut Checker,
    m: &MemorySection,
    device: PlanDevice,
    host: &HostInfo,
    num_layers: Option<usize>,
) -> MemoryPlan {
    let streams = m.streaming != StreamingMode::Off;
    match m.blocks_to_swap {
        BlocksToSwap::Count(n) if n > 0 && !streams => c.problem(
            "memory.blocks_to_swap",
            format!("{n} blocks to stream, but memory.streaming = \"off\""),
            "set memory.streaming = \"pinned\" or \"staged\", or blocks_to_swap = 0",
        ),
        BlocksToSwap::Auto(_) if !streams => c.problem(
            "memory.blocks_to_swap",
            "\"auto\" picks blocks to stream, but memory.streaming = \"off\"",
            "set memory.streaming = \"pinned\" or \"staged\", or blocks_to_swap = 0",
        ),
        BlocksToSwap::Count(0) if streams => {
            c.note("memory.streaming is on but blocks_to_swap = 0: every block stays on the GPU")
        }
        BlocksToSwap::Count(n) => {
            if let Some(layers) = num_layers.filter(|&l| n >= l) {
                c.problem(
                    "memory.blocks_to_swap",
                    format!("{n} blocks to stream, but the model has {layers}"),
                    format!("use at most {} (or \"auto\")", layers - 1),
                );
            } else if n > 0 && n <= DEFAULT_GPU_SLOTS {
                c.note(format!(
                    "memory.blocks_to_swap = {n} saves no VRAM: each streamed block needs one of the \
                     {DEFAULT_GPU_SLOTS} GPU slots it is copied into; stream more, or none"
                ));
            }
        }
        BlocksToSwap::Auto(_) => {}
    }
    let vram_budget_bytes = budget_bytes(
        c,
        ("memory.vram_budget_gb", m.vram_budget_gb),
        "use the GB to leave for training, e.g. 22, or remove the key",
    );
    let ram_budget_bytes = budget_bytes(
        c,
        ("memory.ram_budget_gb", m.ram_budget_gb),
        "use the GB of RAM the run may take, e.g. 28 on a machine of 32, or remove the key",
    );
    let pinned_budget_bytes = pinned_budget(c, m, ram_budget_bytes);
    check_staging(c, m);
    check_checkpointing(c, m);
    let applies = device.is_cuda();
    if !applies {
        note_cpu_ignores(c, m);
    } else if m.shared_memory_guard && !host.windows {
        c.note("memory.shared_memory_guard acts on Windows only; it is off here");
    }
    MemoryPlan {
        applies,
        streaming: m.streaming,
        blocks_to_swap: m.blocks_to_swap,
        activations: m.activations,
        checkpointing: m.checkpointing,
        vram_budget_bytes,
        ram_budget_bytes,
        pinned_budget_bytes,
        staging_slots: m.staging_slots,
        flux_stream_order: m.flux_stream_order,
        shared_memory_guard: applies && host.windows && m.shared_memory_guard,
        ranks_on_machine: 1,
    }
}

/// `memory.pinned_budget_gb` in bytes: a positive number of GB, no more than the RAM budget it is part of.
fn pinned_budget(c: &mut Checker, m: &MemorySection, ram_budget_bytes: Option<u64>) -> Option<u64> {
    let pinned_budget_bytes = budget_bytes(
        c,
        ("memory.pinned_budget_gb", m.pinned_budget_gb),
        "use the GB of page-locked RAM the run may take, e.g. 14 on a Windows machine of 32, or remove the key",
    );
    if let (Some(pinned), Some(ram)) = (pinned_budget_bytes, ram_budget_bytes) {
        if pinned > ram {
            c.problem(
                "memory.pinned_budget_gb",
                "the page-locked budget is more than memory.ram_budget_gb, and page-locked memory is part of the RAM",
                "use at most memory.ram_budget_gb, or remove the key",
            );
        }
    }
    pinned_budget_bytes
}

/// `memory.staging_slots`: at least one for `staged` streaming, a note when too few overlap or when nothing uses
/// them (`"auto"` streaming may stage).
fn check_staging(c: &mut Checker, m: &MemorySection) {
    let staged = matches!(m.streaming, StreamingMode::Staged | StreamingMode::Auto);
    if m.streaming == StreamingMode::Staged && m.staging_slots == 0 {
        c.problem(
            "memory.staging_slots",
            "staged streaming needs at least 1 staging buffer",
            "use staging_slots = 4 (four 8 MiB buffers: one fills while the others copy to the GPU)",
        );
    } else if staged && m.staging_slots < 3 {
        c.note(format!(
            "memory.staging_slots = {}: the host copy and the GPU copy barely overlap; 4 is faster",
            m.staging_slots
        ));
    } else if !staged && m.staging_slots != MemorySection::default().staging_slots {
        c.note(
            "memory.staging_slots is used by memory.streaming = \"staged\" (or \"auto\") only; it is ignored here",
        );
    }
}

/// A budget setting (`key`, its GB) in bytes, a problem when it is not a positive number.
fn budget_bytes(c: &mut Checker, (key, gb): (&str, Option<f64>), fix: &str) -> Option<u64> {
    let gb = gb?;
    c.positive(key, gb, fix);
    (gb.is_finite() && gb > 0.0).then_some((gb * GIB) as u64)
}

/// `checkpointing = "off"` keeps each block's input inside its tape on the device, so there is no saved input
/// left for `activations = "host"` to move: the two together would silently keep everything on the GPU.
fn check_checkpointing(c: &mut Checker, m: &MemorySection) {
    if m.checkpointing == Checkpointing::Off && m.activations.is_host() {
        c.problem(
            "memory.checkpointing",
            "\"off\" keeps every block's whole forward (its input included) on the GPU, so \
             memory.activations = \"host\" has nothing to move to RAM",
            "set memory.checkpointing = \"blocks\" (or \"attention\") to keep saved inputs in RAM, or \
             memory.activations = \"device\"",
        );
    }
}

/// Names the memory knobs a CPU run ignores (only those set away from their defaults).
fn note_cpu_ignores(c: &mut Checker, m: &MemorySection) {
    let d = MemorySection::default();
    let mut set = Vec::new();
    if m.streaming != d.streaming {
        set.push("streaming");
    }
    if m.blocks_to_swap != d.blocks_to_swap {
        set.push("blocks_to_swap");
    }
    if m.activations != d.activations {
        set.push("activations");
    }
    if m.vram_budget_gb != d.vram_budget_gb {
        set.push("vram_budget_gb");
    }
    if m.pinned_budget_gb != d.pinned_budget_gb {
        set.push("pinned_budget_gb");
    }
    if m.staging_slots != d.staging_slots {
        set.push("staging_slots");
    }
    if m.shared_memory_guard != d.shared_memory_guard {
        set.push("shared_memory_guard");
    }
    if !set.is_empty() {
        let keys: Vec<String> = set.iter().map(|k| format!("memory.{k}")).collect();
        c.note(format!(
            "{} act on a CUDA device only; this CPU run ignores them",
            keys.join(", ")
        ));
    }
}
