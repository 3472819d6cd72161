//! Sigma and timestep schedules of the official flow-matching schedulers, reproducing their float64 (numpy) and
//! float32 (torch) arithmetic step for step so that integer timesteps match the official ones exactly.

/// Constructor settings shared by the flow schedulers (`num_train_timesteps`, `shift`, `solver_order`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Training timesteps (1000 in the official schedulers).
    pub num_train_timesteps: usize,
    /// Shift applied to explicit sigmas and when `set_timesteps` is given none (the official code passes 1).
    pub shift: f64,
    /// Multistep order (2 for the official samplers).
    pub solver_order: usize,
    /// Use lower orders for the last steps (official default: true).
    pub lower_order_final: bool,
}

impl Default for SchedulerConfig {
    /// The official construction: `num_train_timesteps=1000, shift=1, use_dynamic_shifting=False`, order 2.
    fn default() -> Self {
        Self {
            num_train_timesteps: 1000,
            shift: 1.0,
            solver_order: 2,
            lower_order_final: true,
        }
    }
}

impl SchedulerConfig {
    /// `(sigma_max, sigma_min)` of the training schedule as the constructor computes them: float64 linspace,
    /// converted to float32, shifted in float32, read back as Python floats.
    pub fn train_sigma_range(&self) -> (f64, f64) {
        let n = self.num_train_timesteps.max(1);
        // alphas = linspace(1, 1/n, n)[::-1]; sigmas = 1 - alphas: only the two ends are needed, 1 - 1/n and 0.
        let first = 1.0 - 1.0 / n as f64;
        let last = 0.0;
        let shift32 = |s: f64| -> f64 {
            let s = s as f32;
            let shift = self.shift as f32;
            let shifted = shift * s / (1.0 + (self.shift - 1.0) as f32 * s);
            f64::from(shifted)
        };
        (shift32(first), shift32(last))
    }
}

/// `numpy.linspace(start, stop, num)` with numpy's arithmetic: `i * step + start`, the last value exactly `stop`.
pub fn np_linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 0 {
        return Vec::new();
    }
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut out: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    out[num - 1] = stop;
    out
}

/// `torch.linspace(start, end, num)` in float32 as torch computes it on the CPU: `start + i·step` for the first
/// half, `end − (num − 1 − i)·step` for the rest, so both ends are exact.
pub fn torch_linspace_f32(start: f32, end: f32, num: usize) -> Vec<f32> {
    if num <= 1 {
        return if num == 1 { vec![start] } else { Vec::new() };
    }
    let step = (end - start) / (num - 1) as f32;
    let half = num / 2;
    (0..num)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (num - 1 - i) as f32
            }
        })
        .collect()
}

/// The official time shift `shift * s / (1 + (shift - 1) * s)` in float64.
fn shift_sigmas(sigmas: &[f64], shift: f64) -> Vec<f64> {
    sigmas
        .iter()
        .map(|&s| shift * s / (1.0 + (shift - 1.0) * s))
        .collect()
}

/// `get_sampling_sigmas(steps, shift)` of `fm_solvers.py`: `steps` shifted sigmas from 1 towards 0 (float64).
pub fn sampling_sigmas(steps: usize, shift: f64) -> Vec<f64> {
    let mut sigma = np_linspace(1.0, 0.0, steps + 1);
    sigma.truncate(steps);
    shift_sigmas(&sigma, shift)
}

/// A sampling schedule: integer timesteps (length n) and float32 sigmas (length n + 1, last 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowSchedule {
    /// Model timesteps, `trunc(sigma * num_train_timesteps)` computed in float64.
    pub timesteps: Vec<i64>,
    /// Sigmas in float32 with the final zero appended.
    pub sigmas: Vec<f32>,
}

impl FlowSchedule {
    /// `set_timesteps(steps, shift=shift)`: linspace from the training sigma range, drop the last, shift.
    pub fn from_steps(cfg: &SchedulerConfig, steps: usize, shift: f64) -> Self {
        let (sigma_max, sigma_min) = cfg.train_sigma_range();
        let mut sigmas = np_linspace(sigma_max, sigma_min, steps + 1);
        sigmas.truncate(steps);
        Self::from_shifted(cfg, &shift_sigmas(&sigmas, shift))
    }

    /// `set_timesteps(sigmas=sigmas)`: the constructor's shift applied to explicit sigmas.
    pub fn from_sigmas(cfg: &SchedulerConfig, sigmas: &[f64]) -> Self {
        Self::from_shifted(cfg, &shift_sigmas(sigmas, cfg.shift))
    }

    fn from_shifted(cfg: &SchedulerConfig, sigmas: &[f64]) -> Self {
        let n = cfg.num_train_timesteps as f64;
        // Float64 product then truncation towards zero, as `torch.from_numpy(t).to(torch.int64)` does.
        let timesteps = sigmas.iter().map(|&s| (s * n) as i64).collect();
        let sigmas = sigmas
            .iter()
            .map(|&s| s as f32)
            .chain(std::iter::once(0.0))
            .collect();
        Self { timesteps, sigmas }
    }

    /// Number of sampling steps.
    pub fn len(&self) -> usize {
        self.timesteps.len()
    }

    /// Whether the schedule has no steps.
    pub fn is_empty(&self) -> bool {
        self.timesteps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_ends_exactly_and_steps_evenly() {
        let v = np_linspace(1.0, 0.0, 5);
        assert_eq!(v, vec![1.0, 0.75, 0.5, 0.25, 0.0]);
        assert_eq!(np_linspace(2.0, 3.0, 1), vec![2.0]);
        assert!(np_linspace(0.0, 1.0, 0).is_empty());
    }

    #[test]
    fn torch_linspace_meets_both_ends() {
        assert_eq!(
            torch_linspace_f32(1.0, 0.0, 5),
            vec![1.0, 0.75, 0.5, 0.25, 0.0]
        );
        // torch.linspace(1, 0, 4) in float32.
        assert_eq!(
            torch_linspace_f32(1.0, 0.0, 4),
            vec![1.0, 0.666_666_6, 0.333_333_34, 0.0]
        );
        assert_eq!(torch_linspace_f32(2.0, 3.0, 1), vec![2.0]);
        assert!(torch_linspace_f32(0.0, 1.0, 0).is_empty());
    }

    #[test]
    fn train_range_is_float32_of_one_minus_one_over_n() {
        let (max, min) = SchedulerConfig::default().train_sigma_range();
        assert_eq!(max, f64::from(0.999f32));
        assert_eq!(min, 0.0);
    }

    #[test]
    fn sampling_sigmas_start_at_one_and_are_shifted() {
        let s = sampling_sigmas(4, 3.0);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0], 1.0);
        // shift 3 at sigma 0.5: 1.5 / 2 = 0.75.
        assert!((s[2] - 0.75).abs() < 1e-15);
        let sched = FlowSchedule::from_sigmas(&SchedulerConfig::default(), &s);
        assert_eq!(sched.timesteps[0], 1000);
        assert_eq!(sched.sigmas.len(), 5);
        assert_eq!(sched.sigmas[4], 0.0);
    }
}
