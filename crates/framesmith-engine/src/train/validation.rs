//! Validation loss (training only): the held-out items — `[[validation_datasets]]`, `validation.validation_split`
//! of the training items, or, for generated data, clips generated apart from the training clips — evaluated
//! forward only at fixed timesteps with fixed noise. Each (item, timestep) pair draws its noise from an RNG seeded
//! by (validation seed, pair), never from the training stream, so an evaluation sees the same noise at every step
//! and in every run with the same seed, and a run with validation trains exactly the LoRA it trains without.

use std::path::Path;
use std::time::Instant;

use candle_core::Device;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::train::data::{load_cached_items, CacheModels, TrainItem};
use crate::train::demo_setup::{demo_items, DEMO_CLIPS};
use crate::train::step::{forward_loss, StepError};
use crate::train::timesteps::{is_high_noise, TimestepDraw};
use crate::train::trainer::{mix, Trainer};
use framesmith_config::plan::{DatasetSource, ModelSource, ValidationPlan};
use framesmith_config::protocol::{LogLevel, ValidationLoss};
use framesmith_config::training::NUM_TRAIN_TIMESTEPS;
use framesmith_config::RunPlan;
use framesmith_models::wan::WanConfig;

/// Stream tags mixed into the validation seed, so the split, the noise and generated clips never share draws.
const SPLIT_STREAM: u64 = 0x5641_4C5F_5350_4C54;
const NOISE_STREAM: u64 = 0x5641_4C5F_4E4F_4953;
const GENERATED_STREAM: u64 = 0x5641_4C5F_4745_4E44;

/// The held-out items and the schedule they are evaluated on.
pub struct Validation {
    pub(super) plan: ValidationPlan,
    pub(super) items: Vec<TrainItem>,
}

/// What a run trains on and validates on.
pub(super) struct RunData {
    /// Training items, each `num_repeats` times.
    pub(super) items: Vec<TrainItem>,
    pub(super) batch_size: usize,
    pub(super) validation: Option<Validation>,
}

/// Items, each with how many times an epoch repeats it.
pub type Repeated<T> = Vec<(T, usize)>;

/// Splits `items` (each with its repeats) into training items and `split` of them held out, chosen by `seed`
/// alone: the same items for the same seed, none in both sets. Errors when nothing would be left to train on.
pub fn hold_out<T>(
    items: Repeated<T>,
    split: f64,
    seed: u64,
) -> anyhow::Result<(Repeated<T>, Vec<T>)> {
    let n = items.len();
    let held = ((n as f64 * split).round() as usize).max(1);
    if held >= n {
        anyhow::bail!(
            "validation.validation_split = {split} would hold out {held} of the {n} training items, leaving \
             nothing to train on; lower validation.validation_split, or add [[validation_datasets]] to the \
             dataset config and set validation.validation_split = 0"
        );
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(mix(seed, SPLIT_STREAM)));
    let mut is_held = vec![false; n];
    for &i in &order[..held] {
        is_held[i] = true;
    }
    let (mut train, mut validation) = (Vec::new(), Vec::new());
    for (item, held) in items.into_iter().zip(is_held) {
        if held {
            validation.push(item.0);
        } else {
            train.push(item);
        }
    }
    Ok((train, validation))
}

/// The training items of `plan` and its validation items (with `[validation]` scheduled).
pub(super) fn load_run_data(
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
            let cached = load_cached_items(path, cfg, models, v.is_some(), device)?;
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

impl Trainer {
    /// Whether an evaluation falls on the step just completed.
    pub fn validation_due(&self) -> bool {
        self.writes_outputs()
            && self.validation.as_ref().is_some_and(|v| {
                let saved = self.save_due() || self.step == self.total_steps;
                v.plan.due(self.step, self.epoch_boundary(), saved)
            })
    }

    /// The mean loss over the held-out items × the fixed timesteps, forward only, with the LoRA as it is now;
    /// written to `metrics.jsonl`. `None` without validation.
    pub fn validate(
        &mut self,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<Option<ValidationLoss>> {
        let Some(v) = &self.validation else {
            return Ok(None);
        };
        let started = Instant::now();
        let sigmas = v.plan.sigmas.clone();
        // With both Wan2.2 experts, each timestep is evaluated by its own expert: the one on the GPU first.
        let (sides, boundary) = match &self.low_noise {
            Some(low) => {
                let current = low.model.is_parked();
                (vec![current, !current], low.boundary)
            }
            None => (vec![true], f64::NEG_INFINITY),
        };
        let mut sum = 0f64;
        for high in sides {
            self.use_expert(high)?;
            let Some(v) = &self.validation else {
                return Ok(None);
            };
            for (i, item) in v.items.iter().enumerate() {
                for (k, &t) in sigmas.iter().enumerate() {
                    let draw = TimestepDraw {
                        t,
                        model_timestep: t * NUM_TRAIN_TIMESTEPS as f64 + 1.0,
                    };
                    if is_high_noise(&draw, boundary) != high {
                        continue;
                    }
                    let pair = (i * sigmas.len() + k) as u64;
                    let rng = &mut StdRng::seed_from_u64(mix(v.plan.seed ^ NOISE_STREAM, pair));
                    let flow = self.flow_batch(&[item], &[draw], rng)?;
                    let flow = self.on_expert_device(high, flow)?;
                    let loss = forward_loss(
                        self.expert(high)?,
                        &flow.inputs,
                        &flow.target(),
                        Some(interrupted),
                    )
                    .map_err(|e| match e {
                        StepError::Interrupted => anyhow::Error::new(e),
                        e => anyhow::Error::new(e).context(format!("validation on {}", item.key)),
                    })?;
                    sum += loss as f64;
                }
            }
        }
        let Some(v) = &self.validation else {
            return Ok(None);
        };
        let pairs = (v.items.len() * sigmas.len()).max(1);
        let result = ValidationLoss {
            step: self.step,
            loss: sum / pairs as f64,
            items: v.items.len(),
            timesteps: sigmas.len(),
        };
        let secs = started.elapsed().as_secs_f64();
        self.outputs.append_validation(&result, secs)?;
        Ok(Some(result))
    }
}
