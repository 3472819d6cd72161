//! Wan2.2 A14B with both experts in one run (`model.dit_low_noise`): the run's `model` is the high-noise
//! expert and the low-noise one waits here. Only one is on the GPU at a time: the other is parked in host RAM
//! (`WanModel::park`; its streamed blocks are there already) and brought back when a step's timestep needs it,
//! never reloaded from its file. `joint` trains one LoRA through both (the same adapters attached to both
//! experts' layers, as musubi-tuner does); `split` gives the low-noise expert a LoRA and an optimizer of its own.
//!
//! With `training.low_noise_device` the low-noise expert lives on a GPU of its own and neither is ever parked:
//! each step's inputs go to the GPU of the expert its timesteps pick. There `joint`'s shared LoRA has a mirror on
//! the second GPU: its gradients come back to the first, where the one optimizer steps, and the mirror is set equal
//! after every update (and after a resume), so the run learns what the one-GPU run does.

use candle_core::{Device, Tensor, Var};

use crate::family::wan::run::FlowBatch;
use crate::train::optimizer::AdamW;
use framesmith_models::wan::config::Expert;
use framesmith_models::wan::{WanConfig, WanModel};
use framesmith_nn::lora::LoraSet;

/// The low-noise expert of a run that trains both.
pub struct LowNoiseExpert {
    pub(crate) model: WanModel,
    /// `split`: the low-noise expert's own LoRA and optimizer; `joint`: `None` (it shares the high-noise one's).
    pub(crate) own: Option<(LoraSet, AdamW)>,
    /// `joint` with the expert on a device of its own: the shared LoRA's copy there.
    pub(crate) mirror: Option<LoraSet>,
    /// Whether it lives on a device of its own (`training.low_noise_device`): never parked.
    pub(crate) separate: bool,
    /// Timesteps (0..1000) below which this expert denoises.
    pub(crate) boundary: f64,
    /// How many times the experts changed places on the GPU, and the seconds that took.
    pub(crate) switches: usize,
    pub(crate) switch_secs: f64,
}

/// Makes the high-noise expert (`high`) or the low-noise one the expert on the GPU. The other is parked first,
/// so the two never hold the device together. Returns whether anything moved.
pub(crate) fn activate(
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
pub(crate) fn check_pair(
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

/// The DiT(s) of a Wan run: the model (with both Wan2.2 A14B experts, the high-noise one) and the low-noise
/// expert when the run trains both.
pub struct Experts {
    pub(crate) model: WanModel,
    pub(crate) low_noise: Option<LowNoiseExpert>,
}

impl Experts {
    /// The expert (the high-noise one, or the only model) that runs steps at timesteps on the `high` side.
    pub(crate) fn expert(&self, high: bool) -> &WanModel {
        match (&self.low_noise, high) {
            (Some(low), false) => &low.model,
            _ => &self.model,
        }
    }

    /// The trainable variables of the LoRA that the `high` or low-noise expert's steps update: `loras` (the run's
    /// first), the low-noise expert's own (`split`) or, on a low-noise expert of its own device, `joint`'s mirror.
    pub(crate) fn vars(&self, high: bool, loras: &LoraSet) -> Vec<Var> {
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
            _ => loras.vars(),
        }
    }

    /// The low-noise expert's device when it has one of its own.
    pub(crate) fn second_device(&self) -> Option<&Device> {
        self.low_noise
            .as_ref()
            .filter(|l| l.separate)
            .map(|l| l.model.device())
    }

    /// `batch` on the device of the expert for `high` (unchanged where it is there already).
    pub(crate) fn on_expert_device(
        &self,
        high: bool,
        batch: FlowBatch,
    ) -> anyhow::Result<FlowBatch> {
        let device = self.expert(high).device();
        Ok(FlowBatch {
            inputs: batch.inputs.to_device(device)?,
            targets: framesmith_nn::ops::all_to_device(&batch.targets, device)?,
            ..batch
        })
    }

    /// Gradients of `joint`'s mirror, brought to the shared LoRA's device (nothing to do for any other run).
    pub(crate) fn gradients_home(
        &self,
        high: bool,
        grads: Vec<Tensor>,
    ) -> anyhow::Result<Vec<Tensor>> {
        let mirrored = self.low_noise.as_ref().is_some_and(|l| l.mirror.is_some());
        if high || !mirrored {
            return Ok(grads);
        }
        Ok(framesmith_nn::ops::all_to_device(
            &grads,
            self.model.device(),
        )?)
    }

    /// Sets `joint`'s mirror equal to the shared LoRA `loras` (after an update or a resume; nothing without a
    /// mirror).
    pub(crate) fn sync_mirror(&self, loras: &LoraSet) -> anyhow::Result<()> {
        if let Some(mirror) = self.low_noise.as_ref().and_then(|l| l.mirror.as_ref()) {
            mirror.assign_from(loras)?;
        }
        Ok(())
    }

    /// Brings the expert for `high` onto the GPU (nothing for a one-model run).
    pub(crate) fn use_expert(&mut self, high: bool) -> anyhow::Result<()> {
        if let Some(low) = self.low_noise.as_mut() {
            activate(&mut self.model, low, high)?;
        }
        Ok(())
    }

    /// The Wan model that denoises timestep `t` (0..1000) of a sample, brought onto the GPU: with both Wan2.2
    /// experts, the high-noise one down to the boundary and the low-noise one from there.
    pub(crate) fn wan_for(&mut self, t: f64) -> anyhow::Result<&WanModel> {
        match self.low_noise.as_mut() {
            None => Ok(&self.model),
            Some(low) if t >= low.boundary => {
                activate(&mut self.model, low, true)?;
                Ok(&self.model)
            }
            Some(low) => {
                activate(&mut self.model, low, false)?;
                Ok(&low.model)
            }
        }
    }
}

#[cfg(test)]
mod tests;
