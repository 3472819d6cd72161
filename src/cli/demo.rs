//! `framesmith demo`: the built-in demo project. Writes the generated dataset (clips and captions), a musubi-tuner
//! dataset TOML, its latent and text caches in musubi-tuner's format (made with the demo codec and the demo text
//! embedding), and a sample prompt file with the start frames of two clips into a folder; then trains the tiny
//! demo model (image-to-video: the start frame is given, the LoRA learns the motion the caption names) on CPU
//! from those caches with the `demo-cpu` preset and writes the LoRA, the metrics and sample clips there — before
//! the first step and every quarter of the run, so the samples show it learning. Paths in the run config are
//! absolute, so `run.toml` works from any folder.

use std::path::Path;

use anyhow::Context;
use framesmith_config::presets;
use framesmith_config::RunConfig;
use framesmith_engine::demo::project::write_demo_project;

use super::run::{run_headless, RunSummary};

/// The demo project's run config: defaults + `demo-cpu`, outputs and samples in `dir` (made absolute).
pub fn demo_config(dir: &Path, steps: Option<usize>) -> anyhow::Result<RunConfig> {
    let dir = &std::path::absolute(dir)
        .with_context(|| format!("cannot resolve the demo folder {}", dir.display()))?;
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    if let Some(steps) = steps {
        config.training.max_train_steps = steps;
        config.optimizer.lr_warmup_steps = config.optimizer.lr_warmup_steps.min(steps / 10);
    }
    config.dataset.synthetic = false;
    config.dataset.config = dir.join("dataset.toml");
    config.output.output_dir = dir.join("output");
    config.sampling.prompts = Some(dir.join("sample_prompts.txt"));
    config.sampling.sample_every_n_steps = Some(config.training.max_train_steps.div_ceil(4).max(1));
    config.sampling.sample_at_first = true;
    Ok(config)
}

/// Writes the demo project into `dir` (when its dataset config is not there yet) and returns its run config.
pub fn prepare_demo(dir: &Path, steps: Option<usize>) -> anyhow::Result<RunConfig> {
    let config = demo_config(dir, steps)?;
    if !dir.join("dataset.toml").exists() || !dir.join("start").is_dir() {
        write_demo_project(dir, config.training.seed)?;
    }
    Ok(config)
}

/// Runs the demo in `dir`.
pub fn run_demo(dir: &Path, steps: Option<usize>) -> anyhow::Result<RunSummary> {
    let config = prepare_demo(dir, steps)?;
    eprintln!("demo project in {}", dir.display());
    let summary = run_headless(config, None)?;
    if let (Some(first), Some(last)) = (summary.first_loss, summary.last_smoothed_loss) {
        eprintln!("loss: first step {first:.4}, smoothed at the end {last:.4}");
    }
    if let Some(lora) = &summary.last_lora {
        eprintln!("LoRA: {}", lora.display());
    }
    for s in &summary.samples {
        eprintln!("sample clip: {}", s.display());
    }
    Ok(summary)
}

/// Default folder of the demo project.
#[cfg(not(feature = "gui"))]
pub fn default_demo_dir() -> std::path::PathBuf {
    std::path::PathBuf::from("framesmith-demo")
}
