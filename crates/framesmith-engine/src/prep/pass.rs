//! One entry point for caching a dataset (`framesmith cache latents` / `cache text`): a request of plain paths and
//! settings goes to the family whose files it names ([`crate::family::Family::claims_cache`]), which loads its
//! encoders and runs its pass. No family is named here.

use std::path::PathBuf;

use candle_core::{DType, Device};
use framesmith_data::problem::summary_lines;
use framesmith_data::{load_valid_with, Unreadable, ValidConfig};

use super::{CacheProgress, CacheSummary};

/// Opens the device a pass computes on and picks the dtype of its encoders and caches. A pass calls it once its
/// dataset and files are checked, so that their problems are reported before a device is opened.
pub type OpenDevice<'a> = &'a dyn Fn() -> anyhow::Result<(Device, DType)>;

/// The files of a latent pass: the autoencoder decides the family.
#[derive(Debug, Clone, Default)]
pub struct LatentFiles {
    /// The autoencoder (VAE) weights.
    pub vae: PathBuf,
    /// Encode in overlapping spatial tiles (less memory for large frames; approximate).
    pub tiled: bool,
    /// The DiT the caches are for, read from its header only (which conditioning it needs, which autoencoder).
    pub dit: Option<PathBuf>,
    /// Cache the image-to-video conditioning of each clip's first frame.
    pub i2v: bool,
    /// An image encoder whose features of each clip's first frame are cached too.
    pub clip: Option<PathBuf>,
}

/// The files of a text pass: which encoders are given decides the family.
#[derive(Debug, Clone, Default)]
pub struct TextFiles {
    /// The T5-family text encoder's weights.
    pub text_encoder: Option<PathBuf>,
    /// Its tokenizer (default: the family's rule, e.g. one beside the weights).
    pub tokenizer: Option<PathBuf>,
    /// A CLIP text encoder cached beside it (its pooled output).
    pub clip_text: Option<PathBuf>,
    /// The CLIP text encoder's tokenizer (default: one beside its weights).
    pub clip_tokenizer: Option<PathBuf>,
    /// The DiT the captions are cached for (its files only say which edit model's encoding to reproduce).
    pub dit: Option<PathBuf>,
}

/// What a pass encodes.
#[derive(Debug, Clone)]
pub enum CachePass {
    /// Every image and clip, through the autoencoder.
    Latents(LatentFiles),
    /// Every caption, through the text encoders.
    Text(TextFiles),
}

/// A caching pass over the dataset config at `dataset`.
pub struct CacheRequest<'a> {
    /// The dataset config (musubi-tuner TOML).
    pub dataset: PathBuf,
    pub pass: CachePass,
    /// Keep cache files of items that are no longer in the dataset.
    pub keep_stale: bool,
    /// Whether entries that cannot be read stop the pass before it starts, or are left out with a warning.
    pub unreadable: Unreadable,
    /// Opens the device and picks the dtype, when the pass is ready to load its encoders.
    pub open: OpenDevice<'a>,
}

/// Caches the dataset of `request` for the family whose files it names; `progress` follows the items, `log` gets
/// each line worth showing (the encoders loaded, warnings, notes).
pub fn cache(
    request: &CacheRequest<'_>,
    progress: &mut dyn CacheProgress,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<CacheSummary> {
    crate::family::family_of_cache(&request.pass).cache(request, progress, log)
}

/// The dataset config of `request`, its warnings logged (thousands of one kind as one line).
pub(crate) fn load_dataset(
    request: &CacheRequest<'_>,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<ValidConfig> {
    let valid = load_valid_with(&request.dataset, request.unreadable)?;
    for line in summary_lines(&valid.warnings) {
        log(&line);
    }
    Ok(valid)
}
