//! The demo project's generated clips (`demo::shapes`): how many, their size and frames, and the sample prompts
//! written beside them with each sampled clip's start frame.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::demo::shapes::DemoClip;
use crate::train::outputs::write_atomic;
use crate::train::samples::encode_png;

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
