//! Building a `Trainer` from a `StartRun`: validate the config into a plan for the run's model family, let the
//! family open the device, load its model, attach the LoRA and load the training data
//! ([`crate::family::Family::start_run`]), then set up the optimizer, schedules, outputs and samples, and resume
//! when asked. Also what every family's setup shares: the device, the memory plan's log and advice, block
//! streaming's count, the VRAM budget's hold, the LoRA's settings and metadata.

use std::collections::HashMap;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::family::{family_of, FamilyRun};
use crate::plan::adapter_kind;
use crate::train::data::TrainSet;
use crate::train::optimizer::AdamW;
use crate::train::outputs::Outputs;
use crate::train::placements;
use crate::train::preflight;
use crate::train::ranks::Ranks;
use crate::train::samples::Sampling;
use crate::train::startup::Startup;
use crate::train::trainer::Trainer;
use crate::train::validation::Validation;
use framesmith_config::plan::{FloatDtype, PlanDevice};
use framesmith_config::protocol::memory::{format_gib, PlanReport};
use framesmith_config::protocol::{LogLevel, StartRun};
use framesmith_config::run::{BlocksToSwap, LoraKind};
use framesmith_config::{validate_for, HostInfo, RunPlan};
use framesmith_nn::collective::broadcast_tensors;
use framesmith_nn::device::{DeviceError, VramHold};
use framesmith_nn::lora::{LoraSet, LoraSpec};
use framesmith_nn::offload::OffloadOptions;

pub(crate) fn device_for(plan: &RunPlan) -> anyhow::Result<Device> {
    let device = open_device(plan.device)?;
    if plan.model.fp8_matmul {
        check_fp8_products(&device)?;
    }
    set_attention_precision(&device, plan.model.fp8_attention)?;
    Ok(device)
}

/// Opens `spec`, a further device `plan` trains on (a second expert's), with the attention `plan` asks for.
pub(crate) fn training_device(plan: &RunPlan, spec: PlanDevice) -> anyhow::Result<Device> {
    let device = open_device(spec)?;
    set_attention_precision(&device, plan.model.fp8_attention)?;
    Ok(device)
}

/// `model.fp8_attention`: attention on `device` runs cuDNN's FP8 kernels from now on (after one small FP8
/// attention forward and backward, so a card or cuDNN without them fails here with the fix rather than in the
/// first step), or bf16 ones (turned back off for a later run in the same process).
fn set_attention_precision(device: &Device, fp8: bool) -> anyhow::Result<()> {
    framesmith_nn::device::set_fp8_attention(device, fp8)
        .map_err(|e| anyhow::anyhow!("model.fp8_attention: {e}: set fp8_attention = false"))
}

/// `model.fp8_matmul`: one small FP8 product on `device` before anything loads, so a card or cuBLAS without them
/// fails here with the fix rather than in the first step.
fn check_fp8_products(device: &Device) -> anyhow::Result<()> {
    match framesmith_nn::device::probe_fp8_matmul(device) {
        Ok(()) => Ok(()),
        Err(DeviceError::NotBuilt(_)) => anyhow::bail!(
            "model.fp8_matmul needs a CUDA build of Framesmith on an NVIDIA GPU: set fp8_matmul = false"
        ),
        Err(e) => anyhow::bail!(
            "model.fp8_matmul: this GPU cannot run FP8 matrix products ({e}); they need FP8 tensor cores (Hopper, \
             compute capability 9.0 or newer) and cuBLAS 12.9 or newer: set fp8_matmul = false"
        ),
    }
}

/// Opens `device` (a CUDA one after checking the driver and the card's compute capability).
pub(crate) fn open_device(device: PlanDevice) -> anyhow::Result<Device> {
    match device {
        PlanDevice::Cpu => Ok(Device::Cpu),
        PlanDevice::Cuda(i) => {
            let device = framesmith_nn::device::open_cuda(i).map_err(|e| match e {
                DeviceError::DriverMissing(why) => anyhow::anyhow!("cannot open CUDA device {i}: {why}"),
                e => anyhow::Error::new(e).context(format!(
                    "cannot open CUDA device {i}; set training.device = \"cpu\" or check the NVIDIA driver"
                )),
            })?;
            check_compute_capability(&device, i)?;
            Ok(device)
        }
    }
}

/// Refuses a card older than the kernels support, naming it, before any kernel is launched on it.
fn check_compute_capability(device: &Device, index: usize) -> anyhow::Result<()> {
    use framesmith_config::protocol::doctor::MIN_COMPUTE_CAPABILITY as MIN;
    if let Some((major, minor)) = framesmith_nn::device::compute_capability(device)? {
        if (major, minor) < (MIN.major, MIN.minor) {
            anyhow::bail!(
                "CUDA device {index} has compute capability {major}.{minor}; Framesmith's GPU kernels need {MIN} or \
                 newer (RTX 30 series, A100 or newer): train on such a card, or set training.device = \"cpu\""
            );
        }
    }
    Ok(())
}

/// How the run log names a device: `cpu`, `cuda:0`.
pub(crate) fn device_label(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

pub(crate) fn float_dtype(d: FloatDtype) -> DType {
    match d {
        FloatDtype::F32 => DType::F32,
        FloatDtype::Bf16 => DType::BF16,
        FloatDtype::F16 => DType::F16,
    }
}

/// How many of a model's `blocks` a run streams (`memory.blocks_to_swap`, the memory plan's count for `"auto"`)
/// and the ring settings, for any model; `None` when nothing streams (streaming off, a CPU run, or a count of 0).
/// A count that leaves no block resident is refused, the error saying what `model` has ("this model has 40 blocks").
pub(crate) fn blocks_to_swap(
    plan: &RunPlan,
    device: &Device,
    memory: Option<&MemoryReport>,
    blocks: usize,
    model: &str,
) -> anyhow::Result<Option<(usize, OffloadOptions)>> {
    if !plan.memory.applies || !device.is_cuda() {
        return Ok(None);
    }
    placements::refuse_swapping(&plan.memory, memory)?;
    let Some(mode) = placements::stream_mode(&plan.memory, memory)? else {
        return Ok(None);
    };
    let blocks_to_swap = match plan.memory.blocks_to_swap {
        BlocksToSwap::Count(n) if n >= blocks => anyhow::bail!(
            "memory.blocks_to_swap = {n}, but {model}: stream at most {}, or \"auto\"",
            blocks.saturating_sub(1)
        ),
        BlocksToSwap::Count(n) => n,
        BlocksToSwap::Auto(_) => match memory {
            Some(Ok(report)) => auto_count(report)?,
            Some(Err(e)) => anyhow::bail!("planning memory for blocks_to_swap = \"auto\": {e}"),
            None => anyhow::bail!("blocks_to_swap = \"auto\" needs the run's memory plan"),
        },
    };
    if blocks_to_swap == 0 {
        return Ok(None);
    }
    let offload = OffloadOptions {
        mode,
        slots: framesmith_config::training::DEFAULT_GPU_SLOTS,
        staging_slots: plan.memory.staging_slots.max(1),
        ..OffloadOptions::default()
    };
    Ok(Some((blocks_to_swap, offload)))
}

/// The block count `blocks_to_swap = "auto"` streams: the plan's. "auto" never picks a plan that swaps: with no
/// count that fits the RAM, the run does not start.
pub(crate) fn auto_count(report: &PlanReport) -> anyhow::Result<usize> {
    match &report.ram_shortfall {
        Some(short) => anyhow::bail!(
            "blocks_to_swap = \"auto\" found no plan that fits the RAM: {short} (or set memory.ram_budget_gb \
             if the machine can give more)"
        ),
        None => Ok(report.blocks_to_swap),
    }
}

/// The memory plan of a run, or why it could not be made.
pub(crate) type MemoryReport = Result<PlanReport, String>;

/// Logs the memory plan: its verdict, placements and limits, what would fit when it predicts no fit, and a warning
/// when the RAM of the ranks on this machine nears the machine's.
pub(crate) fn log_plan(report: &PlanReport, log: &mut dyn FnMut(LogLevel, String)) {
    log(
        LogLevel::Info,
        format!("memory plan: {}", report.verdict_line()),
    );
    if let Some(placements) = &report.placements {
        log(
            LogLevel::Info,
            format!("memory plan: placements: {placements}"),
        );
    }
    if let Some(limits) = report.limits_line() {
        log(LogLevel::Info, format!("memory plan: {limits}"));
    }
    if !report.fits() && !report.suggestions.is_empty() {
        let options: Vec<String> = report.suggestions.iter().map(|s| s.to_string()).collect();
        log(
            LogLevel::Warn,
            format!(
                "the plan predicts this run does not fit; to fit: {}",
                options.join("; or ")
            ),
        );
    }
    if let Some(warning) = report.ram_pressure() {
        log(LogLevel::Warn, format!("memory plan: {warning}"));
    }
    if let Some(busy) = &report.busy_gpu {
        log(LogLevel::Warn, format!("memory plan: {busy}"));
    }
}

/// Holds back device memory beyond the run's VRAM budget (`memory.vram_budget_gb`) for as long as the returned
/// value lives, so the run fails where a card of that size would.
pub(crate) fn reserve_budget(plan: &RunPlan, device: &Device) -> anyhow::Result<Option<VramHold>> {
    match plan.memory.vram_budget_bytes {
        Some(budget) if plan.memory.applies => {
            framesmith_nn::device::hold_vram_budget(device, budget)
                .context("reserving device memory beyond memory.vram_budget_gb")
        }
        _ => Ok(None),
    }
}

/// What to change after an out-of-memory failure of this run, from the memory planner's view of it: its
/// suggestions when it predicted the run would not fit, or more streamed blocks than it chose when it predicted a
/// fit (the prediction was low or something else took memory); the general advice when there is no plan.
pub fn out_of_memory_advice(report: Option<&PlanReport>) -> String {
    let Some(report) = report else {
        return OUT_OF_MEMORY_ADVICE.to_string();
    };
    let peak = format_gib(report.peak_vram_bytes);
    let budget = report
        .vram_budget_bytes
        .map(format_gib)
        .unwrap_or_else(|| "an unknown".into());
    if !report.fits() && !report.suggestions.is_empty() {
        let options: Vec<String> = report
            .suggestions
            .iter()
            .take(3)
            .map(|s| s.to_string())
            .collect();
        return format!(
            "The planner predicts {peak} against the {budget} budget; to fit: {}. Checkpoints already saved are kept.",
            options.join("; or ")
        );
    }
    let more = (report.blocks_to_swap + (report.num_blocks / 10).max(2)).min(report.num_blocks);
    if more > report.blocks_to_swap {
        format!(
            "The planner predicted {peak} of the {budget} budget with {} of {} blocks streamed, so something else \
             took memory or the prediction was low: stream more blocks (memory.blocks_to_swap = {more}), or lower \
             memory.vram_budget_gb to leave room. Checkpoints already saved are kept.",
            report.blocks_to_swap, report.num_blocks
        )
    } else {
        OUT_OF_MEMORY_ADVICE.to_string()
    }
}

/// What to change after an out-of-memory failure, when the planner has nothing more specific.
pub const OUT_OF_MEMORY_ADVICE: &str = "Checkpoints already saved are kept. To fit: stream more blocks \
    (memory.blocks_to_swap = \"auto\" picks the smallest number that fits), keep only block inputs for the \
    backward (memory.checkpointing = \"blocks\"), keep saved activations in RAM (memory.activations = \"host\"), \
    or lower dataset.resolution / target_frames; `framesmith plan --config \
    run.toml` shows where the memory goes.";

/// The LoRA file's metadata every family's LoRA carries: musubi-tuner's `ss_*` keys, modelspec
/// (`implementation`: the model's official code) and the run's numerics; the family adds its network module,
/// mode and timestep keys.
pub(crate) fn lora_metadata(
    plan: &RunPlan,
    base_name: &str,
    implementation: &str,
) -> HashMap<String, String> {
    let m = &plan.model;
    let mut meta = HashMap::new();
    let mut put = |k: &str, v: String| {
        meta.insert(k.to_string(), v);
    };
    put("ss_network_dim", plan.lora.rank.to_string());
    put("ss_network_alpha", plan.lora.alpha.to_string());
    put("ss_base_model_version", base_name.into());
    put("ss_output_name", plan.output.output_name.clone());
    put("ss_learning_rate", plan.schedule.base_lr.to_string());
    put(
        "ss_lr_scheduler",
        format!("{:?}", plan.schedule.kind).to_lowercase(),
    );
    put("ss_seed", plan.training.seed.to_string());
    put(
        "ss_gradient_accumulation_steps",
        plan.training.gradient_accumulation_steps.to_string(),
    );
    put(
        "ss_timestep_sampling",
        format!("{:?}", plan.training.timesteps.sampling).to_lowercase(),
    );
    put(
        "ss_discrete_flow_shift",
        plan.training.timesteps.discrete_flow_shift.to_string(),
    );
    put("ss_training_comment", "trained with Framesmith".into());
    put("modelspec.sai_model_spec", "1.0.0".into());
    put("modelspec.architecture", format!("{base_name}/lora"));
    put("modelspec.implementation", implementation.into());
    put("modelspec.title", plan.output.output_name.clone());
    put("framesmith.version", env!("CARGO_PKG_VERSION").into());
    put(
        "framesmith.base_dtype",
        format!("{:?}", m.base_dtype).to_lowercase(),
    );
    put("framesmith.fp8_matmul", m.fp8_matmul.to_string());
    put("framesmith.fp8_attention", m.fp8_attention.to_string());
    put(
        "framesmith.fp8_scale",
        m.fp8_scale
            .map_or("none".into(), |s| format!("{s:?}").to_lowercase()),
    );
    meta
}

/// LyCORIS' keys for a LoKr, LoHa or DoRA run, over the family's (`ss_network_module = "lycoris.kohya"` with
/// `ss_network_args` naming the algorithm and its options, as LyCORIS' kohya network writes them), and
/// `framesmith.lora_kind`. A plain LoRA's metadata stays as the family wrote it.
fn add_kind_metadata(plan: &RunPlan, meta: &mut HashMap<String, String>) {
    let l = &plan.lora;
    let py_bool = |b: bool| if b { "True" } else { "False" };
    let args = match l.kind {
        LoraKind::Lora => return,
        LoraKind::Lokr => serde_json::json!({
            "algo": "lokr",
            "factor": l.factor.to_string(),
            "decompose_both": py_bool(l.decompose_both),
            "full_matrix": py_bool(l.full_matrix),
        }),
        LoraKind::Loha => serde_json::json!({ "algo": "loha" }),
        LoraKind::Dora => serde_json::json!({
            "algo": "lora",
            "dora_wd": "True",
            "wd_on_output": "True",
        }),
    };
    meta.insert("ss_network_module".into(), "lycoris.kohya".into());
    meta.insert("ss_network_args".into(), args.to_string());
    meta.insert(
        "framesmith.lora_kind".into(),
        adapter_kind(&plan.config.lora).name().into(),
    );
}

impl Trainer {
    /// Validates the request's config and builds the run; resumes when asked. A new run writes into its own
    /// folder (`config::outputs::new_run_dir`), so it never replaces or prunes another run's files; a resumed run
    /// goes on in the folder of the state it continues, which must have been made with a matching config.
    pub fn start(
        request: &StartRun,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<Trainer> {
        Self::start_ranked(request, &Ranks::One, log)
    }

    /// [`Trainer::start`] as one rank of a run over several GPUs (`ranks`, see [`crate::train::ranks`]): the
    /// rank trains on its own GPU, meets the others once its model is loaded, and starts from rank 0's LoRA.
    /// Only rank 0 takes a run folder and writes into it; every rank resumes from the same state.
    pub fn start_ranked(
        request: &StartRun,
        ranks: &Ranks,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<Trainer> {
        let mut startup = Startup::begin_run();
        let family = family_of(&request.config).config_family();
        let mut plan = validate_for(
            &request.config,
            &HostInfo::new(framesmith_nn::device::usable_count()),
            family,
        )
        .map_err(|errors| anyhow::anyhow!("{errors}"))?;
        if let Ranks::Join(spec) = ranks {
            if let Some(gpu) = spec.gpu {
                plan.device = PlanDevice::Cuda(gpu);
            }
            plan.memory.ranks_on_machine = spec.ranks_on_machine.max(1);
            // Validation saw `training.device`; `--gpus` may have named the low-noise expert's GPU instead.
            if let Some(low) = plan.model.low_noise.as_ref().and_then(|l| l.device) {
                if spec.world > 1 {
                    anyhow::bail!(
                        "training.low_noise_device = \"{low}\" puts the low-noise expert on a GPU of its own, which \
                         one process does: train with --gpus naming one GPU (the high-noise expert's) or none, or \
                         leave training.low_noise_device empty to train data parallel over --gpus"
                    );
                }
                if low == plan.device && low != PlanDevice::Cpu {
                    anyhow::bail!(
                        "--gpus names {low}, which training.low_noise_device gives the low-noise expert: name \
                         another GPU for the high-noise expert, or change training.low_noise_device"
                    );
                }
            }
        }
        let writes = ranks.rank() == 0;
        for note in &plan.notes {
            log(LogLevel::Info, note.clone());
        }
        startup.mark("checking the config");
        let folder = preflight::take_run_folder(request, &mut plan, writes, log)?;
        preflight::check_init_from(&plan)?;
        startup.mark("the run folder");
        crate::user_cache::keep_attention_plans();
        let mut trainer = Self::from_plan(&plan, log)?;
        startup.mark_setup("the rest of the setup");
        if let Some(lock) = folder.lock {
            trainer.outputs.hold(lock);
        }
        trainer.join_ranks(&plan, ranks, log)?;
        startup.mark("joining the ranks");
        if let Some(state) = &folder.resume {
            let dir = trainer.resume(state, log)?;
            log(
                LogLevel::Info,
                format!("resumed at step {} from {}", trainer.step(), dir.display()),
            );
            startup.mark("resuming");
        }
        trainer.startup = startup;
        if writes {
            trainer.outputs.begin(trainer.step(), &plan.config)?;
        }
        Ok(trainer)
    }

    /// Joins the other ranks (nothing for one process): the step count and schedule follow the world's
    /// micro-batches per step, and every rank starts from rank 0's LoRA weights.
    fn join_ranks(
        &mut self,
        plan: &RunPlan,
        ranks: &Ranks,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<()> {
        let collective = ranks.collective(self.device())?;
        let world = collective.world();
        self.collective = collective;
        if world == 1 {
            return Ok(());
        }
        if let framesmith_config::plan::TrainLength::Epochs(epochs) = plan.training.length {
            self.total_steps = crate::train::ranks::steps_for_epochs(
                epochs,
                self.data.batches_per_epoch(),
                self.accumulation,
                world,
            );
            self.schedule = plan.schedule.with_total_steps(self.total_steps);
        }
        let mut vars = self.loras.vars();
        if let Some((second, _)) = self.family.second_lora() {
            vars.extend(second.vars());
        }
        let values: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let synced = broadcast_tensors(&*self.collective, &values, 0)?;
        for (var, value) in vars.iter().zip(&synced) {
            var.set(&value.to_dtype(var.dtype())?)?;
        }
        log(
            LogLevel::Info,
            format!(
                "rank {} of {world}: {} micro-batch(es) per rank and step, {} per step over all GPUs",
                self.collective.rank(),
                self.accumulation,
                self.micro_per_step()
            ),
        );
        Ok(())
    }

    /// Builds the run from a plan validated for its model family (`validate_for`): the family's part, then the
    /// optimizer, schedules, outputs and memory settings, the same for every family.
    pub fn from_plan(
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<Trainer> {
        let parts = family_of(&plan.config).start_run(plan, log)?;
        Self::assemble(plan, parts)
    }

    /// The trainer of a run whose model-specific setup is done (`parts`): the optimizer, schedules, outputs and
    /// memory settings come from the plan, the same for every model family.
    fn assemble(plan: &RunPlan, parts: RunParts) -> anyhow::Result<Trainer> {
        let optimizer = AdamW::new(named_vars(&parts.loras), plan.optimizer)?;
        let accumulation = plan.training.gradient_accumulation_steps.max(1);
        let total_steps = plan.training.total_steps(parts.data.batches_per_epoch());
        let mut metadata = parts.metadata;
        add_kind_metadata(plan, &mut metadata);
        let mut outputs =
            Outputs::create(&plan.output.output_dir, &plan.output.output_name, metadata);
        outputs.every_n_steps = plan.output.save_every_n_steps;
        outputs.every_n_epochs = plan.output.save_every_n_epochs;
        outputs.save_state = plan.output.save_state;
        outputs.save_dtype = float_dtype(plan.output.save_dtype);
        outputs.config_toml = plan.config.to_toml_string()?;
        let report = parts.report.as_ref();
        Ok(Trainer {
            sampling: plan
                .sampling
                .is_some()
                .then(|| Sampling::new(plan))
                .transpose()?,
            saved_inputs: placements::saved_inputs_for(plan, parts.family.device(), report)?,
            family: parts.family,
            loras: parts.loras,
            optimizer,
            schedule: plan.schedule.with_total_steps(total_steps),
            timesteps: plan.training.timesteps,
            data: parts.data,
            seed: plan.training.seed,
            accumulation,
            total_steps,
            max_consecutive_nonfinite: plan.training.max_consecutive_nonfinite,
            step: 0,
            consecutive_nonfinite: 0,
            checkpointing: placements::checkpointing_for(&plan.memory, report),
            out_of_memory_advice: out_of_memory_advice(report),
            planned_vram_bytes: report.map(|r| r.peak_vram_bytes),
            planned_sampling_vram_bytes: report
                .and_then(|r| r.sampling.as_ref())
                .map(|s| s.peak_vram_bytes),
            vram_reservation: parts.vram_reservation,
            outputs,
            validation: parts.validation,
            collective: std::sync::Arc::new(framesmith_nn::collective::Solo),
            startup: Startup::begin(),
            vram_peak: Default::default(),
            noise: Default::default(),
            pool_trims: Default::default(),
            activation_buffers: parts.activation_buffers,
        })
    }
}

/// What a model family's setup hands to the trainer ([`crate::family::Family::start_run`]).
pub struct RunParts {
    /// The family's models, the LoRA attached.
    pub family: Box<dyn FamilyRun>,
    /// The LoRA the run trains (the only one, or the first of two).
    pub loras: LoraSet,
    /// The training items.
    pub data: TrainSet,
    /// The metadata every saved LoRA carries.
    pub metadata: HashMap<String, String>,
    /// The held-out items, when the run validates.
    pub validation: Option<Validation>,
    /// The memory plan, when there is one (its out-of-memory advice and predicted peak).
    pub report: Option<PlanReport>,
    /// Device memory held back beyond the run's budget.
    pub vram_reservation: Option<VramHold>,
    /// The step's page-locked activation buffers, set aside beside the model's build
    /// ([`crate::train::buffers`]); `None` leaves them to the first step.
    pub activation_buffers: Option<framesmith_nn::offload::ActivationBuffers>,
}

/// The run's LoRA settings (`[lora]`, f32 factors, the run's seed).
pub(crate) fn lora_spec(plan: &RunPlan) -> LoraSpec {
    LoraSpec {
        rank: plan.lora.rank,
        alpha: plan.lora.alpha,
        dtype: DType::F32,
        include_patterns: plan.lora.include_patterns.clone(),
        exclude_patterns: plan.lora.exclude_patterns.clone(),
        seed: plan.training.seed,
        kind: adapter_kind(&plan.config.lora),
    }
}

/// Loads `lora.init_from` into the fresh `loras` (an error says to point it at `expected`, or remove it) and logs
/// the LoRA's size.
pub(crate) fn start_loras(
    plan: &RunPlan,
    loras: &LoraSet,
    device: &Device,
    expected: &str,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<()> {
    if let Some(path) = &plan.lora.init_from {
        let file = preflight::load_init_lora(path, device, expected)?;
        loras.load_weights(&file).map_err(|e| {
            anyhow::anyhow!(
                "lora.init_from: {e}; point it at {expected}, or remove it to start from a fresh LoRA"
            )
        })?;
    }
    log(
        LogLevel::Info,
        format!(
            "LoRA: {} modules, {} parameters",
            loras.len(),
            loras.parameter_count()
        ),
    );
    Ok(())
}

/// The optimizer's names for an adapter's factors: their file names without `.weight` (`{path}.lora_down`,
/// `{path}.lora_up`, `{path}.lokr_w1`, `{path}.dora_scale`, …).
pub(crate) fn named_vars(loras: &LoraSet) -> Vec<(String, candle_core::Var)> {
    loras
        .iter()
        .flat_map(|(path, l)| {
            l.named_vars().into_iter().map(move |(name, var)| {
                let name = name.trim_end_matches(".weight");
                (format!("{path}.{name}"), var.clone())
            })
        })
        .collect()
}
