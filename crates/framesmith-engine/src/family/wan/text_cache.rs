//! Text-encoder caching: every caption through umT5, one `{stem}_wan_te.safetensors` per item. A cache
//! is reused only while its stored caption (`caption1`) equals the current one, so an edited caption is
//! re-encoded even though musubi-tuner would keep the old embedding.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::prep::{scan_all, CacheOptions, CacheProgress, CacheSummary, Expected, ItemOutcome};
use framesmith_data::cache::{media_stem, text_cache_name, write_wan_text_cache, WAN_ARCHITECTURE};
use framesmith_data::media::MediaTools;
use framesmith_data::samples::cache_dir;
use framesmith_data::ValidConfig;
use framesmith_models::wan::text_encoder::TextEncoder;

/// One caption waiting to be encoded.
struct Pending {
    media: PathBuf,
    caption: String,
    path: PathBuf,
}

fn text_suffix() -> String {
    format!("_{WAN_ARCHITECTURE}_te.safetensors")
}

/// Whether `path` holds a complete text cache of `caption`.
fn cached(path: &Path, caption: &str) -> bool {
    crate::prep::header::complete_cache(path, &["varlen_t5_"], WAN_ARCHITECTURE)
        .is_some_and(|meta| meta.get("caption1").map(String::as_str) == Some(caption))
}

/// Writes the umT5 embedding of every caption of the dataset config, stored in `dtype`.
pub fn cache_text(
    valid: &ValidConfig,
    tools: Option<&MediaTools>,
    encoder: &TextEncoder,
    dtype: DType,
    options: &CacheOptions,
    progress: &mut dyn CacheProgress,
) -> anyhow::Result<CacheSummary> {
    let mut summary = CacheSummary::default();
    let mut expected = Expected::default();
    let scans = scan_all(valid, tools, &mut summary, progress);
    let mut pending = Vec::new();
    for scan in &scans {
        let ds = &scan.dataset;
        expected.dataset(ds, scan);
        for item in &scan.items {
            let path = cache_dir(ds, &item.media).join(text_cache_name(&media_stem(&item.media)));
            expected.file(&path);
            let outcome = match &item.caption {
                None => {
                    expected.failed(ds, &item.media);
                    ItemOutcome::Failed("no caption".into())
                }
                Some(caption) if cached(&path, caption) => ItemOutcome::Skipped,
                Some(caption) => {
                    pending.push(Pending {
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
    for item in &pending {
        // The encoder failing is not about one caption: it stops the run.
        encode_one(encoder, item, dtype)
            .with_context(|| format!("encoding the caption of {}", item.media.display()))?;
        let outcome = ItemOutcome::Written(1);
        progress.item_done(&item.media, &outcome);
        summary.record(&item.media, &outcome);
    }
    if !options.keep_stale {
        summary.removed = expected.remove_stale(&text_suffix())?;
    }
    Ok(summary)
}

/// Encodes one caption and writes its cache. Captions go one at a time, not in padded batches: a caption's
/// embedding then does not depend on which others shared its batch (padding changes the last bits), so
/// re-caching one edited caption gives what a full run would.
fn encode_one(encoder: &TextEncoder, item: &Pending, dtype: DType) -> anyhow::Result<()> {
    let t5 = encoder
        .encode_prompts(&[item.caption.as_str()])?
        .pop()
        .context("the text encoder returned no embedding")?;
    write(item, &t5, dtype)
}

fn write(item: &Pending, t5: &Tensor, dtype: DType) -> anyhow::Result<()> {
    let t5 = t5.to_dtype(dtype)?.to_device(&Device::Cpu)?;
    if let Some(dir) = item.path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
    }
    write_wan_text_cache(&item.path, &t5, &item.caption)?;
    Ok(())
}
