//! Wan's cache passes: the VAE's latents of every image and clip (with the first frame's conditioning and CLIP
//! features for image-to-video models, as `--dit` or `--i2v` / `--clip` ask) and umT5's embeddings of every caption,
//! with the VAE checked against the DiT before anything is encoded.

use std::path::PathBuf;

use anyhow::Context;
use candle_core::DType;
use framesmith_data::media::{MediaTools, FFMPEG_INSTALL_HINT};
use framesmith_data::DatasetKind;
use framesmith_models::wan::clip::{load_clip_vision, ClipVisionConfig};
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats, TileConfig, VaeConfig};
use framesmith_models::wan::{weights, ModelType};

use super::latents::{cache_latents, ImageParts, LatentEncoder};
use super::text_cache::cache_text;
use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles, TextFiles};
use crate::prep::{CacheOptions, CacheProgress, CacheSummary};

/// The latent pass with a Wan VAE.
pub(super) fn latents(
    request: &CacheRequest<'_>,
    files: &LatentFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let valid = load_dataset(request, log)?;
    let wanted = image_parts_wanted(files, log)?;
    let tools = MediaTools::locate().ok();
    if tools.is_none()
        && valid
            .datasets
            .iter()
            .any(|d| d.kind() == DatasetKind::Video)
    {
        log(&format!(
            "warning: ffmpeg was not found, so video files cannot be decoded; {FFMPEG_INSTALL_HINT}"
        ));
    }
    let (device, dtype) = (request.open)()?;
    let vae = load_vae_auto(&files.vae, dtype, &device)?;
    check_vae_fits_dit(files, vae.config().z_dim)?;
    let stats = LatentStats::official(vae.config().variant, &device)?;
    log(&format!(
        "VAE: {:?}, {} latent channels, on {device:?} in {dtype:?}",
        vae.config().variant,
        vae.config().z_dim
    ));
    let clip = match &wanted {
        Wanted::LatentsAndClip(path) => {
            // musubi-tuner runs CLIP in float16; the CPU computes in f32.
            let clip_dtype = if device.is_cuda() {
                DType::F16
            } else {
                DType::F32
            };
            let clip = load_clip_vision(path, &ClipVisionConfig::vit_h_14(), clip_dtype, &device)
                .with_context(|| {
                format!("loading the CLIP image encoder {}", path.display())
            })?;
            log("image-to-video: caching the first frame's conditioning and CLIP features");
            Some(clip)
        }
        Wanted::Latents => {
            log("image-to-video: caching the first frame's conditioning");
            None
        }
        Wanted::None => None,
    };
    let image = match (&wanted, &clip) {
        (Wanted::LatentsAndClip(_), Some(clip)) => ImageParts::LatentsAndClip(clip),
        (Wanted::Latents, _) => ImageParts::Latents,
        _ => ImageParts::None,
    };
    let encoder = LatentEncoder {
        vae: &vae,
        stats: &stats,
        device: device.clone(),
        dtype,
        tiles: files.tiled.then(TileConfig::default),
        image,
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_latents(&valid, tools.as_ref(), &encoder, &options, progress)
}

/// What image-to-video conditioning the latent pass writes.
enum Wanted {
    None,
    Latents,
    LatentsAndClip(PathBuf),
}

/// The image-to-video parts to cache, from `--dit` (its header says which model it is) or, without it, from
/// `--i2v` / `--clip` as musubi-tuner's `wan_cache_latents.py` takes them. A flag the DiT contradicts, or a
/// Wan2.1 I2V DiT without `--clip`, is an error that says what to change.
fn image_parts_wanted(files: &LatentFiles, log: &mut dyn FnMut(&str)) -> anyhow::Result<Wanted> {
    let Some(dit) = &files.dit else {
        return Ok(match (&files.clip, files.i2v) {
            (Some(clip), _) => Wanted::LatentsAndClip(clip.clone()),
            (None, true) => Wanted::Latents,
            (None, false) => Wanted::None,
        });
    };
    let report = weights::inspect(dit)?;
    let name = weights::variant_name(&report.config, report.expert);
    let cfg = &report.config;
    if cfg.model_type == ModelType::Ti2v {
        if files.i2v || files.clip.is_some() {
            log(&format!(
                "note: {name} trains image-to-video (training.mode = \"image_to_video\") from the first latent frame \
                 of each clip's own latents, so its caches hold latents only; --i2v and --clip are not used"
            ));
        }
        return Ok(Wanted::None);
    }
    if cfg.model_type != ModelType::I2v {
        if files.i2v || files.clip.is_some() {
            anyhow::bail!(
                "{name} is not an image-to-video model, so it takes no image conditioning: drop --i2v and --clip, \
                 or give the I2V DiT: {}",
                dit.display()
            );
        }
        return Ok(Wanted::None);
    }
    match (&files.clip, cfg.has_clip()) {
        (Some(clip), true) => Ok(Wanted::LatentsAndClip(clip.clone())),
        (None, true) => anyhow::bail!(
            "{name} takes CLIP image features of each clip's first frame: add --clip \
             models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (or ComfyUI's clip_vision_h.safetensors)"
        ),
        (Some(_), false) => {
            log(&format!(
                "note: {name} has no CLIP image input; --clip is not used"
            ));
            Ok(Wanted::Latents)
        }
        (None, false) => Ok(Wanted::Latents),
    }
}

/// With `--dit`, refuses a VAE of `z_dim` channels that the DiT does not denoise (the Wan2.1 VAE for TI2V-5B, or
/// the Wan2.2 VAE for the others) before anything is encoded.
fn check_vae_fits_dit(files: &LatentFiles, z_dim: usize) -> anyhow::Result<()> {
    let Some(dit) = &files.dit else {
        return Ok(());
    };
    let report = weights::inspect(dit)?;
    if report.config.out_dim == z_dim {
        return Ok(());
    }
    let wanted = if report.config.out_dim == VaeConfig::wan22().z_dim {
        "Wan2.2_VAE.pth"
    } else {
        "Wan2.1_VAE.pth"
    };
    anyhow::bail!(
        "the VAE makes {z_dim}-channel latents but {} denoises {}: cache with the VAE made for it ({wanted}): {}",
        weights::variant_name(&report.config, report.expert),
        report.config.out_dim,
        files.vae.display()
    )
}

/// The text pass with umT5.
pub(super) fn text(
    request: &CacheRequest<'_>,
    files: &TextFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let Some(text_encoder) = &files.text_encoder else {
        anyhow::bail!("give --text-encoder (Wan's umT5), or --clip-l and --t5 (FLUX.1)");
    };
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    let encoder = TextEncoder::load(text_encoder, files.tokenizer.as_deref(), dtype, &device)
        .with_context(|| format!("loading the text encoder {}", text_encoder.display()))?;
    log(&format!(
        "text encoder: {} layers, width {}, on {device:?} in {dtype:?}",
        encoder.encoder.config().num_layers,
        encoder.encoder.config().dim
    ));
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_text(&valid, None, &encoder, dtype, &options, progress)
}
