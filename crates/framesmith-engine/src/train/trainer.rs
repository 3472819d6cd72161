//! `Trainer`: one training run — the model with its LoRAs, the optimizer, schedules, the training set and the
//! step counter — advanced one optimizer step at a time by the engine thread. Flow matching as musubi-tuner does
//! it: noisy = (1 − t)·latents + t·noise, target = noise − latents, the loss in f32. Each micro-step's noise and
//! timesteps come from an RNG seeded by (seed, micro-step), so a resumed run draws exactly what the
//! uninterrupted run would have. Image-to-video training of TI2V-5B (and the demo model) keeps each clip's first
//! latent frame clean, denoised at timestep 0 and left out of the loss, as Wan2.2 TI2V conditions on a start image.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::generate::denoise::{first_frame_row, with_first_frame};
use crate::train::data::{image_inputs, TrainItem, TrainSet};
use crate::train::mode::StartFrame;
use crate::train::optimizer::{AdamW, StepOutcome};
use crate::train::run_model::RunModel;
use crate::train::step::{try_checkpointed_step, LossTarget, StepError, StepOptions, StepOutput};
use crate::train::timesteps::{
    loss_weight, sample_expert_timesteps, sample_timesteps, TimestepDraw,
};
use framesmith_config::run::Checkpointing;
use framesmith_config::schedule::LrSchedule;
use framesmith_config::training::TimestepConfig;
use framesmith_models::wan::{Timesteps, WanInputs};
use framesmith_nn::collective::{
    all_reduce_scalars, all_reduce_tensors, Collective, BUCKET_ELEMENTS,
};
use framesmith_nn::init::randn;
use framesmith_nn::lora::LoraSet;
use framesmith_nn::offload::SavedPlacement;

/// What one optimizer step did.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// Mean loss of the step's micro-batches; `None` when it was not finite.
    pub loss: Option<f64>,
    pub learning_rate: f64,
    pub epoch: usize,
    pub step_secs: f64,
    pub grad_norm: Option<f64>,
    /// Set when the update was skipped (non-finite loss or gradient).
    pub warning: Option<String>,
    /// With both Wan2.2 experts: which ran and the switches so far.
    pub expert: Option<ExpertStep>,
    /// A run over several GPUs: some rank was asked to stop, and every rank stops after this step.
    pub stop_requested: bool,
}

/// A step of a run with both Wan2.2 experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertStep {
    /// The expert the step's last micro-batch ran through (`high_noise`, `low_noise`).
    pub name: &'static str,
    /// How many times the experts have changed places on the GPU so far.
    pub switches: usize,
    /// Seconds spent changing them so far (parking one, bringing the other's blocks in).
    pub switch_secs: f64,
}

/// The mutable state of a run and everything needed to advance it.
pub struct Trainer {
    /// The DiT (for Wan2.2 A14B with both experts, the high-noise expert).
    pub(super) model: RunModel,
    /// Wan2.2 A14B's low-noise expert, when the run trains both.
    pub(super) low_noise: Option<crate::train::experts::LowNoiseExpert>,
    pub(super) loras: LoraSet,
    pub(super) optimizer: AdamW,
    pub(super) schedule: LrSchedule,
    pub(super) timesteps: TimestepConfig,
    pub(super) data: TrainSet,
    pub(super) seed: u64,
    pub(super) accumulation: usize,
    pub(super) total_steps: usize,
    pub(super) max_consecutive_nonfinite: usize,
    pub(super) step: usize,
    pub(super) consecutive_nonfinite: usize,
    /// Where saved block inputs wait (`memory.activations`, page-locked or pageable by `memory.streaming`).
    pub(super) saved_inputs: SavedPlacement,
    /// What the step keeps from each block's forward (`memory.checkpointing`); acts on every device.
    pub(super) checkpointing: Checkpointing,
    /// How the step conditions on a start image (`training.mode` on this model).
    pub(super) start_frame: StartFrame,
    /// What to change when the GPU runs out of memory (from the memory planner).
    pub(super) out_of_memory_advice: String,
    /// The memory planner's predicted peak VRAM for this run (CUDA runs with a plan).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) planned_vram_bytes: Option<u64>,
    /// Device memory held back beyond `memory.vram_budget_gb` for the run's lifetime.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) vram_reservation: Option<crate::train::setup::VramHold>,
    pub(super) outputs: crate::train::outputs::Outputs,
    pub(super) sampling: Option<crate::train::samples::Sampling>,
    /// The held-out items and when to evaluate them (`[validation]`).
    pub(super) validation: Option<crate::train::validation::Validation>,
    /// The ranks this run trains with ([`crate::train::ranks`]); `Solo` for one GPU.
    pub(super) collective: Arc<dyn Collective>,
}

/// A batch made ready for the DiT: noisy inputs, flow-matching targets and loss weights.
pub(super) struct FlowBatch {
    pub(super) inputs: WanInputs,
    pub(super) targets: Vec<Tensor>,
    pub(super) weights: Vec<f64>,
    /// Leading latent frames left out of the loss (the given start frame).
    pub(super) skip_frames: usize,
}

impl FlowBatch {
    pub(super) fn target(&self) -> LossTarget<'_> {
        LossTarget {
            targets: &self.targets,
            weights: Some(&self.weights),
            skip_frames: self.skip_frames,
        }
    }
}

/// SplitMix64 finaliser: decorrelates the per-micro-step seeds.
pub(super) fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed
        ^ index
            .wrapping_add(0x9E37_79B9_7F4A_7C15)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Trainer {
    /// Completed optimizer steps.
    pub fn step(&self) -> usize {
        self.step
    }

    pub fn total_steps(&self) -> usize {
        self.total_steps
    }

    /// How many processes (GPUs) train this run together.
    pub fn world(&self) -> usize {
        self.collective.world()
    }

    /// Whether this process writes the run's files (LoRAs, states, metrics, samples): rank 0 only.
    pub fn writes_outputs(&self) -> bool {
        self.collective.rank() == 0
    }

    /// Micro-batches an optimizer step takes over all ranks.
    pub(super) fn micro_per_step(&self) -> usize {
        self.accumulation * self.collective.world()
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// How many times the two Wan2.2 experts changed places on the GPU (0 for a one-model run).
    pub fn expert_switches(&self) -> usize {
        self.low_noise.as_ref().map_or(0, |l| l.switches)
    }

    /// A line on the device memory the run has used at most so far (the CUDA memory pool's high-water mark)
    /// next to the planner's prediction; `None` off CUDA.
    pub fn vram_line(&self) -> Option<String> {
        let held_back = self.vram_reservation.as_ref().map_or(0, |h| h.bytes);
        let used = crate::train::setup::VramUse::measure(self.device(), held_back)?;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let plan = match self.planned_vram_bytes {
            Some(plan) => format!(
                " (the plan predicted {:.2} GiB, {:+.1}%)",
                gib(plan),
                (used.peak as f64 / plan.max(1) as f64 - 1.0) * 100.0
            ),
            None => String::new(),
        };
        // A low-noise expert on a GPU of its own: that card's peak against the same plan (it holds one expert too).
        let second = match self
            .low_noise_device()
            .and_then(|d| crate::train::setup::VramUse::measure(d, 0))
        {
            Some(low) => format!(
                "; the low-noise expert's GPU: peak {:.2} GiB, {:.2} GiB held between steps, {:.2} GiB free",
                gib(low.peak),
                gib(low.in_use),
                gib(low.free)
            ),
            None => String::new(),
        };
        Some(format!(
            "VRAM: peak {:.2} GiB so far{plan}, {:.2} GiB of it outside the memory pool; {:.2} GiB held between \
             steps ({:.2} GiB reserved), {:.2} GiB of the card free{second}",
            gib(used.peak),
            gib(used.outside_pool),
            gib(used.in_use),
            gib(used.reserved),
            gib(used.free)
        ))
    }

    /// The LoRA adapters being trained.
    pub fn loras(&self) -> &LoraSet {
        &self.loras
    }

    /// The epoch (1-based) the next step trains in.
    pub fn epoch(&self) -> usize {
        let per_epoch = self.data.batches_per_epoch().max(1);
        self.step * self.micro_per_step() / per_epoch + 1
    }

    /// The options of every micro-step: the run's memory settings and the cancel poll.
    pub(super) fn step_options<'a>(&self, interrupted: &'a dyn Fn() -> bool) -> StepOptions<'a> {
        StepOptions {
            want_input_grads: false,
            interrupted: Some(interrupted),
            saved_inputs: self.saved_inputs,
            keep_attention: self.checkpointing.keeps_attention(),
            keep_projection: self.checkpointing.keeps_projection(),
            keep_tapes: self.checkpointing.keeps_tapes(),
            ..Default::default()
        }
    }

    /// Noisy inputs, targets and weights of `batch` at `draws` (one per item), its noise drawn from `rng` item by
    /// item. Training and validation both go through here, so both compute the same loss.
    pub(super) fn flow_batch(
        &self,
        batch: &[&TrainItem],
        draws: &[TimestepDraw],
        rng: &mut StdRng,
    ) -> anyhow::Result<FlowBatch> {
        let (_, frames, _, _) = batch[0].latents.dims4()?;
        // A single-frame item (an image) has no frames after a start frame: it trains as text-to-image.
        let start_frame = self.start_frame.keeps_first_latent_frame() && frames > 1;
        let mut noisy = Vec::with_capacity(batch.len());
        let mut targets = Vec::with_capacity(batch.len());
        let mut rows = Vec::with_capacity(batch.len());
        for (item, draw) in batch.iter().zip(draws) {
            let x = item.latents.to_dtype(DType::F32)?;
            let noise = randn(rng, x.shape(), 0.0, 1.0, x.device())?;
            let mixed = ((&x * (1.0 - draw.t))? + (&noise * draw.t)?)?;
            if start_frame {
                noisy.push(with_first_frame(&mixed, &x.narrow(1, 0, 1)?)?);
                let shape = x.dims4().map(|(c, f, h, w)| [c, f, h, w])?;
                rows.push(first_frame_row(
                    self.model.wan()?.config(),
                    shape,
                    draw.model_timestep,
                ));
            } else {
                noisy.push(mixed);
            }
            targets.push((noise - x)?);
        }
        let timesteps = if start_frame {
            Timesteps::PerToken(rows)
        } else {
            Timesteps::PerSample(draws.iter().map(|d| d.model_timestep).collect())
        };
        let weights: Vec<f64> = draws
            .iter()
            .map(|d| loss_weight(self.timesteps.weighting, d.model_timestep))
            .collect();
        let (y, clip) = image_inputs(batch, self.model.wan()?.config())?;
        let inputs = WanInputs {
            latents: noisy,
            timesteps,
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

    /// One micro-batch: noise, timesteps, the checkpointed step (through the expert the timesteps pick, brought
    /// onto the GPU first). Returns the micro-batch's epoch, whether it ran on the high-noise side (always, with
    /// one model), and the step's output, `None` when the loss was NaN or infinite (no backward pass was run).
    fn micro_step(
        &mut self,
        index: usize,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<(usize, bool, Option<StepOutput>)> {
        if matches!(self.model, RunModel::Flux { .. }) {
            return self.flux_micro_step(index, interrupted);
        }
        let (epoch, batch) = self.data.batch_at(index);
        let rng = &mut StdRng::seed_from_u64(mix(self.seed, index as u64));
        let (_, _, h, w) = batch[0].latents.dims4()?;
        let (high, draws) = match &self.low_noise {
            Some(low) => {
                sample_expert_timesteps(&self.timesteps, batch.len(), (h, w), rng, low.boundary)
            }
            None => (
                true,
                sample_timesteps(&self.timesteps, batch.len(), (h, w), rng),
            ),
        };
        if let Some(low) = self.low_noise.as_mut() {
            crate::train::experts::activate(self.model.wan_mut()?, low, high)?;
        }
        let flow = self.flow_batch(&batch, &draws, rng)?;
        let flow = self.on_expert_device(high, flow)?;
        let (inputs, target) = (&flow.inputs, flow.target());
        let vars = self.expert_vars(high);
        let options = self.step_options(interrupted);
        let result = try_checkpointed_step(self.expert(high)?, inputs, &target, &vars, &options);
        let mut out = step_output(result, &batch[0].key, &self.out_of_memory_advice)?;
        if let Some(out) = out.as_mut() {
            out.grads = self.gradients_home(high, std::mem::take(&mut out.grads))?;
        }
        Ok((epoch, high, out))
    }

    /// One optimizer step over `gradient_accumulation_steps` micro-batches (on each rank of a run over several
    /// GPUs, its share: see [`crate::train::ranks`]). A non-finite loss or gradient skips the update (the LoRA and
    /// optimizer state stay as they were) and is reported; too many in a row is an error. With several ranks a
    /// step is never cut short (the others would wait for it): `interrupted` is asked once, at the step's end,
    /// and any rank's stop stops every rank after the step (`StepReport::stop_requested`).
    pub fn train_step(&mut self, interrupted: &dyn Fn() -> bool) -> anyhow::Result<StepReport> {
        let started = Instant::now();
        // The last step's transient memory goes back to the driver: each step then needs what the first did.
        framesmith_nn::offload::release_cached_memory(self.device())?;
        if let Some(low) = self.low_noise_device() {
            framesmith_nn::offload::release_cached_memory(low)?;
        }
        // The summed gradients of each LoRA: the only (or joint, or high-noise) one, and a split run's low-noise one.
        let mut sums: [Option<Vec<Tensor>>; 2] = [None, None];
        let mut loss_sum = 0f64;
        let mut finite = true;
        let mut epoch = self.epoch();
        let split = self.split_experts();
        let mut last_high = true;
        let (rank, world) = (self.collective.rank(), self.collective.world());
        let per_step = self.micro_per_step();
        let never = || false;
        let micro_interrupted: &dyn Fn() -> bool = if world == 1 { interrupted } else { &never };
        for index in crate::train::ranks::micro_indices(self.step, self.accumulation, rank, world) {
            let (e, high, out) = self.micro_step(index, micro_interrupted)?;
            epoch = e;
            last_high = high;
            let sum = &mut sums[usize::from(split && !high)];
            let Some(out) = out else {
                finite = false;
                continue;
            };
            loss_sum += out.loss as f64;
            // The mean over the step's micro-batches of every rank (the all-reduce below sums them).
            let scaled = out
                .grads
                .iter()
                .map(|g| g / per_step as f64)
                .collect::<candle_core::Result<Vec<_>>>()?;
            *sum = Some(match sum.take() {
                None => scaled,
                Some(acc) => acc
                    .iter()
                    .zip(&scaled)
                    .map(|(a, b)| a + b)
                    .collect::<candle_core::Result<Vec<_>>>()?,
            });
        }
        let mut stop_requested = false;
        if world > 1 {
            // The epoch of the step's last micro-batch over all ranks, as one process would report it.
            epoch = ((self.step + 1) * per_step - 1) / self.data.batches_per_epoch().max(1) + 1;
            (sums, loss_sum, finite, stop_requested) =
                self.reduce_over_ranks(sums, loss_sum, finite, interrupted())?;
        }
        let learning_rate = self.schedule.lr_at(self.step);
        let outcome = if finite {
            match self.apply_grads(sums, learning_rate)? {
                Some(outcome) => Some(outcome),
                None => anyhow::bail!("no micro-batches in a step"),
            }
        } else {
            None
        };
        self.sync_mirror()?;
        let step_number = self.step + 1;
        self.step = step_number;
        let (grad_norm, warning) = match outcome {
            Some(StepOutcome::Applied { grad_norm, .. }) => {
                self.consecutive_nonfinite = 0;
                (Some(grad_norm), None)
            }
            other => {
                self.consecutive_nonfinite += 1;
                let what = match other {
                    Some(StepOutcome::Skipped { .. }) => "a gradient",
                    _ => "the loss",
                };
                (
                    None,
                    Some(format!(
                        "step {step_number}: {what} was NaN or infinite; the update was skipped and the LoRA \
                         keeps its last good values ({} in a row)",
                        self.consecutive_nonfinite
                    )),
                )
            }
        };
        let loss = finite.then_some(loss_sum / per_step as f64);
        let report = StepReport {
            loss,
            learning_rate,
            epoch,
            step_secs: started.elapsed().as_secs_f64(),
            grad_norm,
            warning,
            expert: self.low_noise.as_ref().map(|low| ExpertStep {
                name: if last_high { "high_noise" } else { "low_noise" },
                switches: low.switches,
                switch_secs: low.switch_secs,
            }),
            stop_requested,
        };
        if self.writes_outputs() {
            self.outputs.append_metrics(step_number, &report)?;
        }
        if self.consecutive_nonfinite >= self.max_consecutive_nonfinite.max(1) {
            anyhow::bail!(
                "stopped after {} non-finite steps in a row (last at step {step_number}). The last good LoRA was \
                 kept. Lower optimizer.learning_rate, check the dataset caches for corrupt latents, or use \
                 model.residual_dtype = \"f32\"",
                self.consecutive_nonfinite
            );
        }
        Ok(report)
    }

    /// Sums, over the ranks, the step's gradients (bucketed), its loss, whether it was finite and whether a rank
    /// was asked to stop. A LoRA that no rank has gradients for (a split run's expert none of whose micro-batches
    /// ran) stays `None`; one only some ranks have is completed with zeros on the others. Every rank then holds
    /// the same numbers, so every rank takes the same optimizer step.
    #[allow(clippy::type_complexity)]
    fn reduce_over_ranks(
        &self,
        mut sums: [Option<Vec<Tensor>>; 2],
        loss_sum: f64,
        finite: bool,
        stop: bool,
    ) -> anyhow::Result<([Option<Vec<Tensor>>; 2], f64, bool, bool)> {
        let c = &*self.collective;
        let flag = |b: bool| if b { 1f32 } else { 0f32 };
        let local = [
            loss_sum as f32,
            flag(!finite),
            flag(sums[0].is_some()),
            flag(sums[1].is_some()),
            flag(stop),
        ];
        let stats = all_reduce_scalars(c, &local, self.device())?;
        let finite = stats[1] == 0.0;
        let mut reduced: [Option<Vec<Tensor>>; 2] = [None, None];
        if finite {
            for (side, out) in reduced.iter_mut().enumerate() {
                if stats[2 + side] == 0.0 {
                    continue;
                }
                let grads = match sums[side].take() {
                    Some(g) => g,
                    None => self
                        .expert_vars(side == 0)
                        .iter()
                        .map(|v| Tensor::zeros(v.shape(), DType::F32, v.device()))
                        .collect::<candle_core::Result<Vec<_>>>()?,
                };
                *out = Some(all_reduce_tensors(c, &grads, BUCKET_ELEMENTS)?);
            }
        }
        Ok((reduced, stats[0] as f64, finite, stats[4] > 0.0))
    }

    /// Whether a periodic save falls on the step just completed.
    pub fn save_due(&self) -> bool {
        self.outputs.save_due(self.step, self.epoch_boundary())
    }

    /// Whether a periodic sample falls on the step just completed.
    pub fn sample_due(&self) -> bool {
        self.writes_outputs()
            && self
                .sampling
                .as_ref()
                .is_some_and(|s| s.due(self.step, self.epoch_boundary()))
    }

    /// Whether to sample before the first step.
    pub fn sample_at_start(&self) -> bool {
        self.writes_outputs()
            && self.step == 0
            && self.sampling.as_ref().is_some_and(|s| s.at_first)
    }

    /// The epoch just completed, when the step just completed ended one.
    pub(super) fn epoch_boundary(&self) -> Option<usize> {
        let per_epoch = self.data.batches_per_epoch().max(1);
        let per_step = self.micro_per_step();
        let micro = self.step * per_step;
        (self.step > 0 && micro % per_epoch < per_step).then_some(micro / per_epoch)
    }

    /// Where outputs go (the run's own folder).
    pub fn output_dir(&self) -> PathBuf {
        self.outputs.dir.clone()
    }

    /// A new run that ends before its first step leaves no run folder behind (`Outputs::abandon_unused`).
    pub fn abandon_unused_outputs(&mut self) {
        if self.step == 0 && self.writes_outputs() {
            self.outputs.abandon_unused();
        }
    }
}

/// A micro-step's output, `None` for a non-finite loss (the step is skipped); a stop, an out-of-memory failure (with
/// `advice`) or another error on the item `key` is an error.
pub(super) fn step_output(
    result: Result<StepOutput, StepError>,
    key: &str,
    advice: &str,
) -> anyhow::Result<Option<StepOutput>> {
    match result {
        Ok(out) => Ok(Some(out)),
        Err(StepError::NonFiniteLoss(_)) => Ok(None),
        Err(e @ StepError::Interrupted) => Err(e.into()),
        Err(StepError::OutOfMemory(oom)) => Err(anyhow::anyhow!(
            "the GPU ran out of memory during the training step on {key} ({}). {advice}",
            oom.summary()
        )),
        Err(StepError::Candle(e)) => {
            Err(anyhow::Error::new(e).context(format!("training step on {key}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mix;

    #[test]
    fn micro_step_seeds_differ() {
        let seeds: std::collections::HashSet<u64> = (0..1000).map(|i| mix(42, i)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_ne!(mix(1, 0), mix(2, 0));
    }
}
