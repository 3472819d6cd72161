//! Tests of `config::validate`.

use std::path::Path;

use super::*;
use crate::plan::{LowNoisePlan, ModelSource, TrainLength};
use crate::run::{
    ActivationPlacement, AutoKeyword, BaseDtype, BlocksToSwap, Checkpointing, ExpertMode,
    Fp8ScaleMode, LrScheduler, StreamingMode, TimestepSampling,
};

/// Defaults with real (empty) files for the DiT and the dataset config.
fn runnable(dir: &Path) -> RunConfig {
    let dit = dir.join("wan.safetensors");
    let dataset = dir.join("dataset.toml");
    std::fs::write(&dit, b"").unwrap();
    std::fs::write(&dataset, b"").unwrap();
    let mut cfg = RunConfig::default();
    cfg.model.dit = dit;
    cfg.dataset.config = dataset;
    cfg
}

fn problems(cfg: &RunConfig, host: &HostInfo) -> ValidationErrors {
    match validate(cfg, host) {
        Ok(plan) => panic!("expected problems, got a plan with notes {:?}", plan.notes),
        Err(e) => e,
    }
}

#[test]
fn defaults_with_files_resolve() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = runnable(dir.path());
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(plan.device, PlanDevice::Cuda(0));
    assert_eq!(plan.model.source, ModelSource::File(cfg.model.dit.clone()));
    assert_eq!(plan.model.variant, None);
    assert_eq!(plan.model.compute_dtype, FloatDtype::Bf16);
    assert_eq!(plan.model.fp8_scale, None, "bf16 base has no FP8 scales");
    assert_eq!(plan.lora.scale, 1.0);
    assert_eq!(plan.optimizer.max_grad_norm, Some(1.0));
    assert_eq!(plan.optimizer.beta2, 0.999);
    assert_eq!(plan.schedule.base_lr, 2e-4);
    assert_eq!(plan.training.length, TrainLength::Steps(1600));
    assert_eq!(plan.training.timesteps.sampling, TimestepSampling::Shift);
    assert_eq!(plan.training.timesteps.discrete_flow_shift, 3.0);
    assert_eq!(plan.output.save_dtype, FloatDtype::F32);
    assert_eq!(plan.output.save_every_n_epochs, Some(1));
    assert!(plan.memory.applies);
    assert_eq!(plan.sampling, None);
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    assert_eq!(plan.config, cfg);
}

#[test]
fn plain_defaults_need_a_model_and_a_dataset() {
    let e = problems(&RunConfig::default(), &HostInfo::new(1));
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["model.dit", "dataset.config"]);
    assert!(
        e.problems[0].fix.contains("model.demo"),
        "{}",
        e.problems[0]
    );
}

#[test]
fn absurd_clip_sizes_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.dataset.resolution = Some([100_000, 100_000]);
    cfg.dataset.target_frames = Some(vec![5, 100_001]);
    let e = problems(&cfg, &HostInfo::new(1));
    let resolution = e.for_key("dataset.resolution").unwrap();
    assert!(
        resolution.message.contains("more than 16384 pixels a side"),
        "{resolution}"
    );
    let frames = e.for_key("dataset.target_frames").unwrap();
    assert!(
        frames.message.contains("100001 frames is more than 4093"),
        "{frames}"
    );
}

#[test]
fn every_problem_is_reported_with_key_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.schema_version = 0;
    cfg.model.variant = "t2v-15b".into();
    cfg.model.vae = dir.path().join("missing-vae.pth");
    cfg.dataset.resolution = Some([830, 480]);
    cfg.dataset.target_frames = Some(vec![1, 16, 33]);
    cfg.lora.rank = 0;
    cfg.lora.alpha = f64::NAN;
    cfg.lora.exclude_patterns = vec!["ok".into(), "blocks.(".into()];
    cfg.optimizer.learning_rate = -1e-4;
    cfg.optimizer.betas = [0.9, 1.0];
    cfg.optimizer.eps = 0.0;
    cfg.optimizer.weight_decay = -0.1;
    cfg.optimizer.max_grad_norm = f64::INFINITY;
    cfg.optimizer.lr_warmup_steps = 10;
    cfg.training.gradient_accumulation_steps = 0;
    cfg.training.max_train_steps = 0;
    cfg.training.discrete_flow_shift = 0.0;
    cfg.training.min_timestep = 600.0;
    cfg.training.max_timestep = 500.0;
    cfg.training.seed = u64::MAX;
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(10);
    cfg.memory.vram_budget_gb = Some(-2.0);
    cfg.memory.ram_budget_gb = Some(f64::NAN);
    cfg.output.output_name = "my/lora".into();
    cfg.output.output_dir = "".into();
    cfg.sampling.sample_at_first = true;
    let e = problems(&cfg, &HostInfo::new(1));
    let expected = [
        "schema_version",
        "model.variant",
        "model.vae",
        "dataset.resolution",
        "dataset.target_frames",
        "lora.rank",
        "lora.alpha",
        "lora.exclude_patterns[1]",
        "optimizer.learning_rate",
        "optimizer.betas[1]",
        "optimizer.eps",
        "optimizer.weight_decay",
        "optimizer.max_grad_norm",
        "optimizer.lr_warmup_steps",
        "training.max_train_steps",
        "training.gradient_accumulation_steps",
        "training.seed",
        "training.discrete_flow_shift",
        "training.max_timestep",
        "memory.blocks_to_swap",
        "memory.vram_budget_gb",
        "memory.ram_budget_gb",
        "output.output_dir",
        "output.output_name",
        "sampling.prompts",
    ];
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, expected);
    for p in &e.problems {
        assert!(!p.message.is_empty() && !p.fix.is_empty(), "{p}");
    }
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("the run config has {} problems:", expected.len())),
        "{shown}"
    );
    assert!(
        shown.contains("`dataset.target_frames`: frame counts must be 4k+1"),
        "{shown}"
    );
    assert!(shown.contains("bad: [16]"), "{shown}");
    assert!(e
        .for_key("model.vae")
        .unwrap()
        .message
        .contains("missing-vae.pth"));
    assert!(e.for_key("model.variant").unwrap().fix.contains("t2v-14b"));
}

#[test]
fn device_choice_is_checked_against_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let plan = validate(&cfg, &HostInfo::cpu_only()).unwrap();
    assert_eq!(plan.device, PlanDevice::Cpu);
    assert!(
        plan.notes.iter().any(|n| n.contains("no CUDA device")),
        "{:?}",
        plan.notes
    );

    cfg.training.device = DeviceSpec::Cuda(1);
    assert_eq!(
        validate(&cfg, &HostInfo::new(2)).unwrap().device,
        PlanDevice::Cuda(1)
    );
    let e = problems(&cfg, &HostInfo::new(1));
    assert_eq!(e.problems.len(), 1);
    assert_eq!(e.problems[0].key, "training.device");
    assert!(
        e.problems[0].message.contains("has 1 CUDA device"),
        "{}",
        e.problems[0]
    );
}

#[test]
fn settings_checks_skip_missing_files_and_unknown_devices_only() {
    // The defaults name neither a model nor a dataset: validate asks for both, check_settings for neither.
    let mut cfg = RunConfig::default();
    assert_eq!(
        check_settings(&cfg, &HostInfo::new(1), ModelFamily::Wan),
        Ok(())
    );
    cfg.model.dit = "not-downloaded-yet.safetensors".into();
    cfg.training.device = DeviceSpec::Cuda(3);
    assert_eq!(
        check_settings(&cfg, &HostInfo::cpu_only(), ModelFamily::Wan),
        Ok(())
    );
    // A device this machine could have but does not, and every bad setting, are problems as in validate.
    let e = check_settings(&cfg, &HostInfo::new(1), ModelFamily::Wan).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(e.problems[0].key, "training.device");
    cfg.training.device = DeviceSpec::Auto;
    cfg.lora.alpha = f64::NAN;
    cfg.lora.init_from = Some("/dev/null".into());
    let e = check_settings(&cfg, &HostInfo::new(1), ModelFamily::Wan).unwrap_err();
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    #[cfg(unix)]
    assert_eq!(keys, ["lora.alpha", "lora.init_from"], "{e}");
    #[cfg(not(unix))]
    assert_eq!(keys[0], "lora.alpha", "{e}");
}

#[test]
fn cuda_only_knobs_are_recorded_and_noted_on_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.training.device = DeviceSpec::Cpu;
    cfg.memory.streaming = StreamingMode::Staged;
    cfg.memory.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
    cfg.memory.activations = ActivationPlacement::Host;
    cfg.memory.vram_budget_gb = Some(10.0);
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert!(!plan.memory.applies);
    assert_eq!(plan.memory.streaming, StreamingMode::Staged);
    assert_eq!(plan.memory.vram_budget_bytes, Some(10 << 30));
    let note = plan
        .notes
        .iter()
        .find(|n| n.contains("CUDA device only"))
        .expect("a CPU note");
    assert!(
        note.contains(
            "memory.streaming, memory.blocks_to_swap, memory.activations, memory.vram_budget_gb"
        ),
        "{note}"
    );

    cfg.training.device = DeviceSpec::Auto;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert!(plan.memory.applies);
    assert!(
        plan.notes.iter().all(|n| !n.contains("CUDA device only")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn streaming_needs_a_mode_and_fits_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.memory.blocks_to_swap = BlocksToSwap::Auto(AutoKeyword::Auto);
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e
        .for_key("memory.blocks_to_swap")
        .unwrap()
        .fix
        .contains("pinned"));

    cfg.memory.streaming = StreamingMode::Pinned;
    cfg.model.variant = "t2v-1.3b".into();
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(30);
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e
        .for_key("memory.blocks_to_swap")
        .unwrap()
        .fix
        .contains("at most 29"));
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(29);
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(plan.model.variant.as_deref(), Some("t2v-1.3b"));
    assert_eq!(plan.memory.blocks_to_swap, BlocksToSwap::Count(29));
    assert!(plan.notes.iter().all(|n| !n.contains("saves no VRAM")));
    // No more blocks than GPU slots: valid, but it saves nothing, and the note says why.
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(2);
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert!(
        plan.notes.iter().any(|n| n.contains("saves no VRAM")),
        "{:?}",
        plan.notes
    );
    // Staging slots belong to staged streaming.
    cfg.memory.staging_slots = 6;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("staging_slots is used by")),
        "{:?}",
        plan.notes
    );
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(29);

    cfg.memory.streaming = StreamingMode::Staged;
    cfg.memory.staging_slots = 0;
    assert!(problems(&cfg, &HostInfo::new(1))
        .for_key("memory.staging_slots")
        .is_some());
}

#[test]
fn memory_settings_reach_the_plan_and_bad_budgets_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.model.variant = "t2v-14b".into();
    cfg.memory.streaming = StreamingMode::Staged;
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(20);
    cfg.memory.activations = ActivationPlacement::Host;
    cfg.memory.staging_slots = 3;
    cfg.memory.vram_budget_gb = Some(22.5);
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    let m = plan.memory;
    assert!(m.applies);
    assert_eq!(
        (
            m.streaming,
            m.blocks_to_swap,
            m.activations,
            m.staging_slots
        ),
        (
            StreamingMode::Staged,
            BlocksToSwap::Count(20),
            ActivationPlacement::Host,
            3
        )
    );
    assert_eq!(
        m.vram_budget_bytes,
        Some((22.5 * (1u64 << 30) as f64) as u64)
    );
    for bad in [0.0, -4.0, f64::NAN] {
        cfg.memory.vram_budget_gb = Some(bad);
        let e = problems(&cfg, &HostInfo::new(1));
        let p = e
            .for_key("memory.vram_budget_gb")
            .expect("a budget problem");
        assert!(p.message.contains("positive"), "{p}");
    }
    cfg.memory.vram_budget_gb = None;
    cfg.memory.blocks_to_swap = BlocksToSwap::Count(40);
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e
        .for_key("memory.blocks_to_swap")
        .unwrap()
        .message
        .contains("has 40"));
}

#[test]
fn checkpointing_reaches_the_plan_on_every_device_and_off_refuses_host_activations() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let parsed = RunConfig::from_toml_str(
        "[memory]\ncheckpointing = \"attention\"\n",
        Path::new("a.toml"),
    )
    .unwrap();
    assert_eq!(parsed.memory.checkpointing, Checkpointing::Attention);
    let parsed = RunConfig::from_toml_str(
        "[memory]\ncheckpointing = \"attention_projection\"\n",
        Path::new("a.toml"),
    )
    .unwrap();
    assert_eq!(
        parsed.memory.checkpointing,
        Checkpointing::AttentionProjection
    );
    assert!(
        parsed.memory.checkpointing.keeps_attention()
            && parsed.memory.checkpointing.keeps_projection()
    );
    assert_eq!(
        RunConfig::default().memory.checkpointing,
        Checkpointing::Blocks
    );
    for mode in [
        Checkpointing::Blocks,
        Checkpointing::Attention,
        Checkpointing::AttentionProjection,
        Checkpointing::Off,
    ] {
        cfg.memory.checkpointing = mode;
        for device in [DeviceSpec::Cpu, DeviceSpec::Auto] {
            cfg.training.device = device;
            let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
            assert_eq!(plan.memory.checkpointing, mode, "{device:?}");
            // It acts on a CPU too (RAM against recompute), so no "CPU ignores it" note names it.
            assert!(
                !plan.notes.iter().any(|n| n.contains("checkpointing")),
                "{:?}",
                plan.notes
            );
        }
    }
    cfg.memory.activations = ActivationPlacement::Host;
    cfg.memory.checkpointing = Checkpointing::Attention;
    assert!(validate(&cfg, &HostInfo::new(1)).is_ok());
    cfg.memory.checkpointing = Checkpointing::Off;
    let e = problems(&cfg, &HostInfo::new(1));
    let p = e
        .for_key("memory.checkpointing")
        .expect("off with activations in RAM is a problem");
    assert!(p.message.contains("memory.activations = \"host\""), "{p}");
    assert!(p.fix.contains("memory.checkpointing = \"blocks\""), "{p}");
    assert!(p.fix.contains("memory.activations = \"device\""), "{p}");
}

#[test]
fn zero_periods_and_epochs_turn_things_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.output.save_every_n_epochs = Some(0);
    cfg.output.save_every_n_steps = Some(250);
    cfg.training.max_train_epochs = Some(0);
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(plan.output.save_every_n_epochs, None);
    assert_eq!(plan.output.save_every_n_steps, Some(250));
    assert_eq!(plan.training.length, TrainLength::Steps(1600));

    cfg.training.max_train_epochs = Some(3);
    cfg.training.gradient_accumulation_steps = 4;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(plan.training.length, TrainLength::Epochs(3));
    // 10 batches with 4-step accumulation: 3 optimizer steps per epoch.
    assert_eq!(plan.training.total_steps(10), 9);
    assert_eq!(plan.schedule.with_total_steps(9).total_steps, 9);
}

#[test]
fn schedule_settings_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.optimizer.lr_warmup_steps = 100;
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e
        .for_key("optimizer.lr_warmup_steps")
        .unwrap()
        .fix
        .contains("constant_with_warmup"));

    cfg.optimizer.lr_scheduler = LrScheduler::CosineWithRestarts;
    cfg.optimizer.lr_scheduler_num_cycles = 0;
    assert!(problems(&cfg, &HostInfo::new(1))
        .for_key("optimizer.lr_scheduler_num_cycles")
        .is_some());

    cfg.optimizer.lr_scheduler = LrScheduler::Polynomial;
    cfg.optimizer.learning_rate = 1e-8;
    cfg.optimizer.lr_scheduler_power = 0.0;
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e.for_key("optimizer.learning_rate").is_some());
    assert!(e.for_key("optimizer.lr_scheduler_power").is_some());

    cfg.optimizer.lr_scheduler_power = 2.0;
    for lr in [1.5, 1e300] {
        cfg.optimizer.learning_rate = lr;
        let e = problems(&cfg, &HostInfo::new(1));
        let problem = e.for_key("optimizer.learning_rate").expect("refused");
        assert!(problem.message.contains("above 1"), "{problem}");
    }
    cfg.optimizer.learning_rate = 1e-4;
    cfg.optimizer.lr_warmup_steps = 2000;
    assert!(problems(&cfg, &HostInfo::new(1))
        .for_key("optimizer.lr_warmup_steps")
        .is_some());
    cfg.training.max_train_epochs = Some(10);
    assert!(
        validate(&cfg, &HostInfo::new(1)).is_ok(),
        "warmup vs length is unknown by epochs"
    );
}

#[test]
fn sampling_needs_prompts_vae_and_text_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, b"a cat --w 832 --h 480 --f 33").unwrap();
    cfg.sampling.prompts = Some(prompts.clone());
    cfg.sampling.sample_every_n_steps = Some(200);
    let e = problems(&cfg, &HostInfo::new(1));
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["model.vae", "model.text_encoder"]);

    for (field, name) in [
        (&mut cfg.model.vae, "vae.pth"),
        (&mut cfg.model.text_encoder, "umt5.pth"),
    ] {
        *field = dir.path().join(name);
        std::fs::write(&*field, b"").unwrap();
    }
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    let sampling = plan.sampling.unwrap();
    assert_eq!(
        (sampling.prompts, sampling.every_n_steps),
        (prompts, Some(200))
    );
}

#[test]
fn demo_and_synthetic_need_no_files() {
    let mut cfg = RunConfig::default();
    cfg.model.demo = true;
    cfg.dataset.synthetic = true;
    cfg.model.variant = "t2v-14b".into();
    let plan = validate(&cfg, &HostInfo::cpu_only()).unwrap();
    assert_eq!(plan.model.source, ModelSource::Demo);
    assert_eq!(plan.dataset.source, crate::plan::DatasetSource::Synthetic);
    assert_eq!(plan.model.variant, None);
    assert!(
        plan.notes.iter().any(|n| n.contains("model.variant")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.model.dit = dir.path().join("wan2.1_t2v_14B_fp8.safetensors");
    cfg.lora.init_from = Some(dir.path().join("old.safetensors"));
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e
        .for_key("model.dit")
        .unwrap()
        .message
        .contains("wan2.1_t2v_14B_fp8.safetensors"));
    assert!(e
        .for_key("lora.init_from")
        .unwrap()
        .message
        .contains("old.safetensors"));
}

#[test]
fn an_output_folder_under_a_file_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let file = dir.path().join("wan.safetensors");
    for output_dir in [file.clone(), file.join("loras")] {
        cfg.output.output_dir = output_dir.clone();
        let e = problems(&cfg, &HostInfo::new(1));
        let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["output.output_dir"], "{}", output_dir.display());
        assert!(e.problems[0].message.contains("is a file"), "{e}");
    }
    // A folder that does not exist yet is made by the run.
    cfg.output.output_dir = dir.path().join("new").join("loras");
    validate(&cfg, &HostInfo::new(1)).unwrap();
}

#[test]
fn both_a14b_experts_resolve_with_their_mode_and_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let low = dir.path().join("low_noise.safetensors");
    std::fs::write(&low, b"").unwrap();
    cfg.model.dit_low_noise = low.clone();
    cfg.model.experts = ExpertMode::Split;
    cfg.model.expert_boundary = 0.9;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(
        plan.model.low_noise,
        Some(LowNoisePlan {
            dit: low,
            mode: ExpertMode::Split,
            boundary: Some(0.9),
            device: None,
        })
    );
    cfg.model.expert_boundary = 0.0;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(
        plan.model.low_noise.unwrap().boundary,
        None,
        "0 is the model's"
    );
}

#[test]
fn the_low_noise_expert_takes_a_gpu_of_its_own_or_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let low = dir.path().join("low_noise.safetensors");
    std::fs::write(&low, b"").unwrap();
    cfg.model.dit_low_noise = low;
    cfg.training.device = DeviceSpec::Cuda(0);
    cfg.training.low_noise_device = "cuda:1".into();
    let plan = validate(&cfg, &HostInfo::new(2)).unwrap();
    assert_eq!(
        plan.model.low_noise.unwrap().device,
        Some(PlanDevice::Cuda(1))
    );
    // Beside a CPU run the CPU keeps both experts loaded.
    cfg.training.device = DeviceSpec::Cpu;
    cfg.training.low_noise_device = "cpu".into();
    let plan = validate(&cfg, &HostInfo::new(0)).unwrap();
    assert_eq!(plan.model.low_noise.unwrap().device, Some(PlanDevice::Cpu));
    cfg.training.device = DeviceSpec::Cuda(0);
    for (value, host, says) in [
        ("cuda:0", 2, "training.device's GPU"),
        ("cuda:2", 2, "not available"),
        ("cpu", 2, "names the GPU"),
        ("auto", 2, "names the GPU"),
        ("gpu1", 2, "unknown device"),
    ] {
        cfg.training.low_noise_device = value.into();
        let e = problems(&cfg, &HostInfo::new(host));
        let problem = e.for_key("training.low_noise_device").unwrap();
        assert!(
            problem.message.contains(says),
            "{value}: {}",
            problem.message
        );
        assert!(problem.fix.contains("cuda:1"), "{}", problem.fix);
    }
    // Without a second expert it places nothing, and says so.
    cfg.model.dit_low_noise = Default::default();
    cfg.training.low_noise_device = "cuda:1".into();
    let plan = validate(&cfg, &HostInfo::new(2)).unwrap();
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("training.low_noise_device is ignored")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn a_bad_low_noise_expert_or_boundary_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.model.dit_low_noise = dir.path().join("missing.safetensors");
    cfg.model.expert_boundary = 875.0;
    let e = problems(&cfg, &HostInfo::new(1));
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["model.expert_boundary", "model.dit_low_noise"]);
    cfg.model.expert_boundary = 0.0;
    cfg.model.dit_low_noise = cfg.model.dit.clone();
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(e
        .for_key("model.dit_low_noise")
        .unwrap()
        .fix
        .contains("high-noise"));
}

#[test]
fn expert_settings_without_a_second_expert_get_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.model.experts = ExpertMode::Split;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(plan.model.low_noise, None);
    assert!(
        plan.notes.iter().any(|n| n.contains("model.dit_low_noise")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn training_mode_is_checked_against_a_named_variant() {
    use crate::run::TrainingMode;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.training.mode = TrainingMode::ImageToVideo;
    // Detected from the file: the engine checks it once the model is loaded.
    let plan = validate(&cfg, &HostInfo::cpu_only()).unwrap();
    assert_eq!(plan.training.mode, TrainingMode::ImageToVideo);
    cfg.model.variant = "ti2v-5b".into();
    assert!(validate(&cfg, &HostInfo::cpu_only()).is_ok());
    cfg.model.variant = "t2v-14b".into();
    let errors = problems(&cfg, &HostInfo::cpu_only());
    let p = errors.for_key("training.mode").unwrap();
    assert!(
        p.message.contains("t2v-14b is a text-to-video model") && p.fix.contains("text_to_video"),
        "{p}"
    );
    cfg.model.variant = "i2v-14b".into();
    cfg.training.mode = TrainingMode::TextToVideo;
    let errors = problems(&cfg, &HostInfo::cpu_only());
    assert!(errors.for_key("training.mode").is_some());
    cfg.training.mode = TrainingMode::Auto;
    assert!(validate(&cfg, &HostInfo::cpu_only()).is_ok());
}

#[test]
fn ti2v_resolutions_are_multiples_of_32() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.dataset.resolution = Some([848, 480]);
    assert!(validate(&cfg, &HostInfo::cpu_only()).is_ok());
    cfg.model.variant = "ti2v-5b".into();
    let errors = problems(&cfg, &HostInfo::cpu_only());
    let p = errors.for_key("dataset.resolution").unwrap();
    assert!(
        p.message.contains("multiple of 32") && p.fix.contains("[832, 480]"),
        "{p}"
    );
    cfg.dataset.resolution = Some([1280, 704]);
    assert!(validate(&cfg, &HostInfo::cpu_only()).is_ok());
}

#[test]
fn fp8_matmul_needs_an_fp8_base_on_a_gpu_and_holds_it_per_channel() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    cfg.model.fp8_matmul = true;
    let e = problems(&cfg, &HostInfo::new(1));
    assert_eq!(e.problems[0].key, "model.fp8_matmul");
    assert!(
        e.problems[0].message.contains("\"bf16\""),
        "{}",
        e.problems[0]
    );

    cfg.model.base_dtype = BaseDtype::Fp8;
    cfg.model.fp8_scale = Fp8ScaleMode::Block64;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert!(plan.model.fp8_matmul);
    assert_eq!(plan.model.fp8_scale, Some(Fp8ScaleMode::Channel));
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("quantised again per channel")),
        "{:?}",
        plan.notes
    );
    cfg.model.fp8_scale = Fp8ScaleMode::Tensor;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert_eq!(plan.model.fp8_scale, Some(Fp8ScaleMode::Channel));
    assert!(plan.notes.iter().all(|n| !n.contains("per channel")));

    cfg.training.device = DeviceSpec::Cpu;
    let e = problems(&cfg, &HostInfo::new(1));
    assert!(
        e.problems[0].message.contains("not on the CPU"),
        "{}",
        e.problems[0]
    );
    cfg.training.device = DeviceSpec::Auto;

    cfg.model.fp8_matmul = false;
    let plan = validate(&cfg, &HostInfo::new(1)).unwrap();
    assert!(!plan.model.fp8_matmul);
    assert_eq!(plan.model.fp8_scale, Some(Fp8ScaleMode::Tensor));
}

/// `model.fp8_attention` is off by default, reaches the plan on a GPU with bf16 activations, and is refused by
/// name on the CPU and for f32/f16 activations.
#[test]
fn fp8_attention_needs_a_gpu_and_bf16_activations() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    assert!(!cfg.model.fp8_attention);
    assert!(
        !validate(&cfg, &HostInfo::new(1))
            .unwrap()
            .model
            .fp8_attention
    );

    let section: crate::run::ModelSection = toml::from_str("fp8_attention = true").unwrap();
    assert!(section.fp8_attention);
    cfg.model.fp8_attention = true;
    for base in [BaseDtype::Bf16, BaseDtype::Fp8] {
        cfg.model.base_dtype = base;
        assert!(
            validate(&cfg, &HostInfo::new(1))
                .unwrap()
                .model
                .fp8_attention
        );
    }

    cfg.model.base_dtype = BaseDtype::F32;
    let e = problems(&cfg, &HostInfo::new(1));
    let p = e.for_key("model.fp8_attention").unwrap();
    assert!(
        p.message.contains("\"f32\" computes in f32") && p.fix.contains("fp8_attention = false"),
        "{p}"
    );

    cfg.model.base_dtype = BaseDtype::Bf16;
    cfg.training.device = DeviceSpec::Cpu;
    let e = problems(&cfg, &HostInfo::new(1));
    let p = e.for_key("model.fp8_attention").unwrap();
    assert!(
        p.message.contains("not on the CPU") && p.fix.contains("fp8_attention = false"),
        "{p}"
    );
}

/// `[lora] kind` reads as users write it; LoKr's options are checked, and refused on the other kinds.
#[test]
fn lokr_options_are_checked_and_belong_to_lokr_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = runnable(dir.path());
    let section: crate::run::LoraSection =
        toml::from_str("kind = \"lokr\"\nfactor = 8\ndecompose_both = true\nrank = 4").unwrap();
    assert_eq!(section.kind, LoraKind::Lokr);
    cfg.lora = section;
    let plan = validate(&cfg, &HostInfo::cpu_only()).unwrap();
    assert_eq!((plan.lora.kind, plan.lora.factor), (LoraKind::Lokr, 8));
    assert!(plan.lora.decompose_both && !plan.lora.full_matrix);

    cfg.lora.factor = 0;
    let keys = |cfg: &RunConfig| -> Vec<String> {
        problems(cfg, &HostInfo::cpu_only())
            .problems
            .iter()
            .map(|p| p.key.clone())
            .collect()
    };
    assert_eq!(keys(&cfg), ["lora.factor"]);
    cfg.lora.factor = -2;
    assert_eq!(keys(&cfg), ["lora.factor"]);
    for kind in [LoraKind::Lora, LoraKind::Loha, LoraKind::Dora] {
        cfg.lora.kind = kind;
        cfg.lora.factor = 4;
        cfg.lora.full_matrix = true;
        assert_eq!(
            keys(&cfg),
            ["lora.factor", "lora.decompose_both", "lora.full_matrix"],
            "{kind:?}"
        );
    }
}
