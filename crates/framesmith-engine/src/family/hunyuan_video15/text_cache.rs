//! HunyuanVideo 1.5 caching of a dataset's captions: each caption's Qwen2.5-VL states and its quoted text's byT5
//! glyph states ([`super::encoder`]) to `{stem}_hv15_te.safetensors`, as musubi-tuner's
//! `hv_1_5_cache_text_encoder_outputs.py` names and keys them: `varlen_vl_embed_{dtype}` [L, 3584] and
//! `varlen_byt5_embed_{dtype}` [L2, 1472] of the valid tokens (L2 = 0 when the caption quotes nothing), and the
//! caption as `caption1`. The glyph text follows the official pipeline (quoted spans in order of appearance,
//! duplicates dropped, 256 tokens), where musubi-tuner takes straight quotes before curly ones, keeps duplicates
//! and cuts at 128 tokens: the two agree on captions with short quoted text in one kind of quotes.
//! A cache is kept while its caption is unchanged; stale `_hv15_te` caches are removed unless asked not to.
//! A text pass is HunyuanVideo 1.5's when `--dit` names its transformer.

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::encoder::{encode_texts, load_qwen, Hv15EncoderFiles};
use super::pipeline::Hv15Text;
use super::train::is_hv15_file;
use crate::family::image::caption_pass::{cache_captions, CaptionCaches, PendingCaption};
use crate::prep::pass::{load_dataset, CacheRequest, TextFiles};
use crate::prep::{header, CacheOptions, CacheProgress, CacheSummary};
use framesmith_data::family::hunyuan_video15::cache::{
    hv15_text_cache_name, write_hv15_text_cache, Hv15TextCache, HV15_ARCHITECTURE, HV15_SUFFIX,
};
use framesmith_data::ValidConfig;
use framesmith_models::hunyuan_video15::byt5::WIDTH as GLYPH_WIDTH;

/// Whether the text pass `files` caches for HunyuanVideo 1.5.
pub(super) fn is_hv15_text_pass(files: &TextFiles) -> bool {
    files.dit.as_deref().is_some_and(is_hv15_file)
}

/// Whether `path` holds a complete HunyuanVideo 1.5 text cache of `caption`.
fn cached(path: &std::path::Path, caption: &str) -> bool {
    let keys = ["varlen_vl_embed_", "varlen_byt5_embed_"];
    header::complete_cache(path, &keys, HV15_ARCHITECTURE)
        .is_some_and(|meta| meta.get("caption1").map(String::as_str) == Some(caption))
}

/// The text pass with Qwen2.5-VL and the byT5 glyph encoder (beside the text encoder).
pub(super) fn text(
    request: &CacheRequest<'_>,
    files: &TextFiles,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    let text_encoder = files.text_encoder.as_deref().context(
        "HunyuanVideo 1.5 captions are encoded by Qwen2.5-VL-7B: give --text-encoder (with the byT5 glyph \
         encoder beside it)",
    )?;
    let valid = load_dataset(request, log)?;
    let (device, dtype) = (request.open)()?;
    log(&format!(
        "text encoders: Qwen2.5-VL and the byT5 glyph encoder, on {device:?}, stored in {dtype:?}"
    ));
    let encoder_files = Hv15EncoderFiles {
        text_encoder,
        tokenizer: files.tokenizer.as_deref(),
        glyph: None,
    };
    let encode =
        |captions: &[&str]| encode_texts(encoder_files, &load_qwen, captions, (dtype, &device));
    let options = CacheOptions {
        keep_stale: request.keep_stale,
    };
    cache_hv15_text(&valid, &encode, dtype, &options, progress)
}

/// How captions are encoded (the encoders loaded for the call and dropped after it).
pub type EncodeCaptions<'a> = &'a dyn Fn(&[&str]) -> anyhow::Result<Vec<Hv15Text>>;

/// Writes the `_hv15_te` cache of every caption of the dataset config that has none for its caption, the captions
/// encoded by `encode` in one call and stored in `dtype`.
pub fn cache_hv15_text(
    valid: &ValidConfig,
    encode: EncodeCaptions<'_>,
    dtype: DType,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let caches = CaptionCaches {
        name: &hv15_text_cache_name,
        cached: &cached,
        write: &|item: &PendingCaption, text: &Hv15Text| write(item, text, dtype),
        stale_suffix: format!("_{HV15_SUFFIX}_te.safetensors"),
    };
    cache_captions(
        valid,
        &caches,
        &mut |captions| encode(captions),
        options,
        progress,
    )
}

fn write(item: &PendingCaption, text: &Hv15Text, dtype: DType) -> anyhow::Result<()> {
    let cpu = Device::Cpu;
    let byt5_embed = match &text.glyph {
        Some(g) => g.to_dtype(dtype)?.to_device(&cpu)?,
        None => Tensor::zeros((0, GLYPH_WIDTH), dtype, &cpu)?,
    };
    let cache = Hv15TextCache {
        vl_embed: text.txt.to_dtype(dtype)?.to_device(&cpu)?,
        byt5_embed,
        caption: item.caption.clone(),
    };
    Ok(write_hv15_text_cache(&item.path, &cache)?)
}

#[cfg(test)]
mod tests;
