//! Building a `Trainer` from a `StartRun`: validate the config into a plan, pick the device, load (or make) the
//! DiT, attach the LoRAs, load the training data, set up the optimizer, schedules, outputs and samples, and
//! resume when asked.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::demo;
use crate::dit::{build_dit, load_dit, LoadedDit, Streaming};
use crate::plan as memory_plan;
use crate::train::clip_samples::{ClipSamples, Decoder};
use crate::train::data::TrainSet;
use crate::train::demo_setup::demo_sample_prompts;
use crate::train::experts::{check_pair, LowNoiseExpert};
use crate::train::mode::{self, StartFrame};
use crate::train::optimizer::AdamW;
use crate::train::outputs::Outputs;
use crate::train::ranks::Ranks;
use crate::train::run_model::RunModel;
use crate::train::sample_models::{encode_sample_prompts, vae_sampling, EncodedPrompt};
use crate::train::samples::Sampling;
use crate::train::trainer::Trainer;
use crate::train::validation::load_run_data;
use framesmith_config::outputs::{find_resume, new_run_dir, runs_in};
use framesmith_config::plan::{FloatDtype, LowNoisePlan, ModelSource, PlanDevice};
use framesmith_config::protocol::memory::{format_gib, PlanReport};
use framesmith_config::protocol::{LogLevel, StartRun};
use framesmith_config::run::{ActivationPlacement, BlocksToSwap, ExpertMode, StreamingMode};
use framesmith_config::{validate_for, HostInfo, RunPlan};
use framesmith_models::trainable::attach_model_loras;
use framesmith_models::wan::config::Expert;
use framesmith_models::wan::{ModelOptions, WanConfig, WanModel};
use framesmith_nn::collective::broadcast_tensors;
use framesmith_nn::lora::{LoraSet, LoraSpec};
use framesmith_nn::lora_file::LoraFile;
use framesmith_nn::offload::{
    release_cached_memory, streamed_blocks, OffloadOptions, OutOfMemory, SavedPlacement,
    StreamMode, StreamPlacement,
};
use framesmith_nn::vb::Vb;

pub use crate::train::demo_setup::{
    demo_items, demo_model_config, DEMO_CLIPS, DEMO_FRAMES, DEMO_LAYERS, DEMO_SIZE,
};

/// Seed of the demo base model's weights: fixed, so every demo LoRA belongs to the same base.
const DEMO_BASE_SEED: u64 = 2024;

/// CUDA devices this build can use (0 without the `cuda` feature).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        if framesmith_nn::driver::nvidia_driver_missing().is_some() {
            return 0;
        }
        (0..16).take_while(|&i| Device::new_cuda(i).is_ok()).count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

pub(super) fn device_for(plan: &RunPlan) -> anyhow::Result<Device> {
    let device = open_device(plan.device)?;
    if plan.model.fp8_matmul {
        check_fp8_products(&device)?;
    }
    Ok(device)
}

/// `model.fp8_matmul`: one small FP8 product on `device` before anything loads, so a card or cuBLAS without them
/// fails here with the fix rather than in the first step.
#[cfg(feature = "cuda")]
fn check_fp8_products(device: &Device) -> anyhow::Result<()> {
    framesmith_nn::cuda::fp8_gemm::probe(device).map_err(|e| {
        anyhow::anyhow!(
            "model.fp8_matmul: this GPU cannot run FP8 matrix products ({e}); they need FP8 tensor cores (Hopper, \
             compute capability 9.0 or newer) and cuBLAS 12.9 or newer: set fp8_matmul = false"
        )
    })
}

#[cfg(not(feature = "cuda"))]
fn check_fp8_products(_device: &Device) -> anyhow::Result<()> {
    anyhow::bail!("model.fp8_matmul needs a CUDA build of Framesmith on an NVIDIA GPU: set fp8_matmul = false")
}

/// Opens `device` (a CUDA one after checking the driver and the card's compute capability).
fn open_device(device: PlanDevice) -> anyhow::Result<Device> {
    match device {
        PlanDevice::Cpu => Ok(Device::Cpu),
        PlanDevice::Cuda(i) => {
            if let Some(why) = framesmith_nn::driver::nvidia_driver_missing() {
                anyhow::bail!("cannot open CUDA device {i}: {why}");
            }
            let device = Device::new_cuda(i).with_context(|| {
                format!("cannot open CUDA device {i}; set training.device = \"cpu\" or check the NVIDIA driver")
            })?;
            check_compute_capability(&device, i)?;
            Ok(device)
        }
    }
}

/// Refuses a card older than the kernels support, naming it, before any kernel is launched on it.
#[cfg(feature = "cuda")]
fn check_compute_capability(device: &Device, index: usize) -> anyhow::Result<()> {
    use framesmith_config::protocol::doctor::MIN_COMPUTE_CAPABILITY as MIN;
    if let Device::Cuda(cuda) = device {
        let (major, minor) = framesmith_nn::cuda::device::compute_capability(cuda)?;
        if (major, minor) < (MIN.major, MIN.minor) {
            anyhow::bail!(
                "CUDA device {index} has compute capability {major}.{minor}; Framesmith's GPU kernels need {MIN} or \
                 newer (RTX 30 series, A100 or newer): train on such a card, or set training.device = \"cpu\""
            );
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn check_compute_capability(_device: &Device, _index: usize) -> anyhow::Result<()> {
    Ok(())
}

/// How the run log names a device: `cpu`, `cuda:0`.
pub(super) fn device_label(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

pub(super) fn float_dtype(d: FloatDtype) -> DType {
    match d {
        FloatDtype::F32 => DType::F32,
        FloatDtype::Bf16 => DType::BF16,
        FloatDtype::F16 => DType::F16,
    }
}

fn load_model(
    plan: &RunPlan,
    path: Option<&Path>,
    device: &Device,
    memory: Option<&MemoryReport>,
) -> anyhow::Result<LoadedDit> {
    let compute = float_dtype(plan.model.compute_dtype);
    let options = ModelOptions {
        residual_dtype: match plan.model.residual_dtype {
            framesmith_config::run::ResidualDtype::F32 => DType::F32,
            framesmith_config::run::ResidualDtype::Bf16 => DType::BF16,
        },
        blocks_fp8: plan.model.fp8_scale.map(memory_plan::fp8_scale),
        fp8_products: plan.model.fp8_matmul,
    };
    match &plan.model.source {
        ModelSource::Demo => {
            // The demo model streams too when asked (on CUDA), so the whole streaming path can be tried
            // without model files.
            let cfg = demo_model_config();
            let tensors = demo::base::demo_base_weights(&cfg, DEMO_BASE_SEED, device)?;
            let vb = Vb::from_tensors(tensors, compute, device);
            let streaming = streaming_for(plan, &cfg, device, memory)?;
            let model = build_dit(&cfg, vb, &options, streaming)?;
            Ok(LoadedDit {
                model,
                name: "framesmith-demo-tiny".into(),
                expert: None,
            })
        }
        ModelSource::File(dit) => {
            let path = path.unwrap_or(dit.as_path());
            let expected = match &plan.model.variant {
                Some(name) => Some(WanConfig::by_name(name).with_context(|| {
                    format!("unknown model.variant `{name}` (t2v-1.3b, t2v-14b, i2v-14b, t2v-a14b, i2v-a14b, ti2v-5b)")
                })?),
                None => None,
            };
            load_dit(
                path,
                expected.as_ref(),
                (compute, device),
                &options,
                |cfg, _| streaming_for(plan, cfg, device, memory),
            )
        }
    }
}

/// The streamed blocks and ring settings of a CUDA run (`[memory]`), the count from the memory planner when it
/// is `"auto"`; `None` when nothing streams.
fn streaming_for(
    plan: &RunPlan,
    cfg: &WanConfig,
    device: &Device,
    memory: Option<&MemoryReport>,
) -> anyhow::Result<Streaming> {
    let model = format!("this Wan model has {} blocks", cfg.num_layers);
    Ok(
        streamed_count(plan, device, memory, cfg.num_layers, &model)?.map(|(count, offload)| {
            (
                streamed_blocks(cfg.num_layers, count, StreamPlacement::Spread),
                offload,
            )
        }),
    )
}

/// How many of a model's `blocks` a run streams (`memory.blocks_to_swap`, the memory plan's count for `"auto"`)
/// and the ring settings, for any model; `None` when nothing streams (streaming off, a CPU run, or a count of 0).
/// A count that leaves no block resident is refused, the error saying what `model` has ("FLUX.1 has 57 blocks").
pub(super) fn streamed_count(
    plan: &RunPlan,
    device: &Device,
    memory: Option<&MemoryReport>,
    blocks: usize,
    model: &str,
) -> anyhow::Result<Option<(usize, OffloadOptions)>> {
    let mode = match plan.memory.streaming {
        StreamingMode::Off => return Ok(None),
        StreamingMode::Pinned => StreamMode::Pinned,
        StreamingMode::Staged => StreamMode::Staged,
    };
    if !plan.memory.applies || !device.is_cuda() {
        return Ok(None);
    }
    let count = match plan.memory.blocks_to_swap {
        BlocksToSwap::Count(n) if n >= blocks => anyhow::bail!(
            "memory.blocks_to_swap = {n}, but {model}: stream at most {}, or \"auto\"",
            blocks.saturating_sub(1)
        ),
        BlocksToSwap::Count(n) => n,
        BlocksToSwap::Auto(_) => match memory {
            Some(Ok(report)) => report.streamed_blocks,
            Some(Err(e)) => anyhow::bail!("planning memory for blocks_to_swap = \"auto\": {e}"),
            None => anyhow::bail!("blocks_to_swap = \"auto\" needs the run's memory plan"),
        },
    };
    if count == 0 {
        return Ok(None);
    }
    let offload = OffloadOptions {
        mode,
        slots: framesmith_config::training::DEFAULT_GPU_SLOTS,
        staging_slots: plan.memory.staging_slots.max(1),
        ..OffloadOptions::default()
    };
    Ok(Some((count, offload)))
}

/// Where the step keeps saved block inputs: host RAM with `memory.activations = "host"` on CUDA, pageable when
/// `memory.streaming = "staged"` promises little page-locked memory.
pub(super) fn saved_inputs_for(plan: &RunPlan, device: &Device) -> SavedPlacement {
    if !(plan.memory.applies
        && device.is_cuda()
        && plan.memory.activations == ActivationPlacement::Host)
    {
        return SavedPlacement::Device;
    }
    match plan.memory.streaming {
        StreamingMode::Staged => SavedPlacement::host_for(StreamMode::Staged),
        StreamingMode::Pinned | StreamingMode::Off => SavedPlacement::host_for(StreamMode::Pinned),
    }
}

/// The memory plan of a run, or why it could not be made.
type MemoryReport = Result<PlanReport, String>;

/// The memory plan of a CUDA run (`None` elsewhere), made once before anything takes device memory: it picks
/// `blocks_to_swap = "auto"` and words the out-of-memory advice.
fn memory_report(plan: &RunPlan, device: &Device) -> Option<MemoryReport> {
    if !(device.is_cuda() && plan.memory.applies) {
        return None;
    }
    let (clip, _) = memory_plan::clip_for_config(&plan.config);
    Some(
        memory_plan::model_for_config(&plan.config)
            .and_then(|cfg| memory_plan::plan_run(plan, cfg, clip))
            .map_err(|e| e.to_string()),
    )
}

/// Logs the memory plan: its verdict, what would fit when it predicts no fit, and a warning when the RAM of the
/// ranks on this machine nears the machine's.
pub(super) fn log_plan(report: &PlanReport, log: &mut dyn FnMut(LogLevel, String)) {
    log(
        LogLevel::Info,
        format!("memory plan: {}", report.verdict_line()),
    );
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

/// Device memory held back beyond `memory.vram_budget_gb` until dropped, and how much.
pub struct VramHold {
    /// Bytes held back.
    pub bytes: u64,
    _held: Box<dyn std::any::Any + Send>,
}

/// Holds back device memory beyond the run's VRAM budget (`memory.vram_budget_gb`) for as long as the returned
/// value lives, so the run fails where a card of that size would.
pub(super) fn reserve_budget(plan: &RunPlan, device: &Device) -> anyhow::Result<Option<VramHold>> {
    match plan.memory.vram_budget_bytes {
        Some(budget) if plan.memory.applies => hold_vram_budget(device, budget)
            .context("reserving device memory beyond memory.vram_budget_gb"),
        _ => Ok(None),
    }
}

/// Holds back the memory of a CUDA `device` beyond `budget` bytes for as long as the returned value lives (`None`
/// off CUDA, or when the card has no more free than that).
#[cfg(feature = "cuda")]
pub fn hold_vram_budget(device: &Device, budget: u64) -> anyhow::Result<Option<VramHold>> {
    let Device::Cuda(cuda) = device else {
        return Ok(None);
    };
    let held = framesmith_nn::cuda::device::VramReservation::leave_budget(cuda, budget)?;
    Ok(held.map(|h| VramHold {
        bytes: h.bytes() as u64,
        _held: Box::new(h),
    }))
}

/// Holds nothing: no CUDA in this build.
#[cfg(not(feature = "cuda"))]
pub fn hold_vram_budget(_device: &Device, _budget: u64) -> anyhow::Result<Option<VramHold>> {
    Ok(None)
}

/// What a command has taken from a CUDA card, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct VramUse {
    /// The most taken at once: the memory pool's reserved high-water mark plus what lives outside the pool (the
    /// CUDA context, library workspaces, kernels), the budget's own hold left out.
    pub peak: u64,
    /// Of that, outside the pool.
    pub outside_pool: u64,
    /// Allocated from the pool now.
    pub in_use: u64,
    /// Reserved by the pool now (in use or cached).
    pub reserved: u64,
    /// Free on the card now.
    pub free: u64,
}

impl VramUse {
    /// Measures `device` now; `held_back` is what a [`VramHold`] keeps. `None` off CUDA.
    pub fn measure(device: &Device, held_back: u64) -> Option<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            use framesmith_nn::cuda::device;
            let peak = device::peak_reserved_bytes(dev).ok()?;
            let in_use = device::used_memory_bytes(dev).ok()?;
            let reserved = device::reserved_bytes(dev).ok()?;
            let (free, total) = device::memory_info(dev).ok()?;
            let outside_pool = total
                .saturating_sub(free)
                .saturating_sub(held_back)
                .saturating_sub(reserved);
            return Some(Self {
                peak: peak + outside_pool,
                outside_pool,
                in_use,
                reserved,
                free,
            });
        }
        let _ = (device, held_back);
        None
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
    let more = (report.streamed_blocks + (report.num_blocks / 10).max(2)).min(report.num_blocks);
    if more > report.streamed_blocks {
        format!(
            "The planner predicted {peak} of the {budget} budget with {} of {} blocks streamed, so something else \
             took memory or the prediction was low: stream more blocks (memory.blocks_to_swap = {more}), or lower \
             memory.vram_budget_gb to leave room. Checkpoints already saved are kept.",
            report.streamed_blocks, report.num_blocks
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

/// Where the official code of a Wan generation lives (`modelspec.implementation`).
fn official_code(generation: framesmith_models::wan::config::Generation) -> &'static str {
    match generation {
        framesmith_models::wan::config::Generation::Wan21 => "https://github.com/Wan-Video/Wan2.1",
        framesmith_models::wan::config::Generation::Wan22 => "https://github.com/Wan-Video/Wan2.2",
    }
}

/// The LoRA file's metadata: musubi-tuner's `ss_*` keys, modelspec (`implementation`: the model's official code),
/// and the numerics and mode of the run.
pub(super) fn lora_metadata(
    plan: &RunPlan,
    base_name: &str,
    implementation: &str,
    start_frame: StartFrame,
) -> HashMap<String, String> {
    let m = &plan.model;
    let mut meta = HashMap::new();
    let mut put = |k: &str, v: String| {
        meta.insert(k.to_string(), v);
    };
    put("ss_network_module", "networks.lora_wan".into());
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
        "framesmith.residual_dtype",
        format!("{:?}", m.residual_dtype).to_lowercase(),
    );
    put(
        "framesmith.base_dtype",
        format!("{:?}", m.base_dtype).to_lowercase(),
    );
    put("framesmith.fp8_matmul", m.fp8_matmul.to_string());
    put(
        "framesmith.fp8_scale",
        m.fp8_scale
            .map_or("none".into(), |s| format!("{s:?}").to_lowercase()),
    );
    put("framesmith.model_timestep", "t*1000+1".into());
    // Per token only where the timesteps differ between tokens (the start frame's are 0).
    let (mode, time) = match start_frame {
        StartFrame::None => ("text_to_video", "per_sample"),
        StartFrame::Channels => ("image_to_video", "per_sample"),
        StartFrame::FirstLatentFrame => ("image_to_video", "per_token"),
    };
    put("framesmith.training_mode", mode.into());
    put("framesmith.time_embedding", time.into());
    meta
}

/// Samples: real models use the prompts `encoded` before the DiT was loaded and the Wan VAE; the demo model its
/// own text embedding and codec.
fn sampling(
    plan: &RunPlan,
    cfg: &WanConfig,
    encoded: Option<Vec<EncodedPrompt>>,
    device: &Device,
) -> anyhow::Result<Option<Sampling>> {
    let Some(s) = &plan.sampling else {
        return Ok(None);
    };
    if let Some(encoded) = encoded {
        let dtype = float_dtype(plan.model.compute_dtype);
        let (prompts, decoder) = vae_sampling(plan, cfg, encoded, dtype, device)?;
        return Ok(Some(Sampling::new(
            plan,
            Box::new(ClipSamples { prompts, decoder }),
        )));
    }
    let specs = crate::generate::prompts::read_prompt_file(&s.prompts)?;
    let prompts = demo_sample_prompts(specs, cfg, device)?;
    let decoder = Decoder::Demo;
    Ok(Some(Sampling::new(
        plan,
        Box::new(ClipSamples { prompts, decoder }),
    )))
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
        let family = crate::train::flux::model_family(&request.config);
        let mut plan = validate_for(&request.config, &HostInfo::new(cuda_device_count()), family)
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
        let configured = plan.output.output_dir.clone();
        let resume = match &request.resume_from {
            Some(path) => {
                let target = find_resume(path, &request.config)?;
                plan.output.output_dir = target.run_dir.clone();
                Some(target.state.dir)
            }
            None if !writes => None,
            None => {
                plan.output.output_dir = new_run_dir(&configured);
                if plan.output.output_dir != configured {
                    log(
                        LogLevel::Info,
                        another_run_note(&configured, &plan.output.output_dir),
                    );
                }
                None
            }
        };
        let mut trainer = Self::from_plan(&plan, log)?;
        trainer.join_ranks(&plan, ranks, log)?;
        if let Some(state) = &resume {
            let dir = trainer.resume(state)?;
            log(
                LogLevel::Info,
                format!("resumed at step {} from {}", trainer.step(), dir.display()),
            );
        }
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
        if let Some((low, _)) = self.low_noise.as_ref().and_then(|l| l.own.as_ref()) {
            vars.extend(low.vars());
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

    /// Builds the run from a plan validated for its model family (`validate_for`).
    pub fn from_plan(
        plan: &RunPlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<Trainer> {
        if let Some(dit) = crate::train::flux::flux_dit_of(plan) {
            return Self::from_flux_plan(plan, &dit, log);
        }
        let device = device_for(plan)?;
        // Planned before the reservation takes the card's free memory.
        let memory = memory_report(plan, &device);
        if let Some(Ok(report)) = &memory {
            log_plan(report, log);
        }
        let out_of_memory_advice =
            out_of_memory_advice(memory.as_ref().and_then(|m| m.as_ref().ok()));
        let demo = plan.model.source == ModelSource::Demo;
        // A mode the model cannot train in fails before anything loads (the header tells the model).
        if let Ok(memory_plan::PlanModel::Wan(cfg)) = memory_plan::model_for_config(&plan.config) {
            mode::resolve(&cfg, plan.training.mode, demo)?;
        }
        let vram_reservation = reserve_budget(plan, &device)?;
        // Before the DiT: the text encoder's memory is free again by the time the DiT takes its own.
        let encoded =
            encode_sample_prompts(plan, float_dtype(plan.model.compute_dtype), &device, log)?;
        let oom_on_load = |e: anyhow::Error| {
            if e.chain().any(|c| c.is::<OutOfMemory>()) {
                anyhow::anyhow!(
                    "the GPU ran out of memory while loading the model's resident blocks ({e:#}); the file is fine. \
                     {out_of_memory_advice}"
                )
            } else {
                e
            }
        };
        let loaded = load_model(plan, None, &device, memory.as_ref()).map_err(oom_on_load)?;
        let (mut model, base_name) = (loaded.model, loaded.name);
        log(
            LogLevel::Info,
            format!("model: {base_name} on {}", device_label(&device)),
        );
        #[cfg(feature = "cuda")]
        if let Device::Cuda(cuda) = &device {
            if let Ok(line) = framesmith_nn::cuda::device::kernel_code_line(cuda) {
                log(LogLevel::Info, line);
            }
        }
        log_streaming(&model, log);
        let cfg = model.config().clone();
        let start_frame = mode::resolve(&cfg, plan.training.mode, demo)?;
        log(LogLevel::Info, start_frame.log_line().into());
        let run_data = load_run_data(plan, &cfg, &device, log)?;
        let data = TrainSet::new(run_data.items, run_data.batch_size, 1, plan.training.seed)?;
        let spec = lora_spec(plan);
        let loras = attach_model_loras(&mut model, &spec)?;
        start_loras(
            plan,
            &loras,
            &device,
            "a LoRA .safetensors for this model (one Framesmith or musubi-tuner saved)",
            log,
        )?;
        let low_noise = match &plan.model.low_noise {
            Some(low) => {
                let expert = LowExpertLoad {
                    plan,
                    device: &device,
                    memory: memory.as_ref(),
                    high_expert: loaded.expert,
                    spec: &spec,
                    loras: &loras,
                };
                Some(expert.load(&mut model, low, log).map_err(oom_on_load)?)
            }
            None => None,
        };
        Self::assemble(
            plan,
            RunParts {
                model: RunModel::Wan(model),
                low_noise,
                loras,
                data,
                metadata: lora_metadata(
                    plan,
                    &base_name,
                    official_code(cfg.generation),
                    start_frame,
                ),
                sampling: sampling(plan, &cfg, encoded, &device)?,
                validation: run_data.validation,
                start_frame,
                report: memory.as_ref().and_then(|m| m.as_ref().ok()),
                vram_reservation,
                device: &device,
            },
        )
    }

    /// The trainer of a run whose model-specific setup is done (`parts`): the optimizer, schedules, outputs and
    /// memory settings come from the plan, the same for every model family.
    pub(super) fn assemble(plan: &RunPlan, parts: RunParts<'_>) -> anyhow::Result<Trainer> {
        let optimizer = AdamW::new(named_vars(&parts.loras), plan.optimizer)?;
        let accumulation = plan.training.gradient_accumulation_steps.max(1);
        let total_steps = plan.training.total_steps(parts.data.batches_per_epoch());
        let mut outputs = Outputs::create(
            &plan.output.output_dir,
            &plan.output.output_name,
            parts.metadata,
        );
        outputs.every_n_steps = plan.output.save_every_n_steps;
        outputs.every_n_epochs = plan.output.save_every_n_epochs;
        outputs.save_state = plan.output.save_state;
        outputs.save_dtype = float_dtype(plan.output.save_dtype);
        outputs.config_toml = plan.config.to_toml_string()?;
        Ok(Trainer {
            sampling: parts.sampling,
            model: parts.model,
            low_noise: parts.low_noise,
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
            saved_inputs: saved_inputs_for(plan, parts.device),
            checkpointing: plan.memory.checkpointing,
            start_frame: parts.start_frame,
            out_of_memory_advice: out_of_memory_advice(parts.report),
            planned_vram_bytes: parts.report.map(|r| r.peak_vram_bytes),
            vram_reservation: parts.vram_reservation,
            outputs,
            validation: parts.validation,
            collective: std::sync::Arc::new(framesmith_nn::collective::Solo),
        })
    }
}

/// What a model family's setup hands to [`Trainer::assemble`].
pub(super) struct RunParts<'a> {
    pub(super) model: RunModel,
    pub(super) low_noise: Option<LowNoiseExpert>,
    pub(super) loras: LoraSet,
    pub(super) data: TrainSet,
    /// The metadata every saved LoRA carries.
    pub(super) metadata: HashMap<String, String>,
    pub(super) sampling: Option<Sampling>,
    pub(super) validation: Option<crate::train::validation::Validation>,
    pub(super) start_frame: StartFrame,
    /// The memory plan, when there is one (its out-of-memory advice and predicted peak).
    pub(super) report: Option<&'a PlanReport>,
    pub(super) vram_reservation: Option<VramHold>,
    pub(super) device: &'a Device,
}

/// The run's LoRA settings (`[lora]`, f32 factors, the run's seed).
pub(super) fn lora_spec(plan: &RunPlan) -> LoraSpec {
    LoraSpec {
        rank: plan.lora.rank,
        alpha: plan.lora.alpha,
        dtype: DType::F32,
        include_patterns: plan.lora.include_patterns.clone(),
        exclude_patterns: plan.lora.exclude_patterns.clone(),
        seed: plan.training.seed,
    }
}

/// Loads `lora.init_from` into the fresh `loras` (an error says to point it at `expected`, or remove it) and logs
/// the LoRA's size.
pub(super) fn start_loras(
    plan: &RunPlan,
    loras: &LoraSet,
    device: &Device,
    expected: &str,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<()> {
    if let Some(path) = &plan.lora.init_from {
        LoraFile::load(path, device)
            .and_then(|file| loras.load_weights(&file))
            .map_err(|e| {
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

/// The optimizer's names for a LoRA's factors (`{path}.lora_down`, `{path}.lora_up`).
pub(super) fn named_vars(loras: &LoraSet) -> Vec<(String, candle_core::Var)> {
    loras
        .iter()
        .flat_map(|(path, l)| {
            [
                (format!("{path}.lora_down"), l.down.clone()),
                (format!("{path}.lora_up"), l.up.clone()),
            ]
        })
        .collect()
}

/// Says how many blocks of `model` stream, when some do.
fn log_streaming(model: &WanModel, log: &mut dyn FnMut(LogLevel, String)) {
    if let Some(streamer) = model.streamer() {
        log(
            LogLevel::Info,
            format!(
                "streaming {} of {} blocks from host RAM ({} mode, {:.1} MiB each)",
                streamer.count(),
                model.num_blocks(),
                streamer.mode().as_str(),
                streamer.block_bytes() as f64 / (1u64 << 20) as f64
            ),
        );
    }
}

/// What loading the low-noise expert of a run that trains both needs from the run being built.
struct LowExpertLoad<'a> {
    plan: &'a RunPlan,
    device: &'a Device,
    memory: Option<&'a MemoryReport>,
    /// The expert `model.dit`'s path or file names.
    high_expert: Option<Expert>,
    spec: &'a LoraSpec,
    /// The high-noise expert's LoRA (shared in `joint` mode).
    loras: &'a LoraSet,
}

impl LowExpertLoad<'_> {
    /// Parks the high-noise expert `high` (its LoRA already attached), loads the low-noise one onto the GPU and
    /// gives it the shared LoRA (`joint`) or one of its own (`split`). With a device of its own
    /// (`training.low_noise_device`) nothing is parked: it loads there, and `joint` gives it a mirror of the LoRA.
    fn load(
        &self,
        high: &mut WanModel,
        low: &LowNoisePlan,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<LowNoiseExpert> {
        let own_device = match low.device {
            Some(spec) => Some((
                spec,
                open_device(spec).context("opening training.low_noise_device")?,
            )),
            None => {
                high.park()
                    .context("parking the high-noise expert in host RAM")?;
                release_cached_memory(self.device)?;
                None
            }
        };
        let device = own_device.as_ref().map_or(self.device, |(_, d)| d);
        let loaded = load_model(self.plan, Some(&low.dit), device, self.memory)?;
        let ModelSource::File(dit) = &self.plan.model.source else {
            anyhow::bail!("model.dit_low_noise needs model.dit to be the high-noise expert's file");
        };
        check_pair(
            high.config(),
            loaded.model.config(),
            [self.high_expert, loaded.expert],
            [dit, &low.dit],
        )?;
        let mut model = loaded.model;
        let boundary = high.config().boundary_timestep(low.boundary);
        let placement = match &own_device {
            Some((spec, _)) => format!(", on {spec} of its own"),
            None => String::new(),
        };
        log(
            LogLevel::Info,
            format!(
                "low-noise expert: {} ({} mode, below timestep {boundary}{placement})",
                loaded.name,
                low.mode.as_str(),
            ),
        );
        log_streaming(&model, log);
        let separate = own_device.is_some();
        let (own, mirror) = match low.mode {
            ExpertMode::Joint if separate => {
                let mirror = self.loras.copy_to(device)?;
                mirror.share_with(model.linears_mut())?;
                (None, Some(mirror))
            }
            ExpertMode::Joint => {
                self.loras.share_with(model.linears_mut())?;
                (None, None)
            }
            ExpertMode::Split => {
                let loras = attach_model_loras(&mut model, self.spec)?;
                let optimizer = AdamW::new(named_vars(&loras), self.plan.optimizer)?;
                (Some((loras, optimizer)), None)
            }
        };
        Ok(LowNoiseExpert {
            model,
            own,
            mirror,
            separate,
            boundary,
            switches: 0,
            switch_secs: 0.0,
        })
    }
}

/// Says where a new run writes when its configured folder holds another run, and how to continue that one.
fn another_run_note(configured: &Path, run_dir: &Path) -> String {
    let held: Vec<String> = runs_in(configured).iter().map(|r| r.describe()).collect();
    format!(
        "{} already holds {}; this run writes to {} so that nothing of it is replaced (to continue the earlier run \
         instead, start with --resume {})",
        configured.display(),
        held.join("; "),
        run_dir.display(),
        configured.display()
    )
}
