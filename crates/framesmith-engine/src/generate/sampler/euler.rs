//! First-order Euler sampler for flow matching: `x(σ_next) = x(σ) + (σ_next − σ) · v`, where the model predicts the
//! velocity `v = noise − x0` of the straight path `x(σ) = (1 − σ) x0 + σ noise`. The cheapest preview sampler and
//! the reference the multistep solvers are judged against.

use candle_core::{DType, Device, Result, Tensor};

use super::schedule::{FlowSchedule, SchedulerConfig};
use super::{index_for_timestep, FlowScheduler};

/// Euler sampler over the same schedules as the official solvers.
pub struct FlowEulerScheduler {
    cfg: SchedulerConfig,
    schedule: FlowSchedule,
    step_index: Option<usize>,
}

impl FlowEulerScheduler {
    /// A sampler with the given constructor settings (only `num_train_timesteps` and `shift` matter).
    pub fn new(cfg: SchedulerConfig) -> Self {
        Self {
            cfg,
            schedule: FlowSchedule::default(),
            step_index: None,
        }
    }
}

impl FlowScheduler for FlowEulerScheduler {
    fn move_to(&mut self, device: &Device) -> Result<()> {
        // Euler keeps nothing from earlier steps.
        let _ = device;
        Ok(())
    }

    fn set_timesteps(&mut self, steps: usize, shift: f64) -> Result<()> {
        self.schedule = FlowSchedule::from_steps(&self.cfg, steps, shift);
        self.step_index = None;
        Ok(())
    }

    fn set_sigmas(&mut self, sigmas: &[f64]) -> Result<()> {
        self.schedule = FlowSchedule::from_sigmas(&self.cfg, sigmas);
        self.step_index = None;
        Ok(())
    }

    fn timesteps(&self) -> &[i64] {
        &self.schedule.timesteps
    }

    fn sigmas(&self) -> &[f32] {
        &self.schedule.sigmas
    }

    fn step(&mut self, model_output: &Tensor, timestep: i64, sample: &Tensor) -> Result<Tensor> {
        let i = match self.step_index {
            Some(i) => i,
            None => index_for_timestep(&self.schedule.timesteps, timestep)?,
        };
        let (Some(&sigma), Some(&sigma_next)) =
            (self.schedule.sigmas.get(i), self.schedule.sigmas.get(i + 1))
        else {
            candle_core::bail!(
                "Euler: more steps than the schedule has ({})",
                self.schedule.len()
            )
        };
        let dtype = sample.dtype();
        let v = model_output.to_dtype(DType::F32)?;
        let x = sample.to_dtype(DType::F32)?;
        let next = (x + (v * f64::from(sigma_next - sigma))?)?;
        self.step_index = Some(i + 1);
        next.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::super::sampling_sigmas;
    use super::*;
    use candle_core::Device;

    /// Runs the sampler from noise `z` for data N(m, s²) with the exact velocity field of that distribution and
    /// returns the final sample. The exact flow maps z to m + s·z.
    fn gaussian_flow(steps: usize, shift: f64, m: f64, s: f64, z: &Tensor) -> Result<Tensor> {
        let mut sched = FlowEulerScheduler::new(SchedulerConfig::default());
        sched.set_sigmas(&sampling_sigmas(steps, shift))?;
        let mut x = z.clone();
        let timesteps = sched.timesteps().to_vec();
        for (k, &t) in timesteps.iter().enumerate() {
            let sigma = f64::from(sched.sigmas()[k]);
            // x(σ) = (1−σ) m + std(σ) z with std(σ)² = (1−σ)² s² + σ²; v = dx/dσ at fixed z.
            let var = (1.0 - sigma).powi(2) * s * s + sigma * sigma;
            let std = var.sqrt();
            let dstd = (-(1.0 - sigma) * s * s + sigma) / std;
            let zhat = ((&x - (1.0 - sigma) * m)? / std)?;
            let v = ((zhat * dstd)? - m)?;
            x = sched.step(&v, t, &x)?;
        }
        Ok(x)
    }

    #[test]
    fn straight_paths_are_integrated_exactly() -> Result<()> {
        let dev = Device::Cpu;
        let x0 = Tensor::new(&[0.5f32, -2.0, 3.0], &dev)?;
        let noise = Tensor::new(&[1.0f32, 0.25, -1.0], &dev)?;
        let v = (&noise - &x0)?;
        let mut sched = FlowEulerScheduler::new(SchedulerConfig::default());
        sched.set_sigmas(&sampling_sigmas(7, 5.0))?;
        let mut x = noise.clone();
        for t in sched.timesteps().to_vec() {
            x = sched.step(&v, t, &x)?;
        }
        let err = (x - &x0)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-6, "straight path error {err}");
        Ok(())
    }

    #[test]
    fn gaussian_flow_converges_at_first_order() -> Result<()> {
        let dev = Device::Cpu;
        let z = Tensor::new(&[-1.5f32, -0.3, 0.7, 2.0], &dev)?;
        let (m, s) = (0.8, 0.3);
        let exact = ((&z * s)? + m)?;
        let err = |steps| -> Result<f32> {
            let x = gaussian_flow(steps, 1.0, m, s, &z)?;
            (x - &exact)?.abs()?.max_all()?.to_scalar::<f32>()
        };
        let (e20, e40) = (err(20)?, err(40)?);
        assert!(e40 < 0.04, "error with 40 steps {e40}");
        let ratio = e20 / e40;
        assert!(
            (1.6..2.5).contains(&ratio),
            "errors {e20} / {e40} = {ratio}, expected about 2"
        );
        Ok(())
    }
}
