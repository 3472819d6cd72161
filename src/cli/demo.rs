//! `framesmith demo`: the built-in demo project. Writes the generated dataset (clips and captions), a musubi-tuner
//! dataset TOML, its latent and text caches in musubi-tuner's format (made with the demo codec and the demo text
//! embedding), and a sample prompt file with the start frames of two clips into a folder; then trains the tiny
//! demo model (image-to-video: the start frame is given, the LoRA learns the motion the caption names) on CPU
//! from those caches with the `demo-cpu` preset and writes the LoRA, the metrics and sample clips there — before
//! the first step and every quarter of the run, so the samples show it learning. Paths in the run config are
//! absolute, so `run.toml` works from any folder.

use std::fs;
use std::path::Path;

use anyhow::Context;
use candle_core::Device;
use framesmith_config::presets;
use framesmith_config::RunConfig;
use framesmith_data::cache::{
    text_cache_name, video_latent_cache_name, write_wan_latent_cache, write_wan_text_cache,
    LatentCacheMetadata, WanLatentCache, CACHE_FORMAT_VERSION, WAN_ARCHITECTURE,
};
use framesmith_data::frames::FrameWindow;
use framesmith_data::video::encode::write_mp4;
use framesmith_engine::demo;
use framesmith_engine::demo::project::{write_sample_prompts, DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE};
use framesmith_engine::demo::shapes::{self, DemoClip};
use framesmith_engine::family::wan::demo_setup::demo_model_config;
use framesmith_engine::train::samples::SAMPLE_FPS;

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

/// The demo's musubi-tuner dataset config.
fn dataset_toml() -> String {
    format!(
        "# The demo dataset: generated clips, cached with the demo codec (demo only, not a Wan VAE).\n\
         [general]\nresolution = [{DEMO_SIZE}, {DEMO_SIZE}]\ncaption_extension = \".txt\"\n\
         batch_size = 1\nenable_bucket = false\n\n[[datasets]]\nvideo_directory = \"dataset\"\n\
         cache_directory = \"cache\"\ntarget_frames = [{DEMO_FRAMES}]\nframe_extraction = \"head\"\n"
    )
}

/// Writes one clip's latent and text caches in musubi-tuner's format.
fn write_caches(cache: &Path, clip: &DemoClip) -> anyhow::Result<()> {
    let cfg = demo_model_config();
    let window = FrameWindow {
        start: 0,
        frames: clip.frames.len() as u32,
    };
    let size = (DEMO_SIZE as u32, DEMO_SIZE as u32);
    let latents = WanLatentCache {
        latents: demo::codec::encode(&clip.frames, &Device::Cpu)?,
        latents_image: None,
        latents_control: None,
        clip: None,
        f_indices: None,
    };
    let meta = LatentCacheMetadata {
        architecture: WAN_ARCHITECTURE.into(),
        width: size.0,
        height: size.1,
        format_version: CACHE_FORMAT_VERSION.into(),
        frame_count: Some(window.frames),
    };
    let latent_path = cache.join(video_latent_cache_name(&clip.name, window, size));
    write_wan_latent_cache(&latent_path, &latents, &meta)?;
    let text = demo::text::embed(&clip.caption, cfg.text_dim, cfg.text_len, &Device::Cpu)?;
    write_wan_text_cache(
        &cache.join(text_cache_name(&clip.name)),
        &text,
        &clip.caption,
    )?;
    Ok(())
}

/// Writes the demo dataset (MP4 clips with `.txt` captions), its TOML, its caches and the sample prompts.
pub fn write_demo_project(dir: &Path, seed: u64) -> anyhow::Result<()> {
    let dataset = dir.join("dataset");
    let cache = dir.join("cache");
    for d in [&dataset, &cache] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
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
        write_caches(&cache, clip)?;
    }
    let toml_path = dir.join("dataset.toml");
    fs::write(&toml_path, dataset_toml())
        .with_context(|| format!("cannot write {}", toml_path.display()))?;
    write_sample_prompts(dir, &clips)?;
    Ok(())
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
