//! A Qwen-Image run's model and what the trainer asks of it: the micro-step (noise and timesteps from the
//! micro-step's seed, the Qwen-Image batch, the checkpointed step), the validation loss over held-out items at the
//! plan's fixed timesteps, and the image samples.

use std::path::Path;

use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::family::qwen_image::samples::ImageSamples;
use crate::family::qwen_image::train::qwen_batch;
use crate::family::{FamilyRun, MicroStep, StepContext};
use crate::train::data::TrainItem;
use crate::train::samples::{make_sample, SampleFiles, SampleSet};
use crate::train::step::{forward_loss, try_checkpointed_step, LossTarget, StepError};
use crate::train::timesteps::{loss_weight, sample_timesteps, TimestepDraw};
use crate::train::trainer::mix;
use crate::train::validation::{Validation, NOISE_STREAM};
use framesmith_config::training::{TimestepConfig, NUM_TRAIN_TIMESTEPS};
use framesmith_models::qwen_image::QwenImageTransformer;
use framesmith_models::trainable::TrainableModel;

/// The model of a Qwen-Image run and its samples.
pub struct QwenImageRun {
    pub(crate) model: QwenImageTransformer,
    /// The dtype its linears compute in (the batch's text comes in it).
    pub(crate) dtype: DType,
    pub(crate) samples: Option<ImageSamples>,
}

impl QwenImageRun {
    /// The loss of one held-out `item` at `draw`, its noise from `rng`, forward only.
    fn item_loss(
        &self,
        item: &TrainItem,
        draw: TimestepDraw,
        rng: &mut StdRng,
        timesteps: &TimestepConfig,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f32> {
        let batch = qwen_batch(&[item], &[draw], rng, self.dtype)?;
        let weights = [loss_weight(timesteps.weighting, draw.model_timestep)];
        let target = LossTarget {
            targets: &batch.targets,
            weights: Some(&weights),
            skip_frames: 0,
        };
        forward_loss(&self.model, &batch.inputs, &target, Some(interrupted)).map_err(|e| match e {
            StepError::Interrupted => anyhow::Error::new(e),
            e => anyhow::Error::new(e).context(format!("validation on {}", item.key)),
        })
    }
}

impl FamilyRun for QwenImageRun {
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
        let qwen = qwen_batch(batch, &draws, rng, self.dtype)?;
        let weights: Vec<f64> = draws
            .iter()
            .map(|d| loss_weight(ctx.timesteps.weighting, d.model_timestep))
            .collect();
        let target = LossTarget {
            targets: &qwen.targets,
            weights: Some(&weights),
            skip_frames: 0,
        };
        let vars = ctx.loras.vars();
        let result = try_checkpointed_step(&self.model, &qwen.inputs, &target, &vars, ctx.options);
        Ok(MicroStep {
            second: false,
            result,
        })
    }

    fn validation_loss(
        &mut self,
        v: &Validation,
        timesteps: &TimestepConfig,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f64> {
        let sigmas = &v.plan.sigmas;
        let mut sum = 0f64;
        for (i, item) in v.items.iter().enumerate() {
            for (k, &t) in sigmas.iter().enumerate() {
                let draw = TimestepDraw {
                    t,
                    model_timestep: t * NUM_TRAIN_TIMESTEPS as f64 + 1.0,
                };
                let pair = (i * sigmas.len() + k) as u64;
                let rng = &mut StdRng::seed_from_u64(mix(v.plan.seed ^ NOISE_STREAM, pair));
                sum += f64::from(self.item_loss(item, draw, rng, timesteps, interrupted)?);
            }
        }
        Ok(sum)
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
