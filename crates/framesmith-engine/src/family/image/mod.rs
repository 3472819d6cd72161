//! What the image families (FLUX.1, Qwen-Image) share, so that each keeps in its own folder only what differs:
//! the cached items of a run and their clip ([`items`]), the run the trainer drives (micro-step, validation,
//! samples) over the family's batch ([`run`]), its plan description's model and byte arithmetic ([`plan`]), the
//! memory plan and LoRA metadata of its setup ([`setup`]), the samples during training ([`samples`]) and their
//! prompts through the prompt cache ([`prompt_cache`]), the cache passes' loops over images and captions
//! ([`prep`]), what the sampling pipelines share ([`pipeline`]), and the checks and the end of an image generation
//! ([`generate`]); and the whole family impl of a video family trained from caches made elsewhere
//! ([`cached_video`]). Nothing here is one family's own; a family implements [`items::ImageCacheReader`],
//! [`run::ImageModel`] and [`samples::ImagePipeline`], or [`cached_video::CachedVideoFamily`].

use std::path::{Path, PathBuf};

use framesmith_config::plan::ModelSource;
use framesmith_config::{RunConfig, RunPlan};

pub(crate) mod cached_video;
pub(crate) mod caption_pass;
pub(crate) mod clip_prep;
pub mod generate;
pub mod items;
pub mod pipeline;
pub mod plan;
pub mod prep;
pub mod prompt_cache;
pub mod run;
pub mod samples;
pub mod setup;

/// Whether the run `config` describes trains the family whose DiT files `is_dit` recognises: not the demo, and its
/// `model.dit` is one.
pub(crate) fn is_dit_run(config: &RunConfig, is_dit: impl Fn(&Path) -> bool) -> bool {
    let dit = &config.model.dit;
    !config.model.demo && !dit.as_os_str().is_empty() && is_dit(dit)
}

/// The run's `model.dit` when `is_dit` recognises it.
pub(crate) fn dit_of(plan: &RunPlan, is_dit: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    match &plan.model.source {
        ModelSource::File(path) if is_dit(path) => Some(path.clone()),
        _ => None,
    }
}

/// `config` as a plan's check of the settings takes it for an image family: `--variant` (`flux-dev`,
/// `qwen-image`) names the family to plan, but a run reads its model from `model.dit`.
pub(crate) fn settings_with_auto_variant(config: &RunConfig) -> RunConfig {
    let mut settings = config.clone();
    settings.model.variant = "auto".into();
    settings
}
