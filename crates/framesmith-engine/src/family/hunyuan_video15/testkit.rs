//! A tiny HunyuanVideo 1.5 for CPU tests: a transformer of the official layout at small sizes with seeded random
//! weights (4 latent channels, text width 24, glyph width 12), and a video dataset cached in musubi-tuner's `_hv15`
//! format (written by the data crate's writers, as `hv_1_5_cache_latents.py` and
//! `hv_1_5_cache_text_encoder_outputs.py` name and key them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use framesmith_data::family::hunyuan_video15::cache::{
    hv15_latent_cache_name, hv15_text_cache_name, write_hv15_latent_cache, write_hv15_text_cache,
    Hv15LatentCache, Hv15TextCache,
};
use framesmith_data::frames::FrameWindow;
use framesmith_models::hunyuan_video15::weights::official_shapes;
use framesmith_models::hunyuan_video15::HunyuanVideo15Config;
use framesmith_nn::init::randn;

use crate::family::testkit::run::cached_video_dataset_toml;

/// The tiny transformer's sizes: 2 blocks of width 32 (2 heads of 16), one refiner block, 4 latent channels
/// (9 input channels: noisy, condition, mask), text width 24, glyph width 12.
pub fn tiny_config() -> HunyuanVideo15Config {
    HunyuanVideo15Config {
        in_channels: 9,
        out_channels: 4,
        num_attention_heads: 2,
        attention_head_dim: 16,
        num_layers: 2,
        num_refiner_layers: 1,
        text_embed_dim: 24,
        text_embed_2_dim: 12,
        byt5_hidden_dim: 16,
        image_embed_dim: 8,
        rope_axes_dim: vec![4, 6, 6],
        ..HunyuanVideo15Config::hunyuan_video15()
    }
}

/// The tiny transformer written into `dir` as one safetensors file of official names (seeded: the same weights
/// every time); norm scales are ones and norm shifts zeros.
pub fn tiny_dit(dir: &Path) -> anyhow::Result<PathBuf> {
    let rng = &mut StdRng::seed_from_u64(5);
    let mut tensors = HashMap::new();
    for (name, shape) in official_shapes(&tiny_config()) {
        let shape = shape.as_slice();
        let t = match (name.contains("norm"), name.ends_with(".weight")) {
            (true, true) => Tensor::ones(shape, DType::F32, &Device::Cpu)?,
            (true, false) => Tensor::zeros(shape, DType::F32, &Device::Cpu)?,
            _ => randn(rng, shape, 0.0, 0.2, &Device::Cpu)?,
        };
        tensors.insert(name, t);
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("hunyuanvideo1.5_tiny.safetensors");
    candle_core::safetensors::save(&tensors, &path)?;
    Ok(path)
}

/// The condition channels musubi-tuner caches for I2V from `latents` [C, F, H, W]: the first frame's latents
/// followed by zeros, then the mask (1 on the first frame) — [C + 1, F, H, W].
fn first_frame(latents: &Tensor) -> anyhow::Result<Tensor> {
    let (c, f, h, w) = latents.dims4()?;
    let dev = latents.device();
    let zeros =
        |channels: usize, frames: usize| Tensor::zeros((channels, frames, h, w), DType::F32, dev);
    let cond = Tensor::cat(&[&latents.narrow(1, 0, 1)?, &zeros(c, f - 1)?], 1)?;
    let mask = Tensor::cat(
        &[
            &Tensor::ones((1, 1, h, w), DType::F32, dev)?,
            &zeros(1, f - 1)?,
        ],
        1,
    )?;
    Ok(Tensor::cat(&[&cond, &mask], 0)?)
}

/// The items of [`dataset`]: stem, caption words (Qwen2.5-VL tokens) and quoted glyph tokens.
const ITEMS: [(&str, usize, usize); 3] = [("a", 3, 0), ("b", 5, 0), ("c", 4, 2)];

/// A musubi-tuner video dataset in `dir` (no videos: only its `_hv15` caches in `cache/`, three clips of 9 frames
/// at 64×64 — latents [4, 3, 4, 4] — the third caption quoting glyph text; with `i2v` also each clip's first-frame
/// latents and mask [5, 3, 4, 4] and 6 SigLIP-like tokens), batch size `batch_size`; returns its TOML.
pub fn dataset(dir: &Path, batch_size: usize, i2v: bool) -> anyhow::Result<PathBuf> {
    dataset_for(dir, batch_size, i2v, &tiny_config())
}

/// [`dataset`] with the text widths of the transformer `cfg`.
pub fn dataset_for(
    dir: &Path,
    batch_size: usize,
    i2v: bool,
    cfg: &HunyuanVideo15Config,
) -> anyhow::Result<PathBuf> {
    let cache = dir.join("cache");
    let rng = &mut StdRng::seed_from_u64(17);
    let dev = Device::Cpu;
    let window = FrameWindow {
        start: 0,
        frames: 9,
    };
    for (stem, words, glyphs) in ITEMS {
        let latents = randn(rng, (cfg.out_channels, 3, 4, 4), 0.0, 1.0, &dev)?;
        let (latents_image, siglip) = if i2v {
            (
                Some(first_frame(&latents)?),
                Some(randn(rng, (6, cfg.image_embed_dim), 0.0, 1.0, &dev)?),
            )
        } else {
            (None, None)
        };
        let latents = Hv15LatentCache {
            latents: latents.to_dtype(DType::BF16)?,
            latents_image,
            siglip,
        };
        let name = hv15_latent_cache_name(stem, Some(window), (64, 64));
        write_hv15_latent_cache(&cache.join(name), &latents, (64, 64), Some(9))?;
        let text = Hv15TextCache {
            vl_embed: randn(rng, (words, cfg.text_embed_dim), 0.0, 1.0, &dev)?,
            byt5_embed: randn(rng, (glyphs, cfg.text_embed_2_dim), 0.0, 1.0, &dev)?,
            caption: format!("clip {stem}"),
        };
        write_hv15_text_cache(&cache.join(hv15_text_cache_name(stem)), &text)?;
    }
    cached_video_dataset_toml(dir, (64, 64, 9), batch_size)
}
