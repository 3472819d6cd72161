//! Wan2.2 A14B with both experts in one run (`model.dit_low_noise`): the trainer's `model` is the high-noise
//! expert and the low-noise one waits here. Only one is on the GPU at a time: the other is parked in host RAM
//! (`WanModel::park`; its streamed blocks are there already) and brought back when a step's timestep needs it,
//! never reloaded from its file. `joint` trains one LoRA through both (the same adapters attached to both
//! experts' layers, as musubi-tuner does); `split` gives the low-noise expert a LoRA and an optimizer of its own.
//!
//! With `training.low_noise_device` the low-noise expert lives on a GPU of its own and neither is ever parked:
//! each step's inputs go to the GPU of the expert its timesteps pick. There `joint`'s shared LoRA has a mirror on
//! the second GPU: its gradients come back to the first, where the one optimizer steps, and the mirror is set equal
//! after every update (and after a resume), so the run learns what the one-GPU run does.

use candle_core::Var;

use crate::train::optimizer::{AdamW, StepOutcome};
use crate::train::trainer::Trainer;
use framesmith_models::wan::config::Expert;
use framesmith_models::wan::{WanConfig, WanModel};
use framesmith_nn::lora::LoraSet;

/// The low-noise expert of a run that trains both.
pub struct LowNoiseExpert {
    pub(super) model: WanModel,
    /// `split`: the low-noise expert's own LoRA and optimizer; `joint`: `None` (it shares the high-noise one's).
    pub(super) own: Option<(LoraSet, AdamW)>,
    /// `joint` with the expert on a device of its own: the shared LoRA's copy there.
    pub(super) mirror: Option<LoraSet>,
    /// Whether it lives on a device of its own (`training.low_noise_device`): never parked.
    pub(super) separate: bool,
    /// Timesteps (0..1000) below which this expert denoises.
    pub(super) boundary: f64,
    /// How many times the experts changed places on the GPU, and the seconds that took.
    pub(super) switches: usize,
    pub(super) switch_secs: f64,
}

/// Makes the high-noise expert (`high`) or the low-noise one the expert on the GPU. The other is parked first,
/// so the two never hold the device together. Returns whether anything moved.
pub(super) fn activate(
    high: &mut WanModel,
    low: &mut LowNoiseExpert,
    want_high: bool,
) -> anyhow::Result<bool> {
    if low.separate {
        return Ok(false);
    }
    let (going, coming) = if want_high {
        (&mut low.model, high)
    } else {
        (high, &mut low.model)
    };
    let started = std::time::Instant::now();
    if !coming.take_over_from(going)? {
        return Ok(false);
    }
    coming.device().synchronize()?;
    low.switches += 1;
    low.switch_secs += started.elapsed().as_secs_f64();
    Ok(true)
}

/// Checks the two files of a run that trains both experts: Wan2.2 A14B experts of one configuration, given in
/// the right keys. `names` are the files' variant names, `hints` the experts their paths or files name.
pub(super) fn check_pair(
    high: &WanConfig,
    low: &WanConfig,
    hints: [Option<Expert>; 2],
    paths: [&std::path::Path; 2],
) -> anyhow::Result<()> {
    let [dit, dit_low] = paths;
    if hints == [Some(Expert::LowNoise), Some(Expert::HighNoise)] {
        anyhow::bail!(
            "model.dit names the low-noise expert and model.dit_low_noise the high-noise one: swap them (model.dit \
             = {}, model.dit_low_noise = {})",
            dit_low.display(),
            dit.display()
        );
    }
    if let [_, Some(Expert::HighNoise)] = hints {
        anyhow::bail!(
            "model.dit_low_noise names the high-noise expert; point it at the low-noise expert (low_noise_model/ \
             of the Wan2.2 A14B download): {}",
            dit_low.display()
        );
    }
    if let [Some(Expert::LowNoise), _] = hints {
        anyhow::bail!(
            "model.dit names the low-noise expert; with model.dit_low_noise set, model.dit is the high-noise \
             expert (high_noise_model/ of the Wan2.2 A14B download): {}",
            dit.display()
        );
    }
    if high != low {
        anyhow::bail!(
            "the two experts differ in shape, so they are not the two experts of one Wan2.2 A14B model: pick the \
             high_noise_model/ and low_noise_model/ of the same download ({} and {})",
            dit.display(),
            dit_low.display()
        );
    }
    if high.generation != framesmith_models::wan::Generation::Wan22
        || high.model_type == framesmith_models::wan::ModelType::Ti2v
    {
        anyhow::bail!(
            "model.dit_low_noise is for Wan2.2 A14B (T2V-A14B or I2V-A14B), which has two experts; this model has \
             one: remove model.dit_low_noise ({})",
            dit_low.display()
        );
    }
    Ok(())
}

impl Trainer {
    /// The expert (the high-noise one, or the only model) that runs steps at timesteps on the `high` side.
    pub(super) fn expert(&self, high: bool) -> anyhow::Result<&WanModel> {
        match (&self.low_noise, high) {
            (Some(low), false) => Ok(&low.model),
            _ => self.model.wan(),
        }
    }

    /// The trainable variables of the LoRA that the `high` or low-noise expert's steps update (on a low-noise
    /// expert of its own device, `joint`'s mirror there).
    pub(super) fn expert_vars(&self, high: bool) -> Vec<Var> {
        match (&self.low_noise, high) {
            (
                Some(LowNoiseExpert {
                    own: Some((loras, _)),
                    ..
                }),
                false,
            ) => loras.vars(),
            (
                Some(LowNoiseExpert {
                    mirror: Some(mirror),
                    ..
                }),
                false,
            ) => mirror.vars(),
            _ => self.loras.vars(),
        }
    }

    /// The low-noise expert's device when it has one of its own.
    pub(super) fn low_noise_device(&self) -> Option<&candle_core::Device> {
        self.low_noise
            .as_ref()
            .filter(|l| l.separate)
            .map(|l| l.model.device())
    }

    /// `batch` on the device of the expert for `high` (unchanged where it is there already).
    pub(super) fn on_expert_device(
        &self,
        high: bool,
        batch: crate::train::trainer::FlowBatch,
    ) -> anyhow::Result<crate::train::trainer::FlowBatch> {
        let device = self.expert(high)?.device();
        Ok(crate::train::trainer::FlowBatch {
            inputs: batch.inputs.to_device(device)?,
            targets: framesmith_nn::ops::all_to_device(&batch.targets, device)?,
            ..batch
        })
    }

    /// Gradients of `joint`'s mirror, brought to the shared LoRA's device (nothing to do for any other run).
    pub(super) fn gradients_home(
        &self,
        high: bool,
        grads: Vec<candle_core::Tensor>,
    ) -> anyhow::Result<Vec<candle_core::Tensor>> {
        let mirrored = self.low_noise.as_ref().is_some_and(|l| l.mirror.is_some());
        if high || !mirrored {
            return Ok(grads);
        }
        Ok(framesmith_nn::ops::all_to_device(&grads, self.device())?)
    }

    /// Sets `joint`'s mirror equal to the shared LoRA (after an update or a resume; nothing without a mirror).
    pub(super) fn sync_mirror(&self) -> anyhow::Result<()> {
        if let Some(mirror) = self.low_noise.as_ref().and_then(|l| l.mirror.as_ref()) {
            mirror.assign_from(&self.loras)?;
        }
        Ok(())
    }

    /// Brings the expert for `high` onto the GPU (nothing for a one-model run).
    pub(super) fn use_expert(&mut self, high: bool) -> anyhow::Result<()> {
        if let Some(low) = self.low_noise.as_mut() {
            activate(self.model.wan_mut()?, low, high)?;
        }
        Ok(())
    }

    /// Whether a run trains both experts with a LoRA each.
    pub(super) fn split_experts(&self) -> bool {
        self.low_noise.as_ref().is_some_and(|l| l.own.is_some())
    }

    /// Applies the step's summed gradients: `grads[0]` to the high-noise (or only, or joint) LoRA, `grads[1]` to
    /// the low-noise expert's own LoRA. An expert none of whose micro-batches ran is not stepped (its optimizer's
    /// step count stays). The outcome joins both: skipped when either was, the norm over both.
    pub(super) fn apply_grads(
        &mut self,
        grads: [Option<Vec<candle_core::Tensor>>; 2],
        learning_rate: f64,
    ) -> anyhow::Result<Option<StepOutcome>> {
        let [first, second] = grads;
        let mut outcomes = Vec::new();
        if let Some(g) = first {
            outcomes.push(self.optimizer.step(&g, learning_rate)?);
        }
        if let Some(g) = second {
            let Some((_, optimizer)) = self.low_noise.as_mut().and_then(|l| l.own.as_mut()) else {
                anyhow::bail!("low-noise gradients in a run without a low-noise LoRA");
            };
            outcomes.push(optimizer.step(&g, learning_rate)?);
        }
        let mut squares = 0f64;
        let mut skipped = false;
        for outcome in &outcomes {
            let norm = match *outcome {
                StepOutcome::Applied { grad_norm, .. } => grad_norm,
                StepOutcome::Skipped { grad_norm } => {
                    skipped = true;
                    grad_norm
                }
            };
            squares += norm * norm;
        }
        let grad_norm = squares.sqrt();
        Ok(match outcomes.len() {
            0 => None,
            1 => outcomes.pop(),
            _ if skipped => Some(StepOutcome::Skipped { grad_norm }),
            _ => Some(StepOutcome::Applied {
                grad_norm,
                clip_scale: 1.0,
            }),
        })
    }
}
