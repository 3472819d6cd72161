//! `FlowUniPCMultistepScheduler` of the reference code's `utils/fm_solvers_unipc.py`: UniPC (bh2 variant, data prediction) for
//! flow matching, with the UniC corrector and lower orders on the final steps. Scalar coefficients are computed
//! in float32 as the official code does with its 0-dim float32 sigma tensors.

use candle_core::{DType, Device, Result, Tensor};

use super::schedule::{FlowSchedule, SchedulerConfig};
use super::{index_for_timestep, outputs_to, FlowScheduler};

/// UniPC multistep sampler for flow-matching models (the official `unipc` sample solver).
pub struct FlowUniPcScheduler {
    cfg: SchedulerConfig,
    schedule: FlowSchedule,
    /// Converted (x0) model outputs of the last `solver_order` steps, oldest first.
    model_outputs: Vec<Option<Tensor>>,
    lower_order_nums: usize,
    last_sample: Option<Tensor>,
    step_index: Option<usize>,
    this_order: usize,
    disable_corrector: Vec<usize>,
}

/// `log(alpha) - log(sigma)` with `alpha = 1 - sigma`, in float32.
fn lambda(sigma: f32) -> f32 {
    (1.0 - sigma).ln() - sigma.ln()
}

/// Solves the small dense system `a x = b` by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Result<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        if a[pivot][col] == 0.0 {
            candle_core::bail!("UniPC: singular coefficient matrix");
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (top, rest) = a.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (offset, row) in rest.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[col + 1 + offset] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Ok(x)
}

/// The B(h) coefficients shared by predictor and corrector: `(h_phi_1, B_h, R, b)` for order `order` with the
/// ratios `rks` (the trailing 1 included).
fn bh_coefficients(h: f32, rks: &[f32], order: usize) -> (f32, f32, Vec<Vec<f64>>, Vec<f64>) {
    let hh = -h;
    let h_phi_1 = hh.exp_m1();
    let mut h_phi_k = h_phi_1 / hh - 1.0;
    let mut factorial = 1u64;
    let b_h = hh.exp_m1();
    let mut r = Vec::with_capacity(order);
    let mut b = Vec::with_capacity(order);
    for i in 1..=order {
        r.push(
            rks.iter()
                .map(|&rk| f64::from(rk.powi(i as i32 - 1)))
                .collect(),
        );
        b.push(f64::from(h_phi_k * factorial as f32 / b_h));
        factorial *= i as u64 + 1;
        h_phi_k = h_phi_k / hh - (1.0 / factorial as f64) as f32;
    }
    (h_phi_1, b_h, r, b)
}

impl FlowUniPcScheduler {
    /// A scheduler with the given constructor settings and no schedule yet.
    pub fn new(cfg: SchedulerConfig) -> Self {
        let order = cfg.solver_order.max(1);
        Self {
            cfg,
            schedule: FlowSchedule::default(),
            model_outputs: vec![None; order],
            lower_order_nums: 0,
            last_sample: None,
            step_index: None,
            this_order: 1,
            disable_corrector: Vec::new(),
        }
    }

    /// Steps (0-based, counted as `step_index - 1` officially) at which the corrector is skipped.
    pub fn set_disable_corrector(&mut self, steps: Vec<usize>) {
        self.disable_corrector = steps;
    }

    fn reset(&mut self, schedule: FlowSchedule) {
        self.schedule = schedule;
        self.model_outputs = vec![None; self.cfg.solver_order.max(1)];
        self.lower_order_nums = 0;
        self.last_sample = None;
        self.step_index = None;
    }

    fn sigma(&self, i: usize) -> Result<f32> {
        match self.schedule.sigmas.get(i) {
            Some(&s) => Ok(s),
            None => candle_core::bail!("UniPC: step {i} is past the end of the schedule"),
        }
    }

    /// The stored output `back` steps before the latest one.
    fn output(&self, back: usize) -> Result<&Tensor> {
        let n = self.model_outputs.len();
        match n
            .checked_sub(1 + back)
            .and_then(|i| self.model_outputs[i].as_ref())
        {
            Some(t) => Ok(t),
            None => {
                candle_core::bail!("UniPC: model output history is shorter than the solver order")
            }
        }
    }

    /// `(D1s, rks)` for the history terms: `sigma_index(k)` gives the sigma index of the k-th previous output.
    fn history(
        &self,
        order: usize,
        lambda_s0: f32,
        h: f32,
        sigma_index: impl Fn(usize) -> Option<usize>,
    ) -> Result<(Vec<Tensor>, Vec<f32>)> {
        let m0 = self.output(0)?;
        let mut d1s = Vec::new();
        let mut rks = Vec::new();
        for k in 1..order {
            let Some(si) = sigma_index(k) else {
                candle_core::bail!("UniPC: not enough previous steps for order {order}")
            };
            let rk = (lambda(self.sigma(si)?) - lambda_s0) / h;
            d1s.push(((self.output(k)? - m0)? / f64::from(rk))?);
            rks.push(rk);
        }
        rks.push(1.0);
        Ok((d1s, rks))
    }

    /// UniP predictor: the sample at sigma `i + 1` from the sample at sigma `i`.
    fn predict(&self, x: &Tensor, order: usize, i: usize) -> Result<Tensor> {
        let (sigma_t, sigma_s0) = (self.sigma(i + 1)?, self.sigma(i)?);
        let alpha_t = 1.0 - sigma_t;
        let lambda_s0 = lambda(sigma_s0);
        let h = lambda(sigma_t) - lambda_s0;
        let (d1s, rks) = self.history(order, lambda_s0, h, |k| i.checked_sub(k))?;
        let (h_phi_1, b_h, r, b) = bh_coefficients(h, &rks, order);
        let m0 = self.output(0)?;
        let x_t = ((x * f64::from(sigma_t / sigma_s0))? - (m0 * f64::from(alpha_t * h_phi_1))?)?;
        if d1s.is_empty() {
            return Ok(x_t);
        }
        let rhos: Vec<f64> = if order == 2 {
            vec![0.5]
        } else {
            let n = order - 1;
            let sub: Vec<Vec<f64>> = r[..n].iter().map(|row| row[..n].to_vec()).collect();
            solve(sub, b[..n].to_vec())?
        };
        let pred_res = weighted_sum(&rhos, &d1s)?;
        x_t - (pred_res * f64::from(alpha_t * b_h))?
    }

    /// UniC corrector: refines the sample at sigma `i` with the model output just computed there.
    fn correct(&self, model_t: &Tensor, x: &Tensor, order: usize, i: usize) -> Result<Tensor> {
        let (sigma_t, sigma_s0) = (self.sigma(i)?, self.sigma(i - 1)?);
        let alpha_t = 1.0 - sigma_t;
        let lambda_s0 = lambda(sigma_s0);
        let h = lambda(sigma_t) - lambda_s0;
        let (d1s, rks) = self.history(order, lambda_s0, h, |k| i.checked_sub(k + 1))?;
        let (h_phi_1, b_h, r, b) = bh_coefficients(h, &rks, order);
        let rhos: Vec<f64> = if order == 1 { vec![0.5] } else { solve(r, b)? };
        let m0 = self.output(0)?;
        let x_t = ((x * f64::from(sigma_t / sigma_s0))? - (m0 * f64::from(alpha_t * h_phi_1))?)?;
        let d1_t = (model_t - m0)?;
        let last = rhos[rhos.len() - 1];
        let mut res = (d1_t * (last as f32) as f64)?;
        if !d1s.is_empty() {
            res = (weighted_sum(&rhos[..rhos.len() - 1], &d1s)? + res)?;
        }
        x_t - (res * f64::from(alpha_t * b_h))?
    }
}

/// `sum_k w[k] * xs[k]` with float32 weights.
fn weighted_sum(w: &[f64], xs: &[Tensor]) -> Result<Tensor> {
    let mut acc: Option<Tensor> = None;
    for (wk, x) in w.iter().zip(xs) {
        let term = (x * f64::from(*wk as f32))?;
        acc = Some(match acc {
            Some(a) => (a + term)?,
            None => term,
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => candle_core::bail!("UniPC: empty weighted sum"),
    }
}

impl FlowScheduler for FlowUniPcScheduler {
    fn move_to(&mut self, device: &Device) -> Result<()> {
        outputs_to(&mut self.model_outputs, device)?;
        self.last_sample = self
            .last_sample
            .as_ref()
            .map(|s| framesmith_nn::ops::to_device(s, device))
            .transpose()?;
        Ok(())
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
            candle_core::bail!("UniPC: call set_timesteps before step");
        }
        let i = match self.step_index {
            Some(i) => i,
            None => index_for_timestep(&self.schedule.timesteps, timestep)?,
        };
        if i >= self.schedule.len() {
            candle_core::bail!(
                "UniPC: more steps than the schedule has ({})",
                self.schedule.len()
            );
        }
        let dtype = sample.dtype();
        let model_output = model_output.to_dtype(DType::F32)?;
        let mut sample = sample.to_dtype(DType::F32)?;
        let use_corrector =
            i > 0 && !self.disable_corrector.contains(&(i - 1)) && self.last_sample.is_some();
        // Data (x0) prediction from the flow prediction.
        let converted = (&sample - (&model_output * f64::from(self.sigma(i)?))?)?;
        if let (true, Some(last)) = (use_corrector, self.last_sample.as_ref()) {
            sample = self.correct(&converted, last, self.this_order, i)?;
        }
        self.model_outputs.rotate_left(1);
        if let Some(slot) = self.model_outputs.last_mut() {
            *slot = Some(converted);
        }
        let order = self.cfg.solver_order.max(1);
        let this_order = if self.cfg.lower_order_final {
            order.min(self.schedule.len() - i)
        } else {
            order
        };
        self.this_order = this_order.min(self.lower_order_nums + 1);
        self.last_sample = Some(sample.clone());
        let prev = self.predict(&sample, self.this_order, i)?;
        if self.lower_order_nums < order {
            self.lower_order_nums += 1;
        }
        self.step_index = Some(i + 1);
        prev.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solve_matches_a_known_system() -> Result<()> {
        let x = solve(vec![vec![0.0, 2.0], vec![1.0, 1.0]], vec![4.0, 3.0])?;
        assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 2.0).abs() < 1e-12);
        assert!(solve(vec![vec![1.0, 1.0], vec![1.0, 1.0]], vec![1.0, 2.0]).is_err());
        Ok(())
    }
}
