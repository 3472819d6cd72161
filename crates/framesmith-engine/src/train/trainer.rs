//! `Trainer`: one training run — the family's models with their LoRAs, the optimizer, schedules, the training set
//! and the step counter — advanced one optimizer step at a time by the engine thread. Each micro-step's noise and
//! timesteps come from an RNG seeded by (seed, micro-step), so a resumed run draws exactly what the
//! uninterrupted run would have; what a micro-step computes is the family's ([`crate::family::FamilyRun`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use crate::family::{FamilyRun, StepContext};
use crate::train::data::TrainSet;
use crate::train::optimizer::{AdamW, StepOutcome};
use crate::train::step::{StepError, StepOptions, StepOutput};
use framesmith_config::run::Checkpointing;
use framesmith_config::schedule::LrSchedule;
use framesmith_config::training::TimestepConfig;
use framesmith_nn::collective::{
    all_reduce_scalars, all_reduce_tensors, Collective, BUCKET_ELEMENTS,
};
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
    /// With two experts in the run: which ran and the switches so far.
    pub expert: Option<ExpertStep>,
    /// A run over several GPUs: some rank was asked to stop, and every rank stops after this step.
    pub stop_requested: bool,
}

/// A step of a run with two experts (models that take turns on the GPU by timestep).
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
    /// The family's models: the micro-step, validation and samples go through them.
    pub(crate) family: Box<dyn FamilyRun>,
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
    /// What to change when the GPU runs out of memory (from the memory planner).
    pub(super) out_of_memory_advice: String,
    /// The memory planner's predicted peak VRAM for this run (CUDA runs with a plan).
    pub(super) planned_vram_bytes: Option<u64>,
    /// The plan's peak VRAM while sampling (a run that samples, with a plan).
    pub(super) planned_sampling_vram_bytes: Option<u64>,
    /// Device memory held back beyond `memory.vram_budget_gb` for the run's lifetime.
    pub(super) vram_reservation: Option<framesmith_nn::device::VramHold>,
    pub(super) outputs: crate::train::outputs::Outputs,
    pub(super) sampling: Option<crate::train::samples::Sampling>,
    /// The held-out items and when to evaluate them (`[validation]`).
    pub(super) validation: Option<crate::train::validation::Validation>,
    /// The ranks this run trains with ([`crate::train::ranks`]); `Solo` for one GPU.
    pub(super) collective: Arc<dyn Collective>,
    /// The run's start, in parts, until its first step is reported.
    pub(super) startup: crate::train::startup::Startup,
    /// The run's VRAM peak from before the pool's mark was last restarted (before a sampling round).
    pub(super) vram_peak: crate::train::vram_peak::RunPeak,
    /// The step's page-locked activation buffers, being set aside beside the setup until the first step.
    pub(super) activation_buffers: Option<framesmith_nn::offload::ActivationBuffers>,
    /// The next micro-step's noise, drawn on a helper thread while this one runs.
    pub(super) noise: crate::train::noise::NoiseAhead,
    /// When each step starts from a trimmed memory pool, on the run's device and on a second model's.
    pub(super) pool_trims: [framesmith_nn::offload::StepTrim; 2],
}

/// SplitMix64 finaliser: decorrelates the per-micro-step seeds.
pub(crate) fn mix(seed: u64, index: u64) -> u64 {
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
        self.family.device()
    }

    /// How many times the run's two experts changed places on the GPU (0 for a one-model run).
    pub fn expert_switches(&self) -> usize {
        self.family.expert_switches()
    }

    /// The memory the run holds back beyond its VRAM budget, on the GPU as NVML numbers it (the app charts the
    /// card as one of the budget's size); `None` without a hold or where the GPU cannot be matched.
    pub fn vram_hold(&self) -> Option<framesmith_config::protocol::memory::VramHold> {
        let hold = self.vram_reservation.as_ref()?;
        let candle_core::DeviceLocation::Cuda { gpu_id } = self.device().location() else {
            return None;
        };
        Some(framesmith_config::protocol::memory::VramHold {
            gpu: crate::plan::machine::nvml_index(gpu_id)?,
            held_bytes: hold.bytes,
            budget_bytes: hold.budget,
        })
    }

    /// A line on the device memory the run has used at most so far (the CUDA memory pool's high-water mark, and
    /// the peak from before its restarts) next to the planner's prediction, and the tensors' own peak (what the pool
    /// handed out at most, so the rest of the peak is the pool's fragmentation and what lives outside it); `None`
    /// off CUDA.
    pub fn vram_line(&self) -> Option<String> {
        self.vram_line_against("VRAM", ("the plan", self.planned_vram_bytes), false)
    }

    /// [`Trainer::vram_line`] after a sampling round, next to the plan's sampling phase: the round's own peak (the
    /// pool's mark restarted before it, [`Trainer::restart_vram_peak`]).
    pub fn sampling_vram_line(&self) -> Option<String> {
        let planned = match self.planned_sampling_vram_bytes {
            Some(bytes) => ("the plan's sampling phase", Some(bytes)),
            None => ("the plan", self.planned_vram_bytes),
        };
        self.vram_line_against(
            &format!("VRAM after sampling at step {}", self.step),
            planned,
            true,
        )
    }

    /// The VRAM line, opening with `label`, beside what `(whose, bytes)` of the plan predicted: the peak of the
    /// sampling round just done (`round`), else the run's so far.
    fn vram_line_against(
        &self,
        label: &str,
        (whose, planned): (&str, Option<u64>),
        round: bool,
    ) -> Option<String> {
        let held_back = self.vram_reservation.as_ref().map_or(0, |h| h.bytes);
        let mut used = framesmith_nn::device::VramUse::measure(self.device(), held_back)?;
        let when = if round {
            "while sampling"
        } else {
            used.peak = self.vram_peak.so_far(used.peak);
            "so far"
        };
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        // The pool's handed-out mark is not restarted for a sampling round, so only the run's line gives it.
        let tensors = if round {
            String::new()
        } else {
            format!(
                "; the tensors' own peak {:.2} GiB (the pool's in-use high-water)",
                gib(used.peak_used)
            )
        };
        let plan = match planned {
            Some(plan) => format!(
                " ({whose} predicted {:.2} GiB, {:+.1}%)",
                gib(plan),
                (used.peak as f64 / plan.max(1) as f64 - 1.0) * 100.0
            ),
            None => String::new(),
        };
        // A low-noise expert on a GPU of its own: that card's peak against the same plan (it holds one expert too).
        let second = match self
            .family
            .second_device()
            .and_then(|d| framesmith_nn::device::VramUse::measure(d, 0))
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
            "{label}: peak {:.2} GiB {when}{plan}, {:.2} GiB of it outside the memory pool; {:.2} GiB held between \
             steps ({:.2} GiB reserved), {:.2} GiB of the card free{second}{tensors}",
            gib(used.peak),
            gib(used.outside_pool),
            gib(used.in_use),
            gib(used.reserved),
            gib(used.free)
        ))
    }

    /// The run's family models as the family's own type (tests look inside them).
    #[cfg(test)]
    pub(crate) fn family_run<T: 'static>(&self) -> &T {
        self.family
            .as_any()
            .downcast_ref()
            .expect("a run of the family the test started")
    }

    /// The run's training set (tests look at its batches).
    #[cfg(test)]
    pub(crate) fn train_set(&self) -> &TrainSet {
        &self.data
    }

    /// How the run draws and weights timesteps (tests draw the same).
    #[cfg(test)]
    pub(crate) fn timestep_config(&self) -> &TimestepConfig {
        &self.timesteps
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
            return_input_grads: false,
            interrupted: Some(interrupted),
            saved_inputs: self.saved_inputs,
            keep_attention: self.checkpointing.keeps_attention(),
            keep_projection: self.checkpointing.keeps_projection(),
            keep_tapes: self.checkpointing.keeps_tapes(),
            ..Default::default()
        }
    }

    /// One micro-batch through the family's step, its noise and timesteps from the micro-step's seed. Returns
    /// the micro-batch's epoch, whether it ran through the run's second model, and the step's output, `None` when
    /// the loss was NaN or infinite (no backward pass was run).
    fn micro_step(
        &mut self,
        index: usize,
        interrupted: &dyn Fn() -> bool,
    ) -> anyhow::Result<(usize, bool, Option<StepOutput>)> {
        let (epoch, batch) = self.data.batch_at(index);
        let next = self
            .next_micro_index(index)
            .map(|i| mix(self.seed, i as u64));
        let mut rng = self.noise.stream(mix(self.seed, index as u64), next);
        let options = self.step_options(interrupted);
        let ctx = StepContext {
            timesteps: &self.timesteps,
            loras: &self.loras,
            options: &options,
        };
        let step = self.family.micro_step(&batch, &mut rng, &ctx)?;
        self.noise.record(rng);
        let out = step_output(step.result, &batch[0].key, &self.out_of_memory_advice)?;
        Ok((epoch, step.second, out))
    }

    /// The micro-step this rank runs after `index` (one of the current step's), `None` after the run's last.
    fn next_micro_index(&self, index: usize) -> Option<usize> {
        let (rank, world) = (self.collective.rank(), self.collective.world());
        let indices =
            |step| crate::train::ranks::micro_indices(step, self.accumulation, rank, world);
        if index + 1 < indices(self.step).end {
            return Some(index + 1);
        }
        (self.step + 1 < self.total_steps).then(|| indices(self.step + 1).start)
    }

    /// The gradient norm of an applied update, or the warning of a skipped one (whose count in a row it keeps).
    fn count_nonfinite(
        &mut self,
        outcome: Option<StepOutcome>,
        step_number: usize,
    ) -> (Option<f64>, Option<String>) {
        match outcome {
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
        }
    }

    /// One optimizer step over `gradient_accumulation_steps` micro-batches (on each rank of a run over several
    /// GPUs, its share: see [`crate::train::ranks`]). A non-finite loss or gradient skips the update (the LoRA and
    /// optimizer state stay as they were) and is reported; too many in a row is an error. With several ranks a
    /// step is never cut short (the others would wait for it): `interrupted` is asked once, at the step's end,
    /// and any rank's stop stops every rank after the step (`StepReport::stop_requested`).
    pub fn train_step(&mut self, interrupted: &dyn Fn() -> bool) -> anyhow::Result<StepReport> {
        let started = Instant::now();
        // The last step's transient memory goes back to the driver where keeping it could make this step need
        // more than the first did (`StepTrim`).
        self.pool_trims[0].before_step(self.family.device())?;
        if let Some(low) = self.family.second_device() {
            self.pool_trims[1].before_step(low)?;
        }
        // The summed gradients of each LoRA: the only (or joint, or high-noise) one, and a split run's low-noise one.
        let mut sums: [Option<Vec<Tensor>>; 2] = [None, None];
        let mut loss_sum = 0f64;
        let mut finite = true;
        let mut epoch = self.epoch();
        let split = self.family.second_lora().is_some();
        let mut last_second = false;
        let (rank, world) = (self.collective.rank(), self.collective.world());
        let per_step = self.micro_per_step();
        let never = || false;
        let micro_interrupted: &dyn Fn() -> bool = if world == 1 { interrupted } else { &never };
        for index in crate::train::ranks::micro_indices(self.step, self.accumulation, rank, world) {
            let (e, second, out) = self.micro_step(index, micro_interrupted)?;
            epoch = e;
            last_second = second;
            let sum = &mut sums[usize::from(split && second)];
            let Some(out) = out else {
                finite = false;
                continue;
            };
            loss_sum += out.loss as f64;
            // The mean over the step's micro-batches of every rank (the all-reduce below sums them).
            add_divided(sum, &out.grads, per_step as f64)?;
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
        self.family.sync_lora(&self.loras)?;
        let step_number = self.step + 1;
        self.step = step_number;
        let (grad_norm, warning) = self.count_nonfinite(outcome, step_number);
        let loss = finite.then_some(loss_sum / per_step as f64);
        let report = StepReport {
            loss,
            learning_rate,
            epoch,
            step_secs: started.elapsed().as_secs_f64(),
            grad_norm,
            warning,
            expert: self.family.expert_step(last_second),
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
                        .lora_vars(side)
                        .iter()
                        .map(|v| Tensor::zeros(v.shape(), DType::F32, v.device()))
                        .collect::<candle_core::Result<Vec<_>>>()?,
                };
                *out = Some(all_reduce_tensors(c, &grads, BUCKET_ELEMENTS)?);
            }
        }
        Ok((reduced, stats[0] as f64, finite, stats[4] > 0.0))
    }

    /// The trainable variables of the run's LoRA (`side` 0) or of its second one (`side` 1, when it has one).
    fn lora_vars(&self, side: usize) -> Vec<candle_core::Var> {
        match (side, self.family.second_lora()) {
            (1, Some((loras, _))) => loras.vars(),
            _ => self.loras.vars(),
        }
    }

    /// Applies the step's summed gradients: `grads[0]` to the run's (first) LoRA, `grads[1]` to its second one.
    /// A LoRA none of whose micro-batches ran is not stepped (its optimizer's step count stays). The outcome joins
    /// both: skipped when either was, the norm over both.
    fn apply_grads(
        &mut self,
        grads: [Option<Vec<Tensor>>; 2],
        learning_rate: f64,
    ) -> anyhow::Result<Option<StepOutcome>> {
        let [first, second] = grads;
        let mut outcomes = Vec::new();
        if let Some(g) = first {
            outcomes.push(self.optimizer.step(&g, learning_rate)?);
        }
        if let Some(g) = second {
            let Some((_, optimizer)) = self.family.second_lora_mut() else {
                anyhow::bail!("gradients for a second LoRA in a run without one");
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

/// Adds `grads` divided by `divisor` to `sum` (which starts empty). A divisor of 1 (one micro-batch per step) takes
/// the gradients as they are: dividing by 1 is exact, and skipping it saves a kernel per tensor.
fn add_divided(
    sum: &mut Option<Vec<Tensor>>,
    grads: &[Tensor],
    divisor: f64,
) -> candle_core::Result<()> {
    let scaled = if divisor == 1.0 {
        grads.to_vec()
    } else {
        grads
            .iter()
            .map(|g| g / divisor)
            .collect::<candle_core::Result<Vec<_>>>()?
    };
    *sum = Some(match sum.take() {
        None => scaled,
        Some(acc) => acc
            .iter()
            .zip(&scaled)
            .map(|(a, b)| a + b)
            .collect::<candle_core::Result<Vec<_>>>()?,
    });
    Ok(())
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
