//! `framesmith demo`: the built-in demo project. Writes the generated dataset (clips and captions) and a sample
//! prompt file into a folder, then trains the tiny demo model on CPU with the `demo-cpu` preset and writes the
//! LoRA, the metrics and sample clips there.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use framesmith::config::presets;
use framesmith::config::RunConfig;
use framesmith::demo::shapes;
use framesmith::train::samples::SAMPLE_FPS;
use framesmith::train::setup::{DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE};
use framesmith::video::encode::write_mp4;

use super::run::{run_headless, RunSummary};

/// The demo project's run config: defaults + `demo-cpu`, outputs and samples in `dir`.
pub fn demo_config(dir: &Path, steps: Option<usize>) -> anyhow::Result<RunConfig> {
    let mut config = presets::builtin("demo-cpu")?
        .apply(&RunConfig::default())?
        .config;
    if let Some(steps) = steps {
        config.training.max_train_steps = steps;
        config.optimizer.lr_warmup_steps = config.optimizer.lr_warmup_steps.min(steps / 10);
    }
    config.output.output_dir = dir.join("output");
    config.sampling.prompts = Some(dir.join("sample_prompts.txt"));
    config.sampling.sample_every_n_steps = Some(config.training.max_train_steps);
    Ok(config)
}

/// Writes the demo dataset (MP4 clips with `.txt` captions, for looking at) and the sample prompt file.
pub fn write_demo_project(dir: &Path, seed: u64) -> anyhow::Result<()> {
    let dataset = dir.join("dataset");
    fs::create_dir_all(&dataset).with_context(|| format!("cannot create {}", dataset.display()))?;
    let clips = shapes::generate(DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE, seed);
    for clip in &clips {
        write_mp4(
            &dataset.join(format!("{}.mp4", clip.name)),
            &clip.frames,
            SAMPLE_FPS,
        )?;
        let caption = dataset.join(format!("{}.txt", clip.name));
        fs::write(&caption, &clip.caption)
            .with_context(|| format!("cannot write {}", caption.display()))?;
    }
    let prompts: String = clips
        .iter()
        .take(2)
        .enumerate()
        .map(|(i, c)| {
            format!(
                "{} --w {DEMO_SIZE} --h {DEMO_SIZE} --f {DEMO_FRAMES} --s 20 --l 1.0 --fs 3.0 --d {i}\n",
                c.caption
            )
        })
        .collect();
    let path = dir.join("sample_prompts.txt");
    fs::write(&path, prompts).with_context(|| format!("cannot write {}", path.display()))
}

/// Runs the demo in `dir`.
pub fn run_demo(dir: &Path, steps: Option<usize>) -> anyhow::Result<RunSummary> {
    let config = demo_config(dir, steps)?;
    write_demo_project(dir, config.training.seed)?;
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
pub fn default_demo_dir() -> PathBuf {
    PathBuf::from("framesmith-demo")
}
