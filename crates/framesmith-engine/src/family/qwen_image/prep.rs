//! Qwen-Image caching of a musubi-tuner image dataset: the VAE's normalised latents of every image (bucket sides in
//! steps of 16 pixels: the VAE's 8 × the 2×2 packing) to `{stem}_{W}x{H}_qi.safetensors`, and each caption's
//! Qwen2.5-VL hidden states through the text-encoder seam ([`super::encoder`]) to `{stem}_qi_te.safetensors`, as
//! musubi-tuner names and keys them; an edit item's caption is encoded with its control images by the vision tower
//! as Qwen-Image-Edit's pipelines do, its cache recording them. Caches already there are kept (a text cache only
//! while its caption and control images are unchanged), stale Qwen-Image caches are removed unless asked not to,
//! other families' caches are left alone.
//! A latent pass is Qwen-Image's when `--dit` names a Qwen-Image transformer or the VAE is in diffusers' names
//! (ComfyUI's `qwen_image_vae.safetensors` has Wan 2.1's names and tensors); a text pass when the text encoder is
//! Qwen2.5-VL.

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::edit::{edit_pipeline_of, edit_tag};
use super::encoder::{
    encode_each, load_edit_encoder, load_encoder, EditPromptEncoder, EncoderFiles, PromptEncoder,
};
use super::train::{dit_config, is_qwen_image_file};
use crate::family::image::prep::{
    cache_latents, cache_text, start_latent_pass, CaptionCache, ImageLatents,
};
use crate::prep::pass::{load_dataset, CacheRequest, LatentFiles, TextFiles};
use crate::prep::{CacheOptions, CacheProgress, CacheSummary};
use framesmith_data::control::DatasetControls;
use framesmith_data::family::qwen_image::cache::{
    write_qwen_text_cache_with_controls, QwenTextCache, QWEN_IMAGE_CACHES,
};
use framesmith_data::ValidConfig;
use framesmith_models::qwen25vl::EditPipeline;
use framesmith_models::qwen_image::vae::{is_diffusers_layout, load_vae, QwenImageVae};
pub(super) use framesmith_models::qwen_image::weights::is_qwen25_vl as is_qwen_text_encoder;

/// Pixel multiple of every bucket side: the VAE's 8 × the 2×2 packing.
pub const BUCKET_STEP: u32 = 16;

/// Whether the latent pass `files` caches for Qwen-Image.
pub(super) fn is_qwen_latent_pass(files: &LatentFiles) -> bool {
    files.dit.as_deref().is_some_and(is_qwen_image_file) || is_diffusers_layout(&files.vae)
}

/// The VAE side of latent caching: the VAE on `device`, images fed and latents stored in `dtype`.
pub struct QwenLatentEncoder<'a> {
    pub vae: &'a QwenImageVae,
    pub device: Device,
    pub dtype: DType,
}

/// Writes the VAE latents of every image of the dataset config: the normalised latents `[16, 1, h, w]` of each
/// image resized to its bucket.
pub fn cache_qwen_latents(
    valid: &ValidConfig,
    encoder: &QwenLatentEncoder,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let latents = ImageLatents {
        arch: &QWEN_IMAGE_CACHES,
        bucket_step: BUCKET_STEP,
        device: &encoder.device,
        dtype: encoder.dtype,
        encode: &|image| encoder.vae.encode(image)?.squeeze(0),
    };
    cache_latents(valid, &latents, options, progress)
}

/// The text pass's encoder: the language model alone (Qwen-Image), or with its vision tower (Qwen-Image-Edit) so that
/// an item with control images is encoded with them, as the edit pipelines encode a prompt.
#[derive(Clone, Copy)]
pub enum CaptionEncoder<'a> {
    Text(&'a dyn PromptEncoder),
    Edit(&'a dyn EditPromptEncoder),
}

/// Writes each caption's hidden states through `encoder`, stored in `dtype`, one caption at a time (so a caption's
/// cache does not depend on which others were cached with it); through an edit encoder, an item with control
/// images is encoded with them and its cache records them (the pipeline and their contents), so it is encoded
/// again when they change.
pub fn cache_qwen_text(
    valid: &ValidConfig,
    encoder: CaptionEncoder<'_>,
    dtype: DType,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let mut write = |c: CaptionCache<'_>| -> anyhow::Result<()> {
        let embed = match encoder {
            CaptionEncoder::Edit(edit) if !c.controls.is_empty() => edit
                .encode_edit(c.caption, c.controls)
                .and_then(|e| Ok(e.to_dtype(dtype)?)),
            CaptionEncoder::Edit(edit) => one_prompt(edit, c.caption, dtype),
            CaptionEncoder::Text(text) => one_prompt(text, c.caption, dtype),
        }
        .with_context(|| format!("encoding the caption of {}", c.media.display()))?;
        let cache = QwenTextCache {
            vl_embed: embed.to_device(&Device::Cpu)?,
            caption: c.caption.to_owned(),
        };
        Ok(write_qwen_text_cache_with_controls(
            c.path, &cache, c.stamp,
        )?)
    };
    let tag = match encoder {
        CaptionEncoder::Edit(edit) => Some(edit_tag(edit.pipeline())),
        CaptionEncoder::Text(_) => None,
    };
    let prefixes = ["varlen_vl_embed_"];
    cache_text(
        valid,
        (&QWEN_IMAGE_CACHES, &prefixes, tag),
        options,
        progress,
        &mut write,
    )
}

/// One prompt's valid tokens' hidden states [L, D] in `dtype`.
fn one_prompt(encoder: &dyn PromptEncoder, prompt: &str, dtype: DType) -> anyhow::Result<Tensor> {
    encode_each(encoder, &[prompt], dtype)?
        .pop()
        .context("the text encoder returned no prompt")
}

/// The latent pass with Qwen-Image's VAE.
pub(super) fn latents(
    request: &CacheRequest<'_>,
    files: &LatentFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let check_dit = |dit: &std::path::Path| dit_config(dit).map(drop);
    let (valid, device, dtype) =
        start_latent_pass((request, files), "Qwen-Image", &check_dit, log)?;
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

/// The text pass with Qwen2.5-VL (`files.text_encoder`): through [`load_encoder`], or, when a dataset has control
/// images, [`load_edit_encoder`] for the pipeline `files.dit` says ([`edit_pipeline_of`]).
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
    let mut edit = false;
    for ds in valid.all_datasets() {
        edit |= DatasetControls::find(ds)?.any();
    }
    let (device, dtype) = (request.open)()?;
    let encoder_files = EncoderFiles {
        weights,
        tokenizer: files.tokenizer.as_deref(),
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    if !edit {
        let encoder = load_encoder(encoder_files, dtype, &device)?;
        log(&format!(
            "text encoder: {} on {device:?}, computing in {dtype:?}",
            encoder.describe()
        ));
        return cache_qwen_text(
            &valid,
            CaptionEncoder::Text(encoder.as_ref()),
            dtype,
            &options,
            progress,
        );
    }
    let pipeline = edit_pipeline_of(files.dit.as_deref());
    let encoder = load_edit_encoder(encoder_files, pipeline, dtype, &device)?;
    log(&format!(
        "text encoder: {} on {device:?}, computing in {dtype:?}; captions with control images are encoded with \
         them as Qwen-Image-Edit{}'s pipeline does{}",
        encoder.describe(),
        match pipeline {
            EditPipeline::Edit => "",
            EditPipeline::EditPlus => "-2509",
        },
        if files.dit.is_none() { " (give --dit to follow your DiT's)" } else { "" }
    ));
    cache_qwen_text(
        &valid,
        CaptionEncoder::Edit(encoder.as_ref()),
        dtype,
        &options,
        progress,
    )
}
