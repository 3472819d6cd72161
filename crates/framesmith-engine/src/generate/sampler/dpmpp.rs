//! `FlowDPMSolverMultistepScheduler` of the reference code's `utils/fm_solvers.py`, with its official settings: DPM-Solver++
//! (data prediction), order 2, midpoint, final sigma zero (so the last step is first order). Scalar
//! coefficients in float32, as the official 0-dim float32 tensors.

use candle_core::{DType, Device, Result, Tensor};

use super::schedule::{FlowSchedule, SchedulerConfig};
use super::{index_for_timestep, outputs_to, FlowScheduler};

/// DPM-Solver++ (2M, midpoint) sampler for flow-matching models (the official `dpm++` sample solver).
pub struct FlowDpmSolverScheduler {
    cfg: SchedulerConfig,
    schedule: FlowSchedule,
    /// Converted (x0) model outputs of the last `solver_order` steps, oldest first.
    model_outputs: Vec<Option<Tensor>>,
    lower_order_nums: usize,
    step_index: Option<usize>,
}

/// `log(alpha) - log(sigma)` with `alpha = 1 - sigma`, in float32 (±inf at the ends, as officially).
fn lambda(sigma: f32) -> f32 {
    (1.0 - sigma).ln() - sigma.ln()
}

impl FlowDpmSolverScheduler {
    /// A scheduler with the given constructor settings and no schedule yet. Orders 1 and 2 are supported.
    pub fn new(cfg: SchedulerConfig) -> Self {
        let order = cfg.solver_order.clamp(1, 2);
        Self {
            cfg: SchedulerConfig {
                solver_order: order,
                ..cfg
            },
            schedule: FlowSchedule::default(),
            model_outputs: vec![None; order],
            lower_order_nums: 0,
            step_index: None,
        }
    }

    fn reset(&mut self, schedule: FlowSchedule) {
        self.schedule = schedule;
        self.model_outputs = vec![None; self.cfg.solver_order];
        self.lower_order_nums = 0;
        self.step_index = None;
    }

    fn sigma(&self, i: usize) -> Result<f32> {
        match self.schedule.sigmas.get(i) {
            Some(&s) => Ok(s),
            None => candle_core::bail!("DPM++: step {i} is past the end of the schedule"),
        }
    }

    fn output(&self, back: usize) -> Result<&Tensor> {
        let n = self.model_outputs.len();
        match n
            .checked_sub(1 + back)
            .and_then(|i| self.model_outputs[i].as_ref())
        {
            Some(t) => Ok(t),
            None => {
                candle_core::bail!("DPM++: model output history is shorter than the solver order")
            }
        }
    }

    fn first_order(&self, sample: &Tensor, i: usize) -> Result<Tensor> {
        let (sigma_t, sigma_s) = (self.sigma(i + 1)?, self.sigma(i)?);
        let alpha_t = 1.0 - sigma_t;
        let h = lambda(sigma_t) - lambda(sigma_s);
        let m0 = self.output(0)?;
        (sample * f64::from(sigma_t / sigma_s))? - (m0 * f64::from(alpha_t * ((-h).exp() - 1.0)))?
    }

    fn second_order(&self, sample: &Tensor, i: usize) -> Result<Tensor> {
        let Some(prev) = i.checked_sub(1) else {
            candle_core::bail!("DPM++: a second-order step needs a previous step")
        };
        let (sigma_t, sigma_s0, sigma_s1) = (self.sigma(i + 1)?, self.sigma(i)?, self.sigma(prev)?);
        let alpha_t = 1.0 - sigma_t;
        let (lambda_t, lambda_s0, lambda_s1) =
            (lambda(sigma_t), lambda(sigma_s0), lambda(sigma_s1));
        let (m0, m1) = (self.output(0)?, self.output(1)?);
        let h = lambda_t - lambda_s0;
        let r0 = (lambda_s0 - lambda_s1) / h;
        let d1 = ((m0 - m1)? * f64::from(1.0 / r0))?;
        let c = alpha_t * ((-h).exp() - 1.0);
        let x = ((sample * f64::from(sigma_t / sigma_s0))? - (m0 * f64::from(c))?)?;
        x - (d1 * f64::from(0.5 * c))?
    }
}

impl FlowScheduler for FlowDpmSolverScheduler {
    fn move_to(&mut self, device: &Device) -> Result<()> {
        outputs_to(&mut self.model_outputs, device)
    }

    fn set_timesteps(&mut self, steps: usize, shift: f64) -> Result<()> {
        let schedule = FlowSchedule::from_steps(&self.cfg, steps, shift);
        self.reset(schedule);
        Ok(())
    }

    fn set_sigmas(&mut self, sigmas: &[f64]) -> Result<()> {
        let schedule = FlowSchedule::from_sigmas(&self.cfg, sigmas);
        self.reset(schedule);
        Ok(())
    }

    fn timesteps(&self) -> &[i64] {
        &self.schedule.timesteps
    }

    fn sigmas(&self) -> &[f32] {
        &self.schedule.sigmas
    }

    fn step(&mut self, model_output: &Tensor, timestep: i64, sample: &Tensor) -> Result<Tensor> {
        if self.schedule.is_empty() {
            candle_core::bail!("DPM++: call set_timesteps before step");
        }
        let i = match self.step_index {
            Some(i) => i,
            None => index_for_timestep(&self.schedule.timesteps, timestep)?,
        };
        let n = self.schedule.len();
        if i >= n {
            candle_core::bail!("DPM++: more steps than the schedule has ({n})");
        }
        let dtype = model_output.dtype();
        // The final sigma is zero, so the last step is always first order.
        let lower_order_final = i == n - 1;
        let sample = sample.to_dtype(DType::F32)?;
        let model_output = model_output.to_dtype(DType::F32)?;
        let converted = (&sample - (&model_output * f64::from(self.sigma(i)?))?)?;
        self.model_outputs.rotate_left(1);
        if let Some(slot) = self.model_outputs.last_mut() {
            *slot = Some(converted);
        }
        let prev = if self.cfg.solver_order == 1 || self.lower_order_nums < 1 || lower_order_final {
            self.first_order(&sample, i)?
        } else {
            self.second_order(&sample, i)?
        };
        if self.lower_order_nums < self.cfg.solver_order {
            self.lower_order_nums += 1;
        }
        self.step_index = Some(i + 1);
        prev.to_dtype(dtype)
    }
}
