//! The demo project's generated clips (`demo::shapes`): how many, their size and frames, the project folder
//! written from them (clips, captions, the dataset TOML, the demo model's caches) and the sample prompts written
//! beside them with each sampled clip's start frame.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use framesmith_data::video::encode::write_mp4;

use crate::demo::shapes::{self, DemoClip};
use crate::family::wan::demo_setup::write_demo_caches;
use crate::train::outputs::write_atomic;
use crate::train::samples::{encode_png, SAMPLE_FPS};

/// Demo clips: 8 clips of 5 frames at 64×64 pixels.
pub const DEMO_CLIPS: usize = 8;
pub const DEMO_FRAMES: usize = 5;
pub const DEMO_SIZE: usize = 64;
/// Sample prompts of the demo: the first clips' captions with their start frames.
pub const DEMO_SAMPLES: usize = 2;

/// Writes each sampled clip's first frame as `start/<clip>.png` and the prompt file that names them
/// (`sample_prompts.txt`, returned); the images are named relative to it, so the folder can move. Both are
/// written atomically: another window or test opening the demo may be reading them.
pub fn write_sample_prompts(dir: &Path, clips: &[DemoClip]) -> anyhow::Result<PathBuf> {
    let start = dir.join("start");
    fs::create_dir_all(&start).with_context(|| format!("cannot create {}", start.display()))?;
    let mut prompts = String::new();
    for (i, clip) in clips.iter().take(DEMO_SAMPLES).enumerate() {
        let Some(first) = clip.frames.first() else {
            anyhow::bail!("the demo clip {} has no frames", clip.name);
        };
        let image = start.join(format!("{}.png", clip.name));
        write_atomic(&image, &encode_png(first)?)?;
        prompts.push_str(&format!(
            "{} --w {DEMO_SIZE} --h {DEMO_SIZE} --f {DEMO_FRAMES} --s 20 --l 1.0 --fs 1.0 --d {i} --i start/{}.png\n",
            clip.caption, clip.name
        ));
    }
    let path = dir.join("sample_prompts.txt");
    write_atomic(&path, prompts.as_bytes())?;
    Ok(path)
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
        write_demo_caches(&cache, clip)?;
    }
    let toml_path = dir.join("dataset.toml");
    fs::write(&toml_path, dataset_toml())
        .with_context(|| format!("cannot write {}", toml_path.display()))?;
    write_sample_prompts(dir, &clips)?;
    Ok(())
}
