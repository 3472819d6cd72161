//! FLUX.1 caching of a musubi-tuner image dataset: the autoencoder latents of every image (bucket sides in steps
//! of the autoencoder's down-sampling × the DiT's 2×2 packing: 16 pixels for FLUX.1) to
//! `{stem}_{W}x{H}_flux.safetensors`, and each caption's T5-XXL output and pooled CLIP-L vector to
//! `{stem}_flux_te.safetensors`. Caches already there are kept (a text cache only while its caption is
//! unchanged), stale FLUX.1 caches are removed unless asked not to, and Wan caches in the same folder are left
//! alone.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};

use crate::family::image::prep::{
    cache_latents, cache_text, start_latent_pass, CaptionCache, ImageLatents,
};
use crate::prep::{CacheOptions, CacheProgress, CacheSummary};
use framesmith_data::family::flux::cache::{write_flux_text_cache, FluxTextCache, FLUX_CACHES};
use framesmith_data::ValidConfig;
use framesmith_models::flux::autoencoder::AutoEncoder;
use framesmith_models::flux::text_encoder::{FluxTextEncoder, TextEncoderFiles};
use framesmith_models::flux::weights::{identify, load_autoencoder, FluxComponent};

use super::train::train_dit;
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

/// Writes the autoencoder latents of every image of the dataset config: `[16, 1, h, w]` of each image resized to
/// its bucket, scaled and shifted as the DiT takes them.
pub fn cache_flux_latents(
    valid: &ValidConfig,
    encoder: &FluxLatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let latents = ImageLatents {
        arch: &FLUX_CACHES,
        bucket_step: encoder.bucket_step(),
        device: &encoder.device,
        dtype: encoder.dtype,
        encode: &|image| encoder.ae.encode(image)?.transpose(0, 1),
    };
    cache_latents(valid, &latents, options, progress)
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
    let prefixes = ["t5_vec_", "clip_l_pooler_"];
    let mut write = |c: CaptionCache<'_>| -> anyhow::Result<()> {
        let (txt, vec) = encoder
            .encode(&[c.caption])
            .with_context(|| format!("encoding the caption of {}", c.media.display()))?;
        let cache = FluxTextCache {
            t5: txt.squeeze(0)?.to_dtype(dtype)?.to_device(&Device::Cpu)?,
            clip_l_pooler: vec.squeeze(0)?.to_dtype(dtype)?.to_device(&Device::Cpu)?,
            caption: c.caption.to_owned(),
        };
        Ok(write_flux_text_cache(c.path, &cache)?)
    };
    cache_text(
        valid,
        (&FLUX_CACHES, &prefixes, None),
        options,
        progress,
        &mut write,
    )
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
    let check_dit = |dit: &Path| train_dit(dit).map(drop);
    let (valid, device, dtype) =
        start_latent_pass((request, files), "FLUX.1's autoencoder", &check_dit, log)?;
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
