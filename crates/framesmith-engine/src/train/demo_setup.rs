//! The demo model's run (demo only): its config, its generated training clips and its sample prompts. The demo
//! model is image-to-video: each clip's first frame is given (in training and in samples, through `--i`) and the
//! model learns to move the shape the way the caption says.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{Device, Tensor};

use crate::demo;
use crate::demo::shapes::DemoClip;
use crate::family::wan::denoise::ImageConditioning;
use crate::family::wan::samples::SamplePrompt;
use crate::family::wan::start_image::load_start_image;
use crate::generate::prompts::PromptSpec;
use crate::train::data::TrainItem;
use crate::train::outputs::write_atomic;
use crate::train::samples::encode_png;
use framesmith_data::video::encode::RgbFrame;
use framesmith_models::wan::WanConfig;

/// Layers of the demo model.
pub const DEMO_LAYERS: usize = 2;
/// Demo clips: 8 clips of 5 frames at 64×64 pixels.
pub const DEMO_CLIPS: usize = 8;
pub const DEMO_FRAMES: usize = 5;
pub const DEMO_SIZE: usize = 64;
/// Sample prompts of the demo: the first clips' captions with their start frames.
pub const DEMO_SAMPLES: usize = 2;

/// The demo model's config: a small Wan-shaped DiT over the demo codec's 192-channel latents with 1×1×1 patches
/// (16×16 tokens a latent frame at 64×64 pixels), wide enough (256) that each token's 192 input values pass
/// through its residual stream next to a reference vector, with one attention head per frame of a latent frame's
/// slots, each carrying its frame's 48 values from where it looks in the start frame, and no q/k norms, so the
/// LoRA can sharpen where the heads look (see `demo::base`).
pub fn demo_model_config() -> WanConfig {
    WanConfig {
        in_dim: demo::codec::CHANNELS,
        out_dim: demo::codec::CHANNELS,
        dim: 256,
        ffn_dim: 512,
        num_heads: demo::codec::TEMPORAL,
        qk_norm: false,
        patch_size: [1, 1, 1],
        ..WanConfig::tiny(DEMO_LAYERS)
    }
}

/// The generated demo items: clips encoded with the demo codec, captions with the demo text embedding.
pub fn demo_items(cfg: &WanConfig, seed: u64, device: &Device) -> anyhow::Result<Vec<TrainItem>> {
    demo::shapes::generate(DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE, seed)
        .into_iter()
        .map(|clip| {
            Ok(TrainItem {
                key: clip.name.clone(),
                latents: demo::codec::encode(&clip.frames, device)?,
                context: demo::text::embed(&clip.caption, cfg.text_dim, cfg.text_len, device)?,
                image: None,
                clip: None,
            })
        })
        .collect()
}

/// The start frame's latent [16, 1, H/2, W/2] from an image of exactly `width`×`height` pixels.
fn start_frame(
    path: &Path,
    width: usize,
    height: usize,
    device: &Device,
) -> anyhow::Result<Tensor> {
    let image = load_start_image(path)?;
    let (w, h) = (image.width() as usize, image.height() as usize);
    if (w, h) != (width, height) {
        anyhow::bail!(
            "the start image is {w}x{h} but the sample is {width}x{height}: make them the same size: {}",
            path.display()
        );
    }
    let frame = RgbFrame {
        width: w,
        height: h,
        data: image.into_raw(),
    };
    Ok(demo::codec::encode(&[frame], device)?)
}

/// The demo model's sample prompts: the demo text embedding, and the `--i` start image through the demo codec.
pub fn demo_sample_prompts(
    specs: Vec<PromptSpec>,
    cfg: &WanConfig,
    device: &Device,
) -> anyhow::Result<Vec<SamplePrompt>> {
    let factor = demo::codec::FACTOR;
    let embed = |text: &str| demo::text::embed(text, cfg.text_dim, cfg.text_len, device);
    specs
        .into_iter()
        .map(|p| {
            let latent_shape = [
                cfg.out_dim,
                demo::codec::latent_frames(p.clip_frames().max(1)),
                (p.height / factor).max(2),
                (p.width / factor).max(2),
            ];
            let start_frame = p
                .image
                .as_deref()
                .map(|path| start_frame(path, p.width, p.height, device))
                .transpose()
                .with_context(|| format!("the start image of the sample \"{}\"", p.prompt))?;
            Ok(SamplePrompt {
                context: embed(&p.prompt)?,
                negative: p.negative.as_deref().map(embed).transpose()?,
                latent_shape,
                steps: p.steps,
                shift: p.clip_flow_shift(),
                guidance: p.clip_guidance(),
                seed: p.seed,
                prompt: p.prompt,
                image: start_frame.map(|latent| ImageConditioning::FirstFrame { latent }),
            })
        })
        .collect()
}

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
