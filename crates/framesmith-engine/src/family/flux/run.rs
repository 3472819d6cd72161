//! A FLUX.1 [dev] run's model and what the trainer asks of it: the micro-step (noise and timesteps from the
//! micro-step's seed, the FLUX.1 batch, the checkpointed step) and the image samples. FLUX.1 runs do not
//! validate (the config validator refuses `[validation]` for them).

use std::path::Path;

use candle_core::{DType, Device};
use rand::rngs::StdRng;

use crate::family::flux::samples::ImageSamples;
use crate::family::flux::train::flux_batch;
use crate::family::{FamilyRun, MicroStep, StepContext};
use crate::train::data::TrainItem;
use crate::train::samples::{make_sample, SampleFiles, SampleSet};
use crate::train::step::{try_checkpointed_step, LossTarget};
use crate::train::timesteps::{loss_weight, sample_timesteps};
use crate::train::validation::Validation;
use framesmith_config::training::TimestepConfig;
use framesmith_models::flux::Flux;
use framesmith_models::trainable::TrainableModel;

/// The model of a FLUX.1 run and its samples.
pub struct FluxRun {
    pub(crate) model: Flux,
    /// The dtype its linears compute in (the batch's conditioning comes in it).
    pub(crate) dtype: DType,
    pub(crate) samples: Option<ImageSamples>,
}

impl FamilyRun for FluxRun {
    fn device(&self) -> &Device {
        TrainableModel::device(&self.model)
    }

    fn micro_step(
        &mut self,
        batch: &[&TrainItem],
        rng: &mut StdRng,
        ctx: &StepContext<'_>,
    ) -> anyhow::Result<MicroStep> {
        let (_, _, h, w) = batch[0].latents.dims4()?;
        let draws = sample_timesteps(ctx.timesteps, batch.len(), (h, w), rng);
        let flux = flux_batch(batch, &draws, rng, self.dtype)?;
        let weights: Vec<f64> = draws
            .iter()
            .map(|d| loss_weight(ctx.timesteps.weighting, d.model_timestep))
            .collect();
        let target = LossTarget {
            targets: &flux.targets,
            weights: Some(&weights),
            skip_frames: 0,
        };
        let vars = ctx.loras.vars();
        let result = try_checkpointed_step(&self.model, &flux.inputs, &target, &vars, ctx.options);
        Ok(MicroStep {
            second: false,
            result,
        })
    }

    fn validation_loss(
        &mut self,
        _validation: &Validation,
        _timesteps: &TimestepConfig,
        _interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f64> {
        anyhow::bail!(
            "FLUX.1 runs do not validate yet: remove [validation] (validate_every_n_steps, validate_every_n_epochs, \
             validate_at_save) from the run config"
        )
    }

    fn sample_count(&self) -> usize {
        self.samples.as_ref().map_or(0, |s| s.prompt_count())
    }

    fn sample_prompt(&self, i: usize) -> &str {
        self.samples.as_ref().map_or("", |s| s.prompt(i))
    }

    fn sample(
        &mut self,
        i: usize,
        dir: &Path,
        stem: &str,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<SampleFiles> {
        make_sample(
            self.samples.as_ref(),
            &mut self.model,
            (i, dir, stem),
            cancelled,
        )
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
pub(crate) mod tests;
