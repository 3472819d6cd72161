//! Starting a Wan run (or the demo model's) from a validated plan: the memory plan, the DiT loaded (streamed and
//! in FP8 as the plan says), the training mode, the cached items (and held-out ones), the LoRA, the sample
//! prompts encoded before the DiT takes its memory, and Wan2.2 A14B's low-noise expert when the run trains both.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use super::demo_setup::{demo_model_config, demo_sample_prompts};
use crate::demo;
use crate::dit::{build_dit, load_dit, LoadedDit, Streaming};
use crate::family::wan::data::load_run_data;
use crate::family::wan::experts::{check_pair, Experts, LowNoiseExpert};
use crate::family::wan::mode::{self, StartFrame};
use crate::family::wan::run::WanRun;
use crate::family::wan::sample_models::{encode_sample_prompts, vae_sampling, EncodedPrompt};
use crate::family::wan::samples::{ClipSamples, Decoder};
use crate::plan as memory_plan;
use crate::train::buffers::start_activation_buffers;
use crate::train::data::TrainSet;
use crate::train::optimizer::AdamW;
use crate::train::placements::checkpointing_for;
use crate::train::setup::{
    blocks_to_swap, device_for, device_label, float_dtype, log_plan, lora_metadata, lora_spec,
    named_vars, out_of_memory_advice, reserve_budget, start_loras, training_device, MemoryReport,
    RunParts,
};
use crate::train::startup::setup_part_done;
use framesmith_config::plan::{LowNoisePlan, ModelSource};
use framesmith_config::protocol::LogLevel;
use framesmith_config::run::ExpertMode;
use framesmith_config::RunPlan;
use framesmith_models::trainable::attach_model_loras;
use framesmith_models::wan::config::Expert;
use framesmith_models::wan::{ModelOptions, WanConfig, WanModel};
use framesmith_nn::load_timing::load_timing;
use framesmith_nn::lora::{LoraSet, LoraSpec};
use framesmith_nn::offload::{
    release_cached_memory, streamed_blocks, OutOfMemory, StreamPlacement,
};
use framesmith_nn::vb::Vb;

/// Seed of the demo base model's weights: fixed, so every demo LoRA belongs to the same base.
pub(super) const DEMO_BASE_SEED: u64 = 2024;

/// Builds a Wan run's part from a plan validated for Wan: the memory plan (before the reservation takes the
/// card's free memory), the sample prompts (before the DiT: the text encoder's memory is free again by the time
/// the DiT takes its own), the model and the rest ([`load_run`]).
pub(super) fn start_run(
    plan: &RunPlan,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    let device = device_for(plan)?;
    setup_part_done("opening the device");
    let (memory, activation_blocks) = memory_report(plan, &device).unzip();
    if let Some(Ok(report)) = &memory {
        log_plan(report, log);
    }
    setup_part_done("the memory plan");
    let demo = plan.model.source == ModelSource::Demo;
    // A mode the model cannot train in fails before anything loads (the header tells the model).
    let model = memory_plan::model_for_config(&plan.config);
    if let Some(cfg) = model
        .as_ref()
        .ok()
        .and_then(|m| m.downcast_ref::<WanConfig>())
    {
        mode::resolve(cfg, plan.training.mode, demo)?;
    }
    let vram_reservation = reserve_budget(plan, &device)?;
    setup_part_done("holding the VRAM beyond the budget");
    // Locked on a thread of their own while the prompts are read and the model is built (dropped, and so stopped,
    // when the setup fails or is stopped).
    let report = memory.as_ref().and_then(|m| m.as_ref().ok());
    let activation_buffers = activation_blocks
        .and_then(|blocks| start_activation_buffers((plan, report), &device, blocks, log));
    setup_part_done("starting the activation buffers");
    let encoded = encode_sample_prompts(plan, float_dtype(plan.model.compute_dtype), &device, log)?;
    setup_part_done("the sample prompts");
    let mut parts = load_run(plan, &device, memory.as_ref(), encoded, log)?;
    parts.report = memory.and_then(Result::ok);
    parts.vram_reservation = vram_reservation;
    parts.activation_buffers = activation_buffers;
    Ok(parts)
}

/// The DiT loaded on `device`, the training mode, the items, the LoRA, the low-noise expert and the samples.
fn load_run(
    plan: &RunPlan,
    device: &Device,
    memory: Option<&MemoryReport>,
    encoded: Option<Vec<EncodedPrompt>>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunParts> {
    let out_of_memory_advice = out_of_memory_advice(memory.and_then(|m| m.as_ref().ok()));
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
    let building = std::time::Instant::now();
    let timing = load_timing();
    let loaded = load_model(plan, None, device, memory).map_err(oom_on_load)?;
    let (mut model, base_name) = (loaded.model, loaded.name);
    let built_secs = building.elapsed().as_secs_f64();
    log(
        LogLevel::Info,
        format!(
            "model: {base_name} on {} (built in {built_secs:.1} s)",
            device_label(device)
        ),
    );
    log(
        LogLevel::Info,
        load_timing().since(&timing).describe(built_secs),
    );
    if let Some(line) = framesmith_nn::device::kernel_code_line(device) {
        log(LogLevel::Info, line);
    }
    log_streaming(&model, log);
    setup_part_done("the model");
    let cfg = model.config().clone();
    let demo = plan.model.source == ModelSource::Demo;
    let start_frame = mode::resolve(&cfg, plan.training.mode, demo)?;
    log(LogLevel::Info, start_frame.log_line().into());
    let run_data = load_run_data(plan, &cfg, device, log)?;
    let data = TrainSet::new(run_data.items, run_data.batch_size, 1, plan.training.seed)?;
    setup_part_done("the training items");
    let spec = lora_spec(plan);
    let loras = attach_model_loras(&mut model, &spec)?;
    start_loras(
        plan,
        &loras,
        device,
        "a LoRA .safetensors for this model (one Framesmith or musubi-tuner saved)",
        log,
    )?;
    setup_part_done("the LoRA");
    let low_noise = match &plan.model.low_noise {
        Some(low) => {
            let expert = LowExpertLoad {
                plan,
                device,
                memory,
                high_expert: loaded.expert,
                spec: &spec,
                loras: &loras,
            };
            Some(expert.load(&mut model, low, log).map_err(oom_on_load)?)
        }
        None => None,
    };
    let metadata = wan_lora_metadata(plan, &base_name, official_code(cfg.generation), start_frame);
    let samples = sampling(plan, &cfg, encoded, device)?;
    setup_part_done("the low-noise expert and the models for samples");
    Ok(RunParts {
        family: Box::new(WanRun {
            experts: Experts { model, low_noise },
            start_frame,
            samples,
        }),
        loras,
        data,
        metadata,
        validation: run_data.validation,
        report: None,
        vram_reservation: None,
        activation_buffers: None,
    })
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
        blocks_to_swap(plan, device, memory, cfg.num_layers, &model)?.map(
            |(blocks_to_swap, offload)| {
                (
                    streamed_blocks(cfg.num_layers, blocks_to_swap, StreamPlacement::Spread),
                    offload,
                )
            },
        ),
    )
}

/// The memory plan of a CUDA run (`None` elsewhere), made once before anything takes device memory: it picks
/// `blocks_to_swap = "auto"` and words the out-of-memory advice. Beside it, what each block keeps in RAM when the
/// saved activations wait there (the buffers set aside before the first step).
fn memory_report(
    plan: &RunPlan,
    device: &Device,
) -> Option<(MemoryReport, Result<Vec<u64>, String>)> {
    if !(device.is_cuda() && plan.memory.applies) {
        return None;
    }
    let (clip, _) = memory_plan::clip_for_config(&plan.config);
    let model = memory_plan::model_for_config(&plan.config).map_err(|e| e.to_string());
    let report = model
        .clone()
        .and_then(|cfg| memory_plan::plan_run(plan, cfg, clip).map_err(|e| e.to_string()));
    // What the step keeps follows the plan's choice of checkpointing where it has one, as the trainer's does.
    let checkpointing = checkpointing_for(&plan.memory, report.as_ref().ok());
    let blocks = model.and_then(|cfg| {
        memory_plan::host_activation_blocks(plan, cfg, clip, checkpointing)
            .map_err(|e| e.to_string())
    });
    Some((report, blocks))
}

/// Where the official code of a Wan generation lives (`modelspec.implementation`).
fn official_code(generation: framesmith_models::wan::config::Generation) -> &'static str {
    match generation {
        framesmith_models::wan::config::Generation::Wan21 => "https://github.com/Wan-Video/Wan2.1",
        framesmith_models::wan::config::Generation::Wan22 => "https://github.com/Wan-Video/Wan2.2",
    }
}

/// The LoRA file's metadata: every family's keys with Wan's network module, numerics and mode.
fn wan_lora_metadata(
    plan: &RunPlan,
    base_name: &str,
    implementation: &str,
    start_frame: StartFrame,
) -> HashMap<String, String> {
    let mut meta = lora_metadata(plan, base_name, implementation);
    let mut put = |k: &str, v: String| {
        meta.insert(k.to_string(), v);
    };
    put("ss_network_module", "networks.lora_wan".into());
    put(
        "framesmith.residual_dtype",
        format!("{:?}", plan.model.residual_dtype).to_lowercase(),
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
) -> anyhow::Result<Option<ClipSamples>> {
    let Some(s) = &plan.sampling else {
        return Ok(None);
    };
    if let Some(encoded) = encoded {
        let dtype = float_dtype(plan.model.compute_dtype);
        let (prompts, decoder) = vae_sampling(plan, cfg, encoded, dtype, device)?;
        return Ok(Some(ClipSamples { prompts, decoder }));
    }
    let specs = crate::generate::prompts::read_prompt_file(&s.prompts)?;
    let prompts = demo_sample_prompts(specs, cfg, device)?;
    let decoder = Decoder::Demo;
    Ok(Some(ClipSamples { prompts, decoder }))
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
                training_device(self.plan, spec).context("opening training.low_noise_device")?,
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
