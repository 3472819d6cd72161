//! FLUX.1 caching of a musubi-tuner image dataset: the autoencoder latents of every image (bucket sides in steps
//! of the autoencoder's down-sampling × the DiT's 2×2 packing: 16 pixels for FLUX.1) to
//! `{stem}_{W}x{H}_flux.safetensors`, and each caption's T5-XXL output and pooled CLIP-L vector to
//! `{stem}_flux_te.safetensors`. Caches already there are kept (a text cache only while its caption is
//! unchanged), stale FLUX.1 caches are removed unless asked not to, and Wan caches in the same folder are left
//! alone.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use crate::prep::{
    cache_image_latents, frames_to_video, header, images_only, scan_all, CacheOptions,
    CacheProgress, CacheSummary, Expected, ItemOutcome,
};
use framesmith_data::cache::media_stem;
use framesmith_data::family::flux::cache::{
    flux_latent_cache_name, flux_text_cache_name, write_flux_latent_cache, write_flux_text_cache,
    FluxTextCache, FLUX_ARCHITECTURE,
};
use framesmith_data::probe::image_size;
use framesmith_data::samples::{cache_dir, image_sample};
use framesmith_data::{ResolvedDataset, ValidConfig};
use framesmith_models::flux::autoencoder::AutoEncoder;
use framesmith_models::flux::text_encoder::{FluxTextEncoder, TextEncoderFiles};
use framesmith_models::flux::weights::{identify, load_autoencoder, FluxComponent};

use super::train::dev_config;
use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles, TextFiles};

/// Side of the FLUX.1 DiT's square packing of latent pixels into tokens.
const PACK_SIDE: usize = 2;

/// The autoencoder side of FLUX.1 latent caching.
pub struct FluxLatentEncoder<'a> {
    pub ae: &'a AutoEncoder,
    /// Where the autoencoder's weights are.
    pub device: Device,
    /// Dtype the images are fed and the latents stored in.
    pub dtype: DType,
}

impl FluxLatentEncoder<'_> {
    /// Pixel multiple of every bucket side (16 for FLUX.1's autoencoder).
    pub fn bucket_step(&self) -> u32 {
        (self.ae.config().downsample_factor() * PACK_SIDE) as u32
    }
}

/// Whether `path` holds a complete FLUX.1 cache with these tensors and, for text caches, this `caption`.
fn cached(path: &std::path::Path, prefixes: &[&str], caption: Option<&str>) -> bool {
    header::complete_cache(path, prefixes, FLUX_ARCHITECTURE).is_some_and(|meta| {
        caption.is_none_or(|c| meta.get("caption1").map(String::as_str) == Some(c))
    })
}

/// Writes the autoencoder latents of every image of the dataset config.
pub fn cache_flux_latents(
    valid: &ValidConfig,
    encoder: &FluxLatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    images_only(valid, "FLUX.1")?;
    cache_image_latents(
        valid,
        (options, FLUX_ARCHITECTURE),
        progress,
        &mut |ds, media, expected| cache_image(ds, media, encoder, expected),
    )
}

/// Caches one image: latents `[16, 1, h, w]` of the image resized to its bucket, scaled and shifted as the DiT
/// takes them.
fn cache_image(
    ds: &ResolvedDataset,
    media: &std::path::Path,
    encoder: &FluxLatentEncoder,
    expected: &mut Expected,
) -> anyhow::Result<ItemOutcome> {
    let dir = cache_dir(ds, media);
    let stem = media_stem(media);
    if let Ok(size) = image_size(media) {
        let path = dir.join(flux_latent_cache_name(&stem, size));
        expected.file(&path);
        if cached(&path, &["latents_"], None) {
            return Ok(ItemOutcome::Skipped);
        }
    }
    // A file that does not decode is the item's failure; anything later (the autoencoder, the disk) stops the run.
    let sample = match image_sample(ds, media, encoder.bucket_step()) {
        Ok(sample) => sample,
        Err(e) => {
            expected.failed(ds, media);
            return Ok(ItemOutcome::Failed(e.reason()));
        }
    };
    let path = dir.join(flux_latent_cache_name(&stem, sample.original_size));
    expected.file(&path);
    let image = frames_to_video(&sample.frames, &encoder.device)?
        .squeeze(2)?
        .to_dtype(encoder.dtype)?;
    let latents = encoder
        .ae
        .encode(&image)?
        .transpose(0, 1)?
        .to_dtype(encoder.dtype)?
        .to_device(&Device::Cpu)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
    write_flux_latent_cache(&path, &latents, sample.original_size)?;
    Ok(ItemOutcome::Written(1))
}

/// Writes the T5-XXL output and pooled CLIP-L vector of every caption of the dataset config, stored in `dtype`.
/// Captions go one at a time, so a caption's cache does not depend on which others were cached with it.
pub fn cache_flux_text(
    valid: &ValidConfig,
    encoder: &FluxTextEncoder,
    dtype: DType,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    images_only(valid, "FLUX.1")?;
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, None, &mut summary, progress);
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let path =
                cache_dir(ds, &item.media).join(flux_text_cache_name(&media_stem(&item.media)));
            expected.file(&path);
            let outcome = match &item.caption {
                None => {
                    expected.failed(ds, &item.media);
                    ItemOutcome::Failed("no caption".into())
                }
                Some(caption) if cached(&path, &["t5_vec_", "clip_l_pooler_"], Some(caption)) => {
                    ItemOutcome::Skipped
                }
                Some(caption) => {
                    let (txt, vec) = encoder.encode(&[caption.as_str()]).with_context(|| {
                        format!("encoding the caption of {}", item.media.display())
                    })?;
                    let cache = FluxTextCache {
                        t5: txt.squeeze(0)?.to_dtype(dtype)?.to_device(&Device::Cpu)?,
                        clip_l_pooler: vec.squeeze(0)?.to_dtype(dtype)?.to_device(&Device::Cpu)?,
                        caption: caption.clone(),
                    };
                    write_flux_text_cache(&path, &cache)?;
                    ItemOutcome::Written(1)
                }
            };
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&format!("_{FLUX_ARCHITECTURE}_te.safetensors"))?;
    }
    Ok(summary)
}

/// T5 tokens per caption: FLUX.1 [dev] reads 512.
const DEV_T5_TOKENS: usize = 512;

/// Whether `path` is FLUX.1's autoencoder (so the latent pass caches for FLUX.1).
pub(super) fn is_flux_autoencoder(path: &Path) -> bool {
    identify(path).is_ok_and(|file| file.kind.component() == FluxComponent::Autoencoder)
}

/// The latent pass with FLUX.1's autoencoder.
pub(super) fn latents(
    request: &CacheRequest<'_>,
    files: &LatentFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    if files.i2v || files.clip.is_some() || files.tiled {
        anyhow::bail!(
            "--i2v, --clip and --tiled are for Wan VAEs; FLUX.1's autoencoder caches images as they are: drop them"
        );
    }
    if let Some(dit) = &files.dit {
        dev_config(dit)?;
    }
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    let ae = load_autoencoder(&files.vae, dtype, &device)?;
    log(&format!(
        "autoencoder: FLUX.1, {} latent channels, on {device:?} in {dtype:?}",
        ae.config().z_channels
    ));
    let encoder = FluxLatentEncoder {
        ae: &ae,
        device: device.clone(),
        dtype,
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_flux_latents(&valid, &encoder, &options, progress)
}

/// The text pass with CLIP-L (`files.clip_text`) and T5-XXL (`files.text_encoder`).
pub(super) fn text(
    request: &CacheRequest<'_>,
    files: &TextFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let (Some(clip), Some(t5)) = (&files.clip_text, &files.text_encoder) else {
        anyhow::bail!("FLUX.1's captions cache with both text encoders: give --clip-l and --t5");
    };
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    let encoder_files = TextEncoderFiles {
        clip,
        clip_tokenizer: files.clip_tokenizer.as_deref(),
        t5,
        t5_tokenizer: files.tokenizer.as_deref(),
        t5_max_tokens: DEV_T5_TOKENS,
    };
    let encoder = FluxTextEncoder::load(encoder_files, dtype, &device).with_context(|| {
        format!(
            "loading the FLUX.1 text encoders {} and {}",
            clip.display(),
            t5.display()
        )
    })?;
    log(&format!(
        "text encoders: CLIP-L and T5-XXL on {device:?} in {dtype:?}"
    ));
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_flux_text(&valid, &encoder, dtype, &options, progress)
}

#[cfg(test)]
mod tests;
