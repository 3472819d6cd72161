//! `framesmith cache latents` and `cache text` for FLUX.1: given FLUX.1's autoencoder (`--vae ae.safetensors`) the
//! images of the dataset are cached as `_flux` latents; given CLIP-L and T5-XXL (`--clip-l`, `--t5`) the captions
//! are cached as `_flux_te` text caches. Wan caches in the same folders are left alone.

use std::path::Path;

use anyhow::Context;
use framesmith_engine::family::flux::prep::{
    cache_flux_latents, cache_flux_text, FluxLatentEncoder,
};
use framesmith_engine::family::flux::train::dev_config;
use framesmith_engine::prep::CacheOptions;
use framesmith_models::flux::text_encoder::{FluxTextEncoder, TextEncoderFiles};
use framesmith_models::flux::weights::{identify, load_autoencoder, FluxComponent};

use super::{dataset, report, reporter, LatentArgs, TextArgs};
use crate::cli::models::{open_device, pick_dtype};

/// T5 tokens per caption: FLUX.1 [dev] reads 512.
const DEV_T5_TOKENS: usize = 512;

/// Whether `path` is FLUX.1's autoencoder (so `cache latents` caches for FLUX.1).
pub(super) fn is_flux_autoencoder(path: &Path) -> bool {
    identify(path).is_ok_and(|file| file.kind.component() == FluxComponent::Autoencoder)
}

/// `cache latents` with FLUX.1's autoencoder.
pub(super) fn latents(args: &LatentArgs) -> anyhow::Result<()> {
    if args.i2v || args.clip.is_some() || args.tiled {
        anyhow::bail!(
            "--i2v, --clip and --tiled are for Wan VAEs; FLUX.1's autoencoder caches images as they are: drop them"
        );
    }
    if let Some(dit) = &args.dit {
        dev_config(dit)?;
    }
    let valid = dataset(&args.dataset)?;
    let device = open_device(args.device)?;
    let dtype = pick_dtype(args.dtype, &device)?;
    let ae = load_autoencoder(&args.vae, dtype, &device)?;
    eprintln!(
        "autoencoder: FLUX.1, {} latent channels, on {device:?} in {dtype:?}",
        ae.config().z_channels
    );
    let encoder = FluxLatentEncoder {
        ae: &ae,
        device: device.clone(),
        dtype,
    };
    let options = CacheOptions {
        keep_stale: args.keep_stale,
    };
    let mut progress = reporter();
    let summary = cache_flux_latents(&valid, &encoder, &options, &mut progress)?;
    progress.bar.finish_and_clear();
    report(&summary);
    Ok(())
}

/// `cache text` with CLIP-L (`clip`) and T5-XXL (`t5`).
pub(super) fn text(args: &TextArgs, clip: &Path, t5: &Path) -> anyhow::Result<()> {
    let valid = dataset(&args.dataset)?;
    let device = open_device(args.device)?;
    let dtype = pick_dtype(args.dtype, &device)?;
    let files = TextEncoderFiles {
        clip,
        clip_tokenizer: args.clip_l_tokenizer.as_deref(),
        t5,
        t5_tokenizer: args.tokenizer.as_deref(),
        t5_max_tokens: DEV_T5_TOKENS,
    };
    let encoder = FluxTextEncoder::load(files, dtype, &device).with_context(|| {
        format!(
            "loading the FLUX.1 text encoders {} and {}",
            clip.display(),
            t5.display()
        )
    })?;
    eprintln!("text encoders: CLIP-L and T5-XXL on {device:?} in {dtype:?}");
    let options = CacheOptions {
        keep_stale: args.keep_stale,
    };
    let mut progress = reporter();
    let summary = cache_flux_text(&valid, &encoder, dtype, &options, &mut progress)?;
    progress.bar.finish_and_clear();
    report(&summary);
    Ok(())
}
