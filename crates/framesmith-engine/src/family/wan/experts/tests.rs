//! Wan2.2 A14B with both experts in one run, on two tiny experts: `joint` and `split` runs resume bit-identically,
//! each step runs through the expert its timesteps pick (the other parked), `split` saves a LoRA per expert, and
//! experts given in the wrong keys are refused with the fix.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use crate::family::wan::run::WanRun;
use crate::family::wan::tests::i2v::{dataset, write_musubi_caches, MusubiItem};
use crate::train::tests::{all_lora_values, try_start};
use framesmith_config::run::{Checkpointing, ExpertMode};
use framesmith_config::{presets, RunConfig};
use framesmith_models::wan::random::random_weights;
use framesmith_models::wan::WanConfig;

/// Writes a tiny expert (random weights, `seed`) as `dir/{folder}/diffusion_pytorch_model.safetensors` with the
/// tiny T2V fixture's `config.json`; the folder name says which expert it is.
fn expert(dir: &Path, folder: &str, seed: u64) -> anyhow::Result<PathBuf> {
    let root = dir.join(folder);
    std::fs::create_dir_all(&root)?;
    let weights = random_weights(&WanConfig::tiny(2), seed, DType::F32, &Device::Cpu)?;
    let file = root.join("diffusion_pytorch_model.safetensors");
    candle_core::safetensors::save(&weights, &file)?;
    let fixture = framesmith_models::fixtures::wan_case("wan21_t2v_tiny");
    std::fs::copy(fixture.join("config.json"), root.join("config.json"))?;
    Ok(file)
}

/// A run on two tiny experts over a two-clip text-to-video cache, `steps` long.
fn config(dir: &Path, mode: ExpertMode, steps: usize) -> anyhow::Result<RunConfig> {
    let toml = dataset(dir)?;
    for (stem, seed) in [("a", 1), ("b", 2)] {
        let item = MusubiItem {
            stem,
            seed,
            image: false,
            clip_dim: None,
        };
        write_musubi_caches(&dir.join("cache"), &item, 32)?;
    }
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    config.model.demo = false;
    config.model.dit = expert(dir, "wan2.2_t2v_high_noise", 5)?;
    config.model.dit_low_noise = expert(dir, "wan2.2_t2v_low_noise", 6)?;
    config.model.experts = mode;
    // Halfway, so a short run meets both experts.
    config.model.expert_boundary = 0.5;
    config.dataset.synthetic = false;
    config.dataset.config = toml;
    config.training.max_train_steps = steps;
    config.optimizer.lr_warmup_steps = 0;
    config.memory.checkpointing = Checkpointing::Blocks;
    config.output.output_dir = dir.join("run");
    config.output.save_every_n_steps = Some(0);
    Ok(config)
}

fn resumes_bit_identically(mode: ExpertMode) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config_a = config(&dir.path().join("a"), mode, 6)?;
    let mut straight = try_start(&config_a, None)?;
    let mut losses = Vec::new();
    while straight.step() < 6 {
        losses.push(straight.train_step(&|| false)?.loss);
    }
    assert!(
        straight.expert_switches() >= 2,
        "both experts should have trained ({} switches)",
        straight.expert_switches()
    );

    let config_b = config(&dir.path().join("b"), mode, 6)?;
    let mut first = try_start(&config_b, None)?;
    let mut resumed = Vec::new();
    while first.step() < 3 {
        resumed.push(first.train_step(&|| false)?.loss);
    }
    let saved = first.save(false)?;
    drop(first);
    let mut second = try_start(&config_b, Some(&dir.path().join("b").join("run")))?;
    assert_eq!(second.step(), 3);
    while second.step() < 6 {
        resumed.push(second.train_step(&|| false)?.loss);
    }
    assert_eq!(losses, resumed);
    assert_eq!(all_lora_values(&straight)?, all_lora_values(&second)?);
    // The experts are Wan 2.2's: the metadata names its official code.
    let file =
        framesmith_nn::lora_file::LoraFile::load(&saved.loras[0], &candle_core::Device::Cpu)?;
    assert_eq!(
        file.metadata
            .get("modelspec.implementation")
            .map(String::as_str),
        Some("https://github.com/Wan-Video/Wan2.2")
    );
    match mode {
        ExpertMode::Joint => assert_eq!(saved.loras.len(), 1),
        ExpertMode::Split => {
            let names: Vec<String> = saved
                .loras
                .iter()
                .filter_map(|p| p.file_name()?.to_str().map(String::from))
                .collect();
            assert!(names[0].contains("_high_noise-000003"), "{names:?}");
            assert!(names[1].contains("_low_noise-000003"), "{names:?}");
            let state = saved.state.expect("a state folder");
            assert!(state.join("optimizer_low_noise.safetensors").exists());
        }
    }
    Ok(())
}

#[test]
fn a_joint_run_on_both_experts_resumes_bit_identically() -> anyhow::Result<()> {
    resumes_bit_identically(ExpertMode::Joint)
}

#[test]
fn a_split_run_on_both_experts_resumes_bit_identically() -> anyhow::Result<()> {
    resumes_bit_identically(ExpertMode::Split)
}

/// With a device of its own (`training.low_noise_device`; beside a CPU run, "cpu" keeps both experts loaded)
/// neither expert is parked, `joint` steps the low-noise expert through a mirror of the shared LoRA, and the run
/// learns exactly what the parked run learns, across a resume too.
fn own_device_learns_what_parking_does(mode: ExpertMode) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut parked = try_start(&config(&dir.path().join("a"), mode, 6)?, None)?;
    let mut losses = Vec::new();
    while parked.step() < 6 {
        losses.push(parked.train_step(&|| false)?.loss);
    }
    assert!(parked.expert_switches() >= 2, "both experts trained");

    let mut own = config(&dir.path().join("b"), mode, 6)?;
    own.training.low_noise_device = "cpu".into();
    let mut first = try_start(&own, None)?;
    let mut seen = Vec::new();
    let mut names = Vec::new();
    while first.step() < 3 {
        let report = first.train_step(&|| false)?;
        seen.push(report.loss);
        names.push(report.expert.expect("names its expert").name);
    }
    first.save(false)?;
    drop(first);
    let mut second = try_start(&own, Some(&dir.path().join("b").join("run")))?;
    while second.step() < 6 {
        let report = second.train_step(&|| false)?;
        seen.push(report.loss);
        names.push(report.expert.expect("names its expert").name);
    }
    assert_eq!(losses, seen);
    assert_eq!(all_lora_values(&parked)?, all_lora_values(&second)?);
    assert!(
        names.contains(&"high_noise") && names.contains(&"low_noise"),
        "{names:?}"
    );
    let low = second
        .family_run::<WanRun>()
        .experts
        .low_noise
        .as_ref()
        .expect("two experts");
    assert_eq!(second.expert_switches(), 0);
    assert!(!low.model.is_parked() && !second.family_run::<WanRun>().experts.model.is_parked());
    match mode {
        ExpertMode::Joint => {
            let mirror = low.mirror.as_ref().expect("joint has a mirror");
            let shared = second.loras();
            for (a, b) in mirror.vars().iter().zip(shared.vars()) {
                assert_ne!(a.as_tensor().id(), b.as_tensor().id(), "its own tensors");
                let diff = (a.as_tensor() - b.as_tensor())?.abs()?.sum_all()?;
                assert_eq!(diff.to_scalar::<f32>()?, 0.0, "equal after the last step");
            }
        }
        ExpertMode::Split => assert!(low.mirror.is_none()),
    }
    Ok(())
}

#[test]
fn a_joint_run_with_the_low_noise_expert_on_its_own_device_learns_what_parking_does(
) -> anyhow::Result<()> {
    own_device_learns_what_parking_does(ExpertMode::Joint)
}

#[test]
fn a_split_run_with_the_low_noise_expert_on_its_own_device_learns_what_parking_does(
) -> anyhow::Result<()> {
    own_device_learns_what_parking_does(ExpertMode::Split)
}

/// A joint LoRA is one set of adapters on both experts: a step through either moves the same tensors, and the
/// expert not in use waits parked.
#[test]
fn a_joint_lora_is_shared_and_one_expert_is_parked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut trainer = try_start(&config(dir.path(), ExpertMode::Joint, 4)?, None)?;
    for _ in 0..4 {
        let report = trainer.train_step(&|| false)?;
        let low = trainer
            .family_run::<WanRun>()
            .experts
            .low_noise
            .as_ref()
            .expect("two experts");
        assert_ne!(
            trainer.family_run::<WanRun>().experts.model.is_parked(),
            low.model.is_parked()
        );
        let expert = report.expert.expect("the step names its expert");
        assert_eq!(expert.name == "high_noise", low.model.is_parked());
        assert_eq!(expert.switches, trainer.expert_switches());
        assert_eq!(expert.switches > 0, expert.switch_secs > 0.0);
    }
    let low = trainer
        .family_run::<WanRun>()
        .experts
        .low_noise
        .as_ref()
        .expect("two experts");
    let path = "blocks.0.self_attn.q";
    let on_high = trainer.family_run::<WanRun>().experts.model.blocks()[0]
        .self_attn
        .q
        .lora()
        .expect("a LoRA");
    let on_low = low.model.blocks()[0].self_attn.q.lora().expect("a LoRA");
    let shared = trainer
        .loras()
        .get(path)
        .and_then(|a| a.as_lora())
        .expect("in the set");
    for l in [on_high, on_low] {
        let diff = (l.up.as_tensor() - shared.up.as_tensor())?
            .abs()?
            .sum_all()?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.0);
    }
    assert!(
        shared.up.as_tensor().abs()?.sum_all()?.to_scalar::<f32>()? > 0.0,
        "trained"
    );
    Ok(())
}

#[test]
fn experts_in_the_wrong_keys_are_refused_with_the_fix() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = config(dir.path(), ExpertMode::Joint, 2)?;
    std::mem::swap(&mut config.model.dit, &mut config.model.dit_low_noise);
    let err = format!("{:#}", try_start(&config, None).err().expect("refused"));
    assert!(err.contains("swap them"), "{err}");
    Ok(())
}
