//! An image family's run as the trainer asks of it, the same for every image family: the micro-step (timesteps
//! and noise from the micro-step's seed, the family's batch, the checkpointed step), the validation loss over
//! held-out items at the plan's fixed timesteps, and the samples. The family gives its model's batch
//! ([`ImageModel`]) and its samples ([`SampleSet`]); the flow-matching noise and targets are shared
//! ([`noisy_latents`]).

use std::path::Path;

use crate::train::noise::StepRng;
use candle_core::{DType, Device, Tensor};

use crate::family::{FamilyRun, MicroStep, StepContext};
use crate::train::data::TrainItem;
use crate::train::samples::{make_sample, SampleFiles, SampleSet};
use crate::train::step::{forward_loss, try_checkpointed_step, LossTarget, StepError};
use crate::train::timesteps::{loss_weight, sample_clip_timesteps, TimestepDraw};
use crate::train::trainer::mix;
use crate::train::validation::{Validation, NOISE_STREAM};
use framesmith_config::training::{TimestepConfig, NUM_TRAIN_TIMESTEPS};
use framesmith_models::trainable::TrainableModel;
use framesmith_nn::lora_file::SaveLayout;

/// An image family's model as a run trains it.
pub trait ImageModel: TrainableModel + 'static {
    /// Why the family's runs do not validate, as the error a validation asks for; `None` when they do.
    const NO_VALIDATION: Option<&'static str> = None;
    /// The keys of the run's saved LoRA files.
    const LORA_LAYOUT: SaveLayout = SaveLayout::Musubi;

    /// The model's inputs and the flow-matching targets (packed as the model's output) of `batch` (items of one
    /// latent shape) at `draws`, noise drawn from `rng` item by item, as the run's `options` ask (a family reads
    /// those it supports: validation refuses the others); the model computes in `dtype`.
    fn image_batch(
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        dtype: DType,
        options: &BatchOptions,
    ) -> anyhow::Result<(Self::Inputs, Vec<Tensor>)>;
}

/// What a run's training options ask of its batches besides the items and their timesteps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchOptions {
    /// The probability that a clip's first latent frame is given clean as conditioning, drawn per clip and batch
    /// (image-to-video training inside text-to-video, `training.first_frame_conditioning_p`); 0: never.
    pub first_frame_conditioning_p: f64,
}

/// The model of an image family's run and its samples.
pub struct ImageRun<M, S> {
    pub(crate) model: M,
    /// The dtype its linears compute in (the batch's conditioning comes in it).
    pub(crate) dtype: DType,
    pub(crate) samples: Option<S>,
    /// What the run's options ask of each batch.
    pub(crate) batch: BatchOptions,
}

impl<M, S> ImageRun<M, S> {
    /// The run of `model` computing in `dtype`, with `samples`, its batches without options.
    pub(crate) fn new(model: M, dtype: DType, samples: Option<S>) -> Self {
        Self {
            model,
            dtype,
            samples,
            batch: BatchOptions::default(),
        }
    }

    /// The run with its batches made as `batch` asks.
    pub(crate) fn with_batch(self, batch: BatchOptions) -> Self {
        Self { batch, ..self }
    }
}

impl<M: ImageModel, S> ImageRun<M, S> {
    /// The inputs, targets and loss weights of `batch` at `draws`, its noise from `rng`.
    fn step_target(
        &self,
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        timesteps: &TimestepConfig,
    ) -> anyhow::Result<(M::Inputs, Vec<Tensor>, Vec<f64>)> {
        let (inputs, targets) = M::image_batch(batch, draws, rng, self.dtype, &self.batch)?;
        let weights = draws
            .iter()
            .map(|d| loss_weight(timesteps.weighting, d.model_timestep))
            .collect();
        Ok((inputs, targets, weights))
    }

    /// The loss of one held-out `item` at `draw`, its noise from `rng`, forward only.
    fn item_loss(
        &self,
        item: &TrainItem,
        draw: TimestepDraw,
        rng: &mut StepRng,
        timesteps: &TimestepConfig,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f32> {
        let (inputs, targets, weights) = self.step_target(&[item], &[draw], rng, timesteps)?;
        let target = LossTarget {
            targets: &targets,
            weights: Some(&weights),
            skip_frames: 0,
        };
        forward_loss(&self.model, &inputs, &target, Some(interrupted)).map_err(|e| match e {
            StepError::Interrupted => anyhow::Error::new(e),
            e => anyhow::Error::new(e).context(format!("validation on {}", item.key)),
        })
    }
}

impl<M: ImageModel, S: SampleSet<M> + 'static> FamilyRun for ImageRun<M, S> {
    fn device(&self) -> &Device {
        TrainableModel::device(&self.model)
    }

    fn lora_layout(&self) -> SaveLayout {
        M::LORA_LAYOUT
    }

    fn micro_step(
        &mut self,
        batch: &[&TrainItem],
        rng: &mut StepRng,
        ctx: &StepContext<'_>,
    ) -> anyhow::Result<MicroStep> {
        let (_, f, h, w) = batch[0].latents.dims4()?;
        let draws = sample_clip_timesteps(ctx.timesteps, batch.len(), (f, h, w), rng);
        let (inputs, targets, weights) = self.step_target(batch, &draws, rng, ctx.timesteps)?;
        let target = LossTarget {
            targets: &targets,
            weights: Some(&weights),
            skip_frames: 0,
        };
        let vars = ctx.loras.vars();
        let result = try_checkpointed_step(&self.model, &inputs, &target, &vars, ctx.options);
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
        if let Some(why) = M::NO_VALIDATION {
            anyhow::bail!("{why}");
        }
        let sigmas = &v.plan.sigmas;
        let mut sum = 0f64;
        for (i, item) in v.items.iter().enumerate() {
            for (k, &t) in sigmas.iter().enumerate() {
                let draw = TimestepDraw {
                    t,
                    model_timestep: t * NUM_TRAIN_TIMESTEPS as f64 + 1.0,
                };
                let pair = (i * sigmas.len() + k) as u64;
                let rng = &mut StepRng::seeded(mix(v.plan.seed ^ NOISE_STREAM, pair));
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

/// The noisy latents `(1 − t)·x + t·noise` of `batch` at `draws` as one [b, C, H, W] f32 tensor, and each item's
/// flow-matching target `noise − x` packed by `pack` (the model's output layout) without its batch dimension;
/// noise drawn from `rng` item by item.
pub(crate) fn noisy_latents(
    batch: &[&TrainItem],
    draws: &[TimestepDraw],
    rng: &mut StepRng,
    pack: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> anyhow::Result<(Tensor, Vec<Tensor>)> {
    let mut noisy = Vec::with_capacity(batch.len());
    let mut targets = Vec::with_capacity(batch.len());
    for (item, draw) in batch.iter().zip(draws) {
        // [C, 1, H, W] → [1, C, H, W].
        let x = item.latents.to_dtype(DType::F32)?.transpose(0, 1)?;
        let noise = rng.normal(x.shape(), x.device())?;
        noisy.push(((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?);
        targets.push(pack(&(noise - x)?)?.squeeze(0)?);
    }
    Ok((Tensor::cat(&noisy, 0)?, targets))
}

/// The model's timesteps [b] of `draws`: `model_timestep / 1000` (t + 0.001 in the continuous modes).
pub fn model_timesteps(draws: &[TimestepDraw], device: &Device) -> candle_core::Result<Tensor> {
    let ts: Vec<f32> = draws
        .iter()
        .map(|d| (d.model_timestep / NUM_TRAIN_TIMESTEPS as f64) as f32)
        .collect();
    Tensor::new(ts, device)
}
