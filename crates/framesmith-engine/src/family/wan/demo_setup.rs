//! The demo model's run (demo only), a tiny Wan: its config, its generated training clips and its sample prompts.
//! The demo model is image-to-video: each clip's first frame is given (in training and in samples, through `--i`)
//! and the model learns to move the shape the way the caption says.

use std::path::Path;

use anyhow::Context;
use candle_core::{Device, Tensor};

use crate::demo;
use crate::demo::project::{DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE};
use crate::demo::shapes::DemoClip;
use crate::family::wan::denoise::ImageConditioning;
use crate::family::wan::samples::SamplePrompt;
use crate::family::wan::start_image::load_start_image;
use crate::generate::prompts::PromptSpec;
use crate::train::data::TrainItem;
use framesmith_data::cache::{
    text_cache_name, video_latent_cache_name, write_wan_latent_cache, write_wan_text_cache,
    LatentCacheMetadata, WanLatentCache, CACHE_FORMAT_VERSION, WAN_ARCHITECTURE,
};
use framesmith_data::frames::FrameWindow;
use framesmith_data::video::encode::RgbFrame;
use framesmith_models::wan::WanConfig;

/// Layers of the demo model.
pub const DEMO_LAYERS: usize = 2;
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
                control: Vec::new(),
                second_text: None,
                audio: None,
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

/// Writes one demo clip's latent and text caches into `cache` in musubi-tuner's Wan format (through the demo
/// codec and the demo text embedding).
pub fn write_demo_caches(cache: &Path, clip: &DemoClip) -> anyhow::Result<()> {
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
