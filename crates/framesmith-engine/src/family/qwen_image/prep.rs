//! Qwen-Image caching of a musubi-tuner image dataset: the VAE's normalised latents of every image (bucket sides in
//! steps of 16 pixels: the VAE's 8 × the 2×2 packing) to `{stem}_{W}x{H}_qi.safetensors`, and each caption's
//! Qwen2.5-VL hidden states through the text-encoder seam ([`super::encoder`]) to `{stem}_qi_te.safetensors`, as
//! musubi-tuner names and keys them. Caches already there are kept (a text cache only while its caption is
//! unchanged), stale Qwen-Image caches are removed unless asked not to, other families' caches are left alone.
//! A latent pass is Qwen-Image's when `--dit` names a Qwen-Image transformer or the VAE is in diffusers' names
//! (ComfyUI's `qwen_image_vae.safetensors` has Wan 2.1's names and tensors); a text pass when the text encoder is
//! Qwen2.5-VL.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use super::encoder::{encode_each, load_encoder, EncoderFiles, PromptEncoder};
use super::train::{dit_config, is_qwen_image_file};
use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles, TextFiles};
use crate::prep::{
    cache_image_latents, frames_to_video, header, images_only, scan_all, CacheOptions,
    CacheProgress, CacheSummary, Expected, ItemOutcome,
};
use framesmith_data::cache::media_stem;
use framesmith_data::family::qwen_image::cache::{
    qwen_latent_cache_name, qwen_text_cache_name, write_qwen_latent_cache, write_qwen_text_cache,
    QwenTextCache, QWEN_IMAGE_ARCHITECTURE, QWEN_IMAGE_SUFFIX,
};
use framesmith_data::probe::image_size;
use framesmith_data::samples::{cache_dir, image_sample};
use framesmith_data::{ResolvedDataset, ValidConfig};
use framesmith_models::qwen_image::vae::{is_diffusers_layout, load_vae, QwenImageVae};
pub(super) use framesmith_models::qwen_image::weights::is_qwen25_vl as is_qwen_text_encoder;

/// Pixel multiple of every bucket side: the VAE's 8 × the 2×2 packing.
pub const BUCKET_STEP: u32 = 16;

/// Whether the latent pass `files` caches for Qwen-Image.
pub(super) fn is_qwen_latent_pass(files: &LatentFiles) -> bool {
    files.dit.as_deref().is_some_and(is_qwen_image_file) || is_diffusers_layout(&files.vae)
}

/// Whether `path` holds a complete Qwen-Image cache with these tensors and, for text caches, this `caption`.
fn cached(path: &Path, prefixes: &[&str], caption: Option<&str>) -> bool {
    header::complete_cache(path, prefixes, QWEN_IMAGE_ARCHITECTURE).is_some_and(|meta| {
        caption.is_none_or(|c| meta.get("caption1").map(String::as_str) == Some(c))
    })
}

/// The VAE side of latent caching: the VAE on `device`, images fed and latents stored in `dtype`.
pub struct QwenLatentEncoder<'a> {
    pub vae: &'a QwenImageVae,
    pub device: Device,
    pub dtype: DType,
}

/// Writes the VAE latents of every image of the dataset config.
pub fn cache_qwen_latents(
    valid: &ValidConfig,
    encoder: &QwenLatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    images_only(valid, "Qwen-Image")?;
    cache_image_latents(
        valid,
        (options, QWEN_IMAGE_SUFFIX),
        progress,
        &mut |ds, media, expected| cache_image(ds, media, encoder, expected),
    )
}

/// Caches one image: the normalised latents `[16, 1, h, w]` of the image resized to its bucket.
fn cache_image(
    ds: &ResolvedDataset,
    media: &Path,
    encoder: &QwenLatentEncoder,
    expected: &mut Expected,
) -> anyhow::Result<ItemOutcome> {
    let dir = cache_dir(ds, media);
    let stem = media_stem(media);
    if let Ok(size) = image_size(media) {
        let path = dir.join(qwen_latent_cache_name(&stem, size));
        expected.file(&path);
        if cached(&path, &["latents_"], None) {
            return Ok(ItemOutcome::Skipped);
        }
    }
    // A file that does not decode is the item's failure; anything later (the VAE, the disk) stops the run.
    let sample = match image_sample(ds, media, BUCKET_STEP) {
        Ok(sample) => sample,
        Err(e) => {
            expected.failed(ds, media);
            return Ok(ItemOutcome::Failed(e.reason()));
        }
    };
    let path = dir.join(qwen_latent_cache_name(&stem, sample.original_size));
    expected.file(&path);
    let image = frames_to_video(&sample.frames, &encoder.device)?
        .squeeze(2)?
        .to_dtype(encoder.dtype)?;
    let latents = encoder
        .vae
        .encode(&image)?
        .squeeze(0)?
        .to_dtype(encoder.dtype)?
        .to_device(&Device::Cpu)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
    write_qwen_latent_cache(&path, &latents, sample.original_size)?;
    Ok(ItemOutcome::Written(1))
}

/// Writes each caption's hidden states through `encoder`, stored in `dtype`, one caption at a time (so a caption's
/// cache does not depend on which others were cached with it).
pub fn cache_qwen_text(
    valid: &ValidConfig,
    encoder: &dyn PromptEncoder,
    dtype: DType,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    images_only(valid, "Qwen-Image")?;
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, None, &mut summary, progress);
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let path =
                cache_dir(ds, &item.media).join(qwen_text_cache_name(&media_stem(&item.media)));
            expected.file(&path);
            let outcome = match &item.caption {
                None => {
                    expected.failed(ds, &item.media);
                    ItemOutcome::Failed("no caption".into())
                }
                Some(caption) if cached(&path, &["varlen_vl_embed_"], Some(caption)) => {
                    ItemOutcome::Skipped
                }
                Some(caption) => {
                    let embed = encode_each(encoder, &[caption.as_str()], dtype)
                        .with_context(|| {
                            format!("encoding the caption of {}", item.media.display())
                        })?
                        .remove(0);
                    let cache = QwenTextCache {
                        vl_embed: embed.to_device(&Device::Cpu)?,
                        caption: caption.clone(),
                    };
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir).with_context(|| {
                            format!("cannot create the cache directory {}", dir.display())
                        })?;
                    }
                    write_qwen_text_cache(&path, &cache)?;
                    ItemOutcome::Written(1)
                }
            };
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&format!("_{QWEN_IMAGE_SUFFIX}_te.safetensors"))?;
    }
    Ok(summary)
}

/// The latent pass with Qwen-Image's VAE.
pub(super) fn latents(
    request: &CacheRequest<'_>,
    files: &LatentFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    if files.i2v || files.clip.is_some() || files.tiled {
        anyhow::bail!(
            "--i2v, --clip and --tiled are for Wan's video caches; Qwen-Image caches images as they are: drop them"
        );
    }
    if let Some(dit) = &files.dit {
        dit_config(dit)?;
    }
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    let vae = load_vae(&files.vae, dtype, &device)?;
    log(&format!(
        "VAE: Qwen-Image, 16 latent channels, on {device:?} in {dtype:?}"
    ));
    let encoder = QwenLatentEncoder {
        vae: &vae,
        device: device.clone(),
        dtype,
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_qwen_latents(&valid, &encoder, &options, progress)
}

/// The text pass with Qwen2.5-VL (`files.text_encoder`), through [`load_encoder`].
pub(super) fn text(
    request: &CacheRequest<'_>,
    files: &TextFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let Some(weights) = &files.text_encoder else {
        anyhow::bail!("Qwen-Image's captions cache with its text encoder: give --text-encoder qwen_2.5_vl_7b.safetensors");
    };
    if files.clip_text.is_some() {
        anyhow::bail!("Qwen-Image conditions on Qwen2.5-VL alone: drop --clip-l");
    }
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    let encoder_files = EncoderFiles {
        weights,
        tokenizer: files.tokenizer.as_deref(),
    };
    let encoder = load_encoder(encoder_files, dtype, &device)?;
    log(&format!(
        "text encoder: {} on {device:?}, computing in {dtype:?}",
        encoder.describe()
    ));
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_qwen_text(&valid, encoder.as_ref(), dtype, &options, progress)
}
