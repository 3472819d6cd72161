//! Flow-matching samplers: the official multistep schedulers (UniPC and DPM-Solver++, ported from the reference
//! code's `utils/fm_solvers*.py`) and a plain Euler sampler, behind one [`FlowScheduler`] trait, and the
//! [`Solver`] a request picks among them. Pure tensor code: no channels, config files or logging.

mod dpmpp;
mod euler;
mod schedule;
mod unipc;

use candle_core::{Device, Result, Tensor};
use serde::{Deserialize, Serialize};

pub use dpmpp::FlowDpmSolverScheduler;
pub use euler::FlowEulerScheduler;
pub use schedule::{
    np_linspace, sampling_sigmas, torch_linspace_f32, FlowSchedule, SchedulerConfig,
};
pub use unipc::FlowUniPcScheduler;

/// Sampling solver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Solver {
    Unipc,
    Dpmpp,
    Euler,
}

impl Solver {
    /// Every solver by the name configs and the command line give it.
    pub const NAMES: [&'static str; 3] = ["unipc", "dpmpp", "euler"];

    /// A fresh scheduler of this solver with the official settings.
    pub fn scheduler(self) -> Box<dyn FlowScheduler> {
        let cfg = SchedulerConfig::default();
        match self {
            Solver::Unipc => Box::new(FlowUniPcScheduler::new(cfg)),
            Solver::Dpmpp => Box::new(FlowDpmSolverScheduler::new(cfg)),
            Solver::Euler => Box::new(FlowEulerScheduler::new(cfg)),
        }
    }
}

impl std::str::FromStr for Solver {
    type Err = String;

    /// A solver by its name ([`Solver::NAMES`], any case).
    fn from_str(name: &str) -> std::result::Result<Self, String> {
        match name.to_ascii_lowercase().as_str() {
            "unipc" => Ok(Solver::Unipc),
            "dpmpp" => Ok(Solver::Dpmpp),
            "euler" => Ok(Solver::Euler),
            _ => Err(format!(
                "unknown solver `{name}`: use one of {}",
                Solver::NAMES.join(", ")
            )),
        }
    }
}

/// A flow-matching sampler driven by a velocity model (`model_output = noise - x0`, the flow-matching velocity).
/// Usage follows the official loop: set a schedule, then for each `t` of [`FlowScheduler::timesteps`] call the
/// model at `t` and pass its output to [`FlowScheduler::step`].
pub trait FlowScheduler {
    /// `set_timesteps(steps, shift=shift)`: `steps` sigmas spaced linearly from the training range, then shifted.
    fn set_timesteps(&mut self, steps: usize, shift: f64) -> Result<()>;
    /// `set_timesteps(sigmas=sigmas)`: explicit sigmas (the constructor's shift is applied to them, as officially).
    fn set_sigmas(&mut self, sigmas: &[f64]) -> Result<()>;
    /// The integer model timesteps of the current schedule (length `steps`).
    fn timesteps(&self) -> &[i64];
    /// The sigmas of the current schedule (length `steps + 1`, the last one 0).
    fn sigmas(&self) -> &[f32];
    /// One sampler step: the sample at the next sigma from the model output at `timestep` and the current sample.
    fn step(&mut self, model_output: &Tensor, timestep: i64, sample: &Tensor) -> Result<Tensor>;
    /// Moves what the sampler keeps from earlier steps to `device`, where the next steps run (a pair of experts,
    /// each on its own GPU).
    fn move_to(&mut self, device: &Device) -> Result<()>;
}

/// The multistep samplers' kept model outputs moved to `device`.
fn outputs_to(outputs: &mut [Option<Tensor>], device: &Device) -> Result<()> {
    for out in outputs.iter_mut().flatten() {
        *out = framesmith_nn::ops::to_device(out, device)?;
    }
    Ok(())
}

/// `retrieve_timesteps(scheduler, sigmas=sigmas)` of the official generate code: installs explicit sigmas and
/// returns the resulting timesteps.
pub fn retrieve_timesteps(scheduler: &mut dyn FlowScheduler, sigmas: &[f64]) -> Result<Vec<i64>> {
    scheduler.set_sigmas(sigmas)?;
    Ok(scheduler.timesteps().to_vec())
}

/// The position of `timestep` in `timesteps` the official schedulers start from: the second match when the value
/// occurs more than once (so a duplicated first timestep does not skip a sigma), else the first.
fn index_for_timestep(timesteps: &[i64], timestep: i64) -> Result<usize> {
    let matches: Vec<usize> = timesteps
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == timestep)
        .map(|(i, _)| i)
        .collect();
    match matches.as_slice() {
        [] => candle_core::bail!("timestep {timestep} is not in the scheduler's schedule"),
        [only] => Ok(*only),
        [_, second, ..] => Ok(*second),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicated_first_timestep_starts_at_the_second_match() -> Result<()> {
        assert_eq!(index_for_timestep(&[999, 999, 990], 999)?, 1);
        assert_eq!(index_for_timestep(&[999, 995, 990], 990)?, 2);
        assert!(index_for_timestep(&[999, 995], 7).is_err());
        Ok(())
    }
}
