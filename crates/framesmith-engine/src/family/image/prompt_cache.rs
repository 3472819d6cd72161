//! The sample prompts' encodings through the output folder's prompt cache: those it holds are read back, the rest
//! encoded in one call (so the text encoders load only when something is missing) and put in the cache for the
//! next start. The family says how its encoding is keyed and stored ([`CachedEncoding`]) and how it encodes.

use std::collections::HashMap;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use framesmith_config::protocol::LogLevel;
use framesmith_data::prompt_cache::PromptCache;

/// How a family's prompt encodings go in and out of the prompt cache; a prompt is a `K` (its text, or the text
/// with what else it is encoded with, such as control images).
pub(crate) struct CachedEncoding<T, K: ?Sized = str> {
    /// The cache key's parts for a prompt (the encoders and their settings, then the text and anything else the
    /// encoding depends on).
    pub parts: fn(&K) -> Vec<String>,
    /// The encoding from a cache entry's tensors; `None` when one is missing.
    pub from_tensors: fn(HashMap<String, Tensor>) -> Option<T>,
    /// The encoding's tensors by name, as the cache stores them.
    pub tensors: fn(&T) -> Vec<(&'static str, &Tensor)>,
}

/// The encodings of `texts`, in order, in `dtype` on `device`: from `cache` where it holds them, the rest by
/// `encode` (called once, with the missing texts, only when there are some) and put in the cache for the next
/// start (a failure to cache is logged as a warning). Also says how many were encoded.
pub(crate) fn cached_encodings<T, K: ?Sized>(
    (cache, how): (&PromptCache, &CachedEncoding<T, K>),
    texts: &[&K],
    (dtype, device): (DType, &Device),
    encode: impl FnOnce(&[&K]) -> anyhow::Result<Vec<T>>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<(Vec<T>, usize)> {
    let key = |text: &K| (how.parts)(text);
    let mut found: Vec<Option<T>> = texts
        .iter()
        .map(|text| {
            let parts = key(text);
            let keyed: Vec<&str> = parts.iter().map(String::as_str).collect();
            (how.from_tensors)(cache.get(&keyed, dtype, device)?)
        })
        .collect();
    let missing: Vec<&K> = texts
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(t, _)| *t)
        .collect();
    if missing.is_empty() {
        return Ok((found.into_iter().flatten().collect(), 0));
    }
    let mut encoded = encode(&missing)?.into_iter();
    for (text, slot) in texts.iter().zip(found.iter_mut()) {
        if slot.is_some() {
            continue;
        }
        let prompt = encoded
            .next()
            .context("the text encoder returned too few prompts")?;
        let parts = key(text);
        let keyed: Vec<&str> = parts.iter().map(String::as_str).collect();
        if let Err(e) = cache.put(&keyed, dtype, &(how.tensors)(&prompt)) {
            log(
                LogLevel::Warn,
                format!("the sample prompt's embedding is not cached for the next run: {e}"),
            );
        }
        *slot = Some(prompt);
    }
    let prompts = found
        .into_iter()
        .map(|p| p.context("a sample prompt has no embedding"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((prompts, missing.len()))
}
