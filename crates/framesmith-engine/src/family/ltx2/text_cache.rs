//! LTX-2 caching of a dataset's captions: each caption through Gemma 3 12B, the checkpoint's feature extractor and
//! video connector ([`super::encoder`]) to `{stem}_ltx2_te.safetensors` in the format of musubi-tuner's LTX-2
//! branch, which the LTX-2 run reads: `video_prompt_embeds_{dtype}` [1024, D] (the connector's output: D is 3840 for
//! LTX-2, the transformer's 4096 for LTX-2.3) with `prompt_attention_mask` [1024] and the caption as `caption1`.
//! A cache is kept while its caption and the release that encoded it are unchanged; stale `_ltx2_te` caches are
//! removed unless asked not to. A text pass is LTX-2's when `--dit` names an LTX-2 checkpoint (which holds the
//! connector).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::encoder::{encode_texts_for, load_gemma, Ltx2EncoderFiles, Ltx2Text};
use super::train::is_ltx2_file;
use crate::family::image::caption_pass::{cache_captions, CaptionCaches, PendingCaption};
use crate::prep::pass::{load_dataset, CacheRequest, TextFiles};
use crate::prep::{header, CacheOptions, CacheProgress, CacheSummary};
use framesmith_data::family::ltx2::cache::{
    ltx2_text_cache_name, write_ltx2_text_cache, Ltx2TextCache, LTX2_ARCHITECTURE, LTX2_SUFFIX,
    TEXT_ENCODING_METADATA,
};
use framesmith_data::ValidConfig;
use framesmith_models::ltx2::text::{FeatureVersion, TextParts};

/// Whether the text pass `files` caches for LTX-2.
pub(super) fn is_ltx2_text_pass(files: &TextFiles) -> bool {
    files.dit.as_deref().is_some_and(is_ltx2_file)
}

/// What encodes a checkpoint's captions, as the caches record it: the release and the width, and the audio
/// connector's width when the checkpoint has one.
pub fn encoding_tag(parts: &TextParts) -> String {
    let release = match parts.config.features {
        FeatureVersion::V1 => "LTX-2",
        FeatureVersion::V2 { .. } => "LTX-2.3",
    };
    let width = parts.config.output_width();
    if parts.has_audio() {
        format!(
            "{release} {width} + audio {}",
            parts.config.audio_connector.inner_dim()
        )
    } else {
        format!("{release} {width}")
    }
}

/// Whether `path` holds a complete LTX-2 text cache of `caption` made by `encoding`.
fn cached(path: &Path, caption: &str, encoding: &str) -> bool {
    let keys: &[&str] = if encoding.contains("+ audio") {
        &["video_prompt_embeds_", "audio_prompt_embeds_"]
    } else {
        &["video_prompt_embeds_"]
    };
    header::complete_cache(path, keys, LTX2_ARCHITECTURE).is_some_and(|meta| {
        meta.get("caption1").map(String::as_str) == Some(caption)
            && meta.get(TEXT_ENCODING_METADATA).map(String::as_str) == Some(encoding)
    })
}

/// The text pass with Gemma 3 and the connector of the checkpoint `--dit` names.
pub(super) fn text(
    request: &CacheRequest<'_>,
    files: &TextFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let text_encoder = files.text_encoder.as_deref().context(
        "LTX-2 captions are encoded by Gemma 3 12B: give --text-encoder (the google/gemma-3-12b-it folder or \
         ComfyUI's gemma_3_12B_it.safetensors) with --dit",
    )?;
    let dit = files
        .dit
        .as_deref()
        .context("LTX-2 captions need --dit, the checkpoint whose text connector encodes them")?;
    let parts = TextParts::open(dit)?;
    let encoding = encoding_tag(&parts);
    let audio = parts.has_audio();
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    log(&format!(
        "text encoder: Gemma 3 with {encoding}'s feature extractor and {}, on {device:?}, stored in {dtype:?}",
        if audio {
            "connectors (video and audio)"
        } else {
            "connector"
        }
    ));
    let encoder_files = Ltx2EncoderFiles {
        text_encoder,
        tokenizer: files.tokenizer.as_deref(),
        dit,
    };
    let mut encode = |captions: &[&str]| {
        encode_texts_for(
            encoder_files,
            &load_gemma,
            (captions, audio),
            (dtype, &device),
            &mut *log,
        )
    };
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_ltx2_text(&valid, (&mut encode, &encoding), dtype, &options, progress)
}

/// How captions are encoded (the encoders loaded for the call and dropped after it).
pub type EncodeCaptions<'a> = &'a mut dyn FnMut(&[&str]) -> anyhow::Result<Vec<Ltx2Text>>;

/// Writes the `_ltx2_te` cache of every caption of the dataset config that has none for its caption and
/// `encoding`, the captions encoded by `encode` in one call and stored in `dtype`.
pub fn cache_ltx2_text(
    valid: &ValidConfig,
    (encode, encoding): (EncodeCaptions<'_>, &str),
    dtype: DType,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let caches = CaptionCaches {
        name: &ltx2_text_cache_name,
        cached: &|path: &Path, caption: &str| cached(path, caption, encoding),
        write: &|item: &PendingCaption, text: &Ltx2Text| write(item, text, (dtype, encoding)),
        stale_suffix: format!("_{LTX2_SUFFIX}_te.safetensors"),
    };
    cache_captions(valid, &caches, encode, options, progress)
}

fn write(
    item: &PendingCaption,
    text: &Ltx2Text,
    (dtype, encoding): (DType, &str),
) -> anyhow::Result<()> {
    let cpu = Device::Cpu;
    let rows = text.mask.len();
    let cache = Ltx2TextCache {
        video_prompt_embeds: text.embeds.to_dtype(dtype)?.to_device(&cpu)?,
        prompt_attention_mask: Some(Tensor::from_vec(text.mask.clone(), rows, &cpu)?),
        audio_prompt_embeds: text
            .audio_embeds
            .as_ref()
            .map(|a| a.to_dtype(dtype)?.to_device(&cpu))
            .transpose()?,
        caption: item.caption.clone(),
        encoding: Some(encoding.to_string()),
    };
    Ok(write_ltx2_text_cache(&item.path, &cache)?)
}

#[cfg(test)]
mod tests;
