//! The caption pass of the families whose text caches are one file per caption beside the media
//! (`{stem}_{suffix}_te.safetensors`): every caption without a complete cache is encoded in one call, each written
//! by the family, captionless items reported, and stale caches removed unless asked not to.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::prep::{scan_all, CacheOptions, CacheProgress, CacheSummary, Expected, ItemOutcome};
use framesmith_data::cache::media_stem;
use framesmith_data::media::MediaTools;
use framesmith_data::samples::cache_dir;
use framesmith_data::ValidConfig;

/// One caption waiting to be encoded, and the cache it goes to.
pub(crate) struct PendingCaption {
    pub media: PathBuf,
    pub caption: String,
    pub path: PathBuf,
}

/// How a family names, recognises and writes its text caches.
pub(crate) struct CaptionCaches<'a, T> {
    /// The cache's file name for a media stem.
    pub name: &'a dyn Fn(&str) -> String,
    /// Whether the file at the path is a complete cache of the caption.
    pub cached: &'a dyn Fn(&Path, &str) -> bool,
    /// Writes one caption's encoding.
    pub write: &'a dyn Fn(&PendingCaption, &T) -> anyhow::Result<()>,
    /// The ending of the family's text cache names (`_hv15_te.safetensors`), for removing stale ones.
    pub stale_suffix: String,
}

/// Writes the text cache of every caption of `valid` that has none, the captions encoded by `encode` in one call.
pub(crate) fn cache_captions<T>(
    valid: &ValidConfig,
    caches: &CaptionCaches<'_, T>,
    encode: &mut dyn FnMut(&[&str]) -> anyhow::Result<Vec<T>>,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let tools = MediaTools::locate().ok();
    let scans = scan_all(valid, tools.as_ref(), &mut summary, progress);
    let mut pending = Vec::new();
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let path = cache_dir(ds, &item.media).join((caches.name)(&media_stem(&item.media)));
            expected.file(&path);
            let outcome = match &item.caption {
                None => {
                    expected.failed(ds, &item.media);
                    ItemOutcome::Failed("no caption".into())
                }
                Some(caption) if (caches.cached)(&path, caption) => ItemOutcome::Skipped,
                Some(caption) => {
                    pending.push(PendingCaption {
                        media: item.media.clone(),
                        caption: caption.clone(),
                        path,
                    });
                    continue;
                }
            };
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !pending.is_empty() {
        let captions: Vec<&str> = pending.iter().map(|p| p.caption.as_str()).collect();
        let encoded = encode(&captions)?;
        anyhow::ensure!(
            encoded.len() == pending.len(),
            "the text encoder returned {} encodings for {} captions",
            encoded.len(),
            pending.len()
        );
        for (item, text) in pending.iter().zip(encoded) {
            if let Some(dir) = item.path.parent() {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("cannot create the cache directory {}", dir.display())
                })?;
            }
            (caches.write)(item, &text)
                .with_context(|| format!("writing the text cache of {}", item.media.display()))?;
            let outcome = ItemOutcome::Written(1);
            progress.item_done(&item.media, &outcome);
            summary.record(&item.media, &outcome);
        }
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&caches.stale_suffix)?;
    }
    Ok(summary)
}
