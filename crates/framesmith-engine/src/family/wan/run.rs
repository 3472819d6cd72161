//! A Wan run's models and what the trainer asks of them: flow matching as musubi-tuner does it (noisy = (1 − t)·
//! latents + t·noise, target = noise − latents, the loss in f32), each micro-step through the expert its
//! timesteps pick (Wan2.2 A14B with both experts), validation at fixed timesteps and the clip samples.
//! Image-to-video training of TI2V-5B (and the demo model) keeps each clip's first latent frame clean, denoised at
//! timestep 0 and left out of the loss, as Wan2.2 TI2V conditions on a start image.

use std::path::Path;

use crate::train::noise::StepRng;
use candle_core::{DType, Device, Tensor};

use crate::family::wan::cached::image_inputs;
use crate::family::wan::denoise::{first_frame_row, with_first_frame};
use crate::family::wan::experts::Experts;
use crate::family::wan::mode::StartFrame;
use crate::family::wan::samples::ClipSamples;
use crate::family::{FamilyRun, MicroStep, StepContext};
use crate::train::data::TrainItem;
use crate::train::optimizer::AdamW;
use crate::train::samples::{make_sample, SampleFiles, SampleSet};
use crate::train::step::{forward_loss, try_checkpointed_step, LossTarget, StepError};
use crate::train::timesteps::{
    is_high_noise, loss_weight, sample_expert_timesteps, sample_timesteps, TimestepDraw,
};
use crate::train::trainer::{mix, ExpertStep};
use crate::train::validation::{Validation, NOISE_STREAM};
use framesmith_config::training::{TimestepConfig, NUM_TRAIN_TIMESTEPS};
use framesmith_models::wan::{Timesteps, WanInputs};
use framesmith_nn::lora::LoraSet;

/// A batch made ready for the DiT: noisy inputs, flow-matching targets and loss weights.
pub(crate) struct FlowBatch {
    pub(crate) inputs: WanInputs,
    pub(crate) targets: Vec<Tensor>,
    pub(crate) weights: Vec<f64>,
    /// Leading latent frames left out of the loss (the given start frame).
    pub(crate) skip_frames: usize,
}

impl FlowBatch {
    pub(crate) fn target(&self) -> LossTarget<'_> {
        LossTarget {
            targets: &self.targets,
            weights: Some(&self.weights),
            skip_frames: self.skip_frames,
        }
    }
}

/// The models of a Wan run (or the demo model's), how its step conditions on a start image and its samples.
pub struct WanRun {
    pub(crate) experts: Experts,
    /// How the step conditions on a start image (`training.mode` on this model).
    pub(crate) start_frame: StartFrame,
    pub(crate) samples: Option<ClipSamples>,
}

impl WanRun {
    /// Noisy inputs, targets and weights of `batch` at `draws` (one per item), its noise drawn from `rng` item by
    /// item. Training and validation both go through here, so both compute the same loss.
    pub(crate) fn flow_batch(
        &self,
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StepRng,
        timesteps: &TimestepConfig,
    ) -> anyhow::Result<FlowBatch> {
        let cfg = self.experts.model.config();
        let (_, frames, _, _) = batch[0].latents.dims4()?;
        // A single-frame item (an image) has no frames after a start frame: it trains as text-to-image.
        let start_frame = self.start_frame.keeps_first_latent_frame() && frames > 1;
        let mut noisy = Vec::with_capacity(batch.len());
        let mut targets = Vec::with_capacity(batch.len());
        let mut rows = Vec::with_capacity(batch.len());
        for (item, draw) in batch.iter().zip(draws) {
            let x = item.latents.to_dtype(DType::F32)?;
            let noise = rng.normal(x.shape(), x.device())?;
            let mixed = ((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?;
            if start_frame {
                noisy.push(with_first_frame(&mixed, &x.narrow(1, 0, 1)?)?);
                let shape = x.dims4().map(|(c, f, h, w)| [c, f, h, w])?;
                rows.push(first_frame_row(cfg, shape, draw.model_timestep));
            } else {
                noisy.push(mixed);
            }
            targets.push((noise - x)?);
        }
        let timestep_input = if start_frame {
            Timesteps::PerToken(rows)
        } else {
            Timesteps::PerSample(draws.iter().map(|d| d.model_timestep).collect())
        };
        let weights: Vec<f64> = draws
            .iter()
            .map(|d| loss_weight(timesteps.weighting, d.model_timestep))
            .collect();
        let (y, clip) = image_inputs(batch, cfg)?;
        let inputs = WanInputs {
            latents: noisy,
            timesteps: timestep_input,
            context: batch.iter().map(|i| i.context.clone()).collect(),
            seq_len: None,
            clip,
            y,
        };
        Ok(FlowBatch {
            inputs,
            targets,
            weights,
            skip_frames: usize::from(start_frame),
        })
    }

    /// The loss of `item` at `draw` with noise from `rng`, forward only, through the expert for `high`.
    fn item_loss(
        &self,
        item: &TrainItem,
        (draw, high): (TimestepDraw, bool),
        rng: &mut StepRng,
        timesteps: &TimestepConfig,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f32> {
        let flow = self.flow_batch(&[item], &[draw], rng, timesteps)?;
        let flow = self.experts.on_expert_device(high, flow)?;
        forward_loss(
            self.experts.expert(high),
            &flow.inputs,
            &flow.target(),
            Some(interrupted),
        )
        .map_err(|e| match e {
            StepError::Interrupted => anyhow::Error::new(e),
            e => anyhow::Error::new(e).context(format!("validation on {}", item.key)),
        })
    }
}

impl FamilyRun for WanRun {
    fn device(&self) -> &Device {
        self.experts.model.device()
    }

    fn second_device(&self) -> Option<&Device> {
        self.experts.second_device()
    }

    fn second_lora(&self) -> Option<&(LoraSet, AdamW)> {
        self.experts.low_noise.as_ref().and_then(|l| l.own.as_ref())
    }

    fn second_lora_mut(&mut self) -> Option<&mut (LoraSet, AdamW)> {
        self.experts.low_noise.as_mut().and_then(|l| l.own.as_mut())
    }

    fn sync_lora(&self, loras: &LoraSet) -> anyhow::Result<()> {
        self.experts.sync_mirror(loras)
    }

    /// Noise, timesteps, the checkpointed step through the expert the timesteps pick, brought onto the GPU first.
    fn micro_step(
        &mut self,
        batch: &[&TrainItem],
        rng: &mut StepRng,
        ctx: &StepContext<'_>,
    ) -> anyhow::Result<MicroStep> {
        let (_, _, h, w) = batch[0].latents.dims4()?;
        let (high, draws) = match &self.experts.low_noise {
            Some(low) => {
                sample_expert_timesteps(ctx.timesteps, batch.len(), (h, w), rng, low.boundary)
            }
            None => (
                true,
                sample_timesteps(ctx.timesteps, batch.len(), (h, w), rng),
            ),
        };
        self.experts.use_expert(high)?;
        let flow = self.flow_batch(batch, &draws, rng, ctx.timesteps)?;
        let flow = self.experts.on_expert_device(high, flow)?;
        let (inputs, target) = (&flow.inputs, flow.target());
        let vars = self.experts.vars(high, ctx.loras);
        let expert = self.experts.expert(high);
        let result = match try_checkpointed_step(expert, inputs, &target, &vars, ctx.options) {
            Ok(mut out) => {
                out.grads = self
                    .experts
                    .gradients_home(high, std::mem::take(&mut out.grads))?;
                Ok(out)
            }
            Err(e) => Err(e),
        };
        Ok(MicroStep {
            second: !high,
            result,
        })
    }

    fn expert_step(&self, second: bool) -> Option<ExpertStep> {
        self.experts.low_noise.as_ref().map(|low| ExpertStep {
            name: if second { "low_noise" } else { "high_noise" },
            switches: low.switches,
            switch_secs: low.switch_secs,
        })
    }

    fn expert_switches(&self) -> usize {
        self.experts.low_noise.as_ref().map_or(0, |l| l.switches)
    }

    /// With both Wan2.2 experts, each timestep is evaluated by its own expert: the one on the GPU first.
    fn validation_loss(
        &mut self,
        v: &Validation,
        timesteps: &TimestepConfig,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<f64> {
        let sigmas = &v.plan.sigmas;
        let (sides, boundary) = match &self.experts.low_noise {
            Some(low) => {
                let current = low.model.is_parked();
                (vec![current, !current], low.boundary)
            }
            None => (vec![true], f64::NEG_INFINITY),
        };
        let mut sum = 0f64;
        for high in sides {
            self.experts.use_expert(high)?;
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
                    let rng = &mut StepRng::seeded(mix(v.plan.seed ^ NOISE_STREAM, pair));
                    sum += self.item_loss(item, (draw, high), rng, timesteps, interrupted)? as f64;
                }
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
            &mut self.experts,
            (i, dir, stem),
            cancelled,
        )
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
