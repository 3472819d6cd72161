//! Validation loss (training only): the held-out items — `[[validation_datasets]]`, `validation.validation_split`
//! of the training items, or, for generated data, clips generated apart from the training clips — evaluated
//! forward only at fixed timesteps with fixed noise. Each (item, timestep) pair draws its noise from an RNG seeded
//! by (validation seed, pair), never from the training stream, so an evaluation sees the same noise at every step
//! and in every run with the same seed, and a run with validation trains exactly the LoRA it trains without.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::train::data::TrainItem;
use crate::train::trainer::{mix, Trainer};
use framesmith_config::plan::ValidationPlan;
use framesmith_config::protocol::ValidationLoss;

/// Stream tags mixed into the validation seed, so the split, the noise and generated clips never share draws.
const SPLIT_STREAM: u64 = 0x5641_4C5F_5350_4C54;
pub(crate) const NOISE_STREAM: u64 = 0x5641_4C5F_4E4F_4953;
pub(crate) const GENERATED_STREAM: u64 = 0x5641_4C5F_4745_4E44;

/// The held-out items and the schedule they are evaluated on.
pub struct Validation {
    /// When to evaluate, at which timesteps, with which seed.
    pub plan: ValidationPlan,
    /// The held-out items.
    pub items: Vec<TrainItem>,
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
        let sum = self
            .family
            .validation_loss(v, &self.timesteps, interrupted)?;
        let sigmas = &v.plan.sigmas;
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

#[cfg(test)]
mod tests;
