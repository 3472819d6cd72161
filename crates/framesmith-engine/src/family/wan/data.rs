//! What a Wan run (or the demo model's) trains and validates on: the demo generator's clips, or a dataset
//! config's cached items (`*_wan` caches, with `[[validation_datasets]]`), and the held-out items.

use std::path::Path;

use candle_core::Device;

use super::cached::{load_cached_items_with, CacheModels};
use super::demo_setup::demo_items;
use crate::demo::project::DEMO_CLIPS;
use crate::train::data::TrainItem;
use crate::train::trainer::mix;
use crate::train::validation::{hold_out, Validation, GENERATED_STREAM};
use framesmith_config::plan::{DatasetSource, ModelSource};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::Unreadable;
use framesmith_models::wan::WanConfig;

/// What a run trains on and validates on.
pub(crate) struct RunData {
    /// Training items, each `num_repeats` times.
    pub(crate) items: Vec<TrainItem>,
    pub(crate) batch_size: usize,
    pub(crate) validation: Option<Validation>,
}

/// The training items of `plan` and its validation items (with `[validation]` scheduled).
pub(crate) fn load_run_data(
    plan: &RunPlan,
    cfg: &WanConfig,
    device: &Device,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunData> {
    let v = plan.validation.as_ref();
    let (items, batch_size, mut validation) = match &plan.dataset.source {
        DatasetSource::Synthetic => {
            let items = demo_items(cfg, plan.training.seed, device)?;
            // Generated data has no held-out files: fresh clips from the same generator are the held-out set.
            let fresh = match v {
                Some(v) if v.split.is_none() => {
                    let mut clips = demo_items(cfg, mix(v.seed, GENERATED_STREAM), device)?;
                    clips.truncate((DEMO_CLIPS / 4).max(1));
                    clips
                }
                _ => Vec::new(),
            };
            (items.into_iter().map(|i| (i, 1)).collect(), 1, fresh)
        }
        DatasetSource::Config(path) => {
            let models = CacheModels {
                vae: plan.model.vae.as_deref(),
                text_encoder: plan.model.text_encoder.as_deref(),
                dit: match &plan.model.source {
                    ModelSource::File(path) => Some(path.as_path()),
                    ModelSource::Demo => None,
                },
                clip: plan.model.clip.as_deref(),
            };
            let unreadable = Unreadable::skip_if(plan.dataset.skip_unreadable);
            let cached =
                load_cached_items_with((path, unreadable), cfg, models, v.is_some(), device)?;
            for line in &cached.skipped {
                log(LogLevel::Warn, line.clone());
            }
            if v.is_none() && cached.validation_datasets > 0 {
                log(
                    LogLevel::Info,
                    "the dataset config's [[validation_datasets]] are not evaluated: set \
                     validation.validate_every_n_steps to see a validation loss"
                        .into(),
                );
            }
            if let Some(v) = v {
                if v.split.is_none() && cached.validation.is_empty() {
                    anyhow::bail!("{}", nothing_to_validate(path));
                }
            }
            (cached.items, cached.batch_size, cached.validation)
        }
    };
    let items = match v.and_then(|v| v.split.map(|s| (s, v.seed))) {
        Some((split, seed)) => {
            let (train, held) = hold_out(items, split, seed)?;
            validation.extend(held);
            train
        }
        None => items,
    };
    let items = items
        .into_iter()
        .flat_map(|(item, repeats)| std::iter::repeat_n(item, repeats.max(1)))
        .collect();
    let validation = v.map(|plan| Validation {
        plan: plan.clone(),
        items: validation,
    });
    if let Some(v) = &validation {
        log(
            LogLevel::Info,
            format!(
                "validation: {} held-out item{} at {} timestep{}",
                v.items.len(),
                if v.items.len() == 1 { "" } else { "s" },
                v.plan.sigmas.len(),
                if v.plan.sigmas.len() == 1 { "" } else { "s" }
            ),
        );
    }
    Ok(RunData {
        items,
        batch_size,
        validation,
    })
}

fn nothing_to_validate(dataset_toml: &Path) -> String {
    format!(
        "validation is scheduled ([validation] validate_every_n_steps, validate_every_n_epochs or \
         validate_at_save) but there is nothing to evaluate: add [[validation_datasets]] to the dataset config \
         (cached like [[datasets]], by the same `framesmith cache` commands), or set validation.validation_split \
         = 0.1 to hold out a tenth of the training items: {}",
        dataset_toml.display()
    )
}
