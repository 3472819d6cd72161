//! Learning-rate schedules as pure functions of the optimizer step, with the semantics of diffusers'/transformers'
//! `get_scheduler` (which musubi-tuner calls): linear warmup from 0, then constant, linear, cosine, cosine with
//! hard restarts or polynomial decay.

use std::f64::consts::PI;

use crate::run::LrScheduler;

/// Final learning rate of the `polynomial` schedule (transformers' `lr_end` default).
pub const POLYNOMIAL_LR_END: f64 = 1e-7;

/// A resolved learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub kind: LrScheduler,
    /// Peak learning rate (`optimizer.learning_rate`).
    pub base_lr: f64,
    /// Steps of linear warmup from 0 to `base_lr` (ignored by `constant`).
    pub warmup_steps: usize,
    /// Optimizer steps of the whole run (the decay ends here).
    pub total_steps: usize,
    /// Number of hard restarts for `cosine_with_restarts`.
    pub num_cycles: usize,
    /// Exponent of the `polynomial` decay.
    pub power: f64,
}

impl LrSchedule {
    /// The learning rate for the optimizer update that follows `step` completed updates (0 for the first update),
    /// exactly as a `torch.optim.lr_scheduler.LambdaLR` stepped once after each `optimizer.step()` gives it.
    /// With warmup the first update therefore runs at lr 0, as in diffusers and musubi-tuner.
    pub fn lr_at(&self, step: usize) -> f64 {
        self.base_lr * self.factor_at(step)
    }

    /// The multiplier of `base_lr` at `step` (the `lr_lambda` of transformers' schedules).
    pub fn factor_at(&self, step: usize) -> f64 {
        if self.kind == LrScheduler::Constant {
            return 1.0;
        }
        if step < self.warmup_steps {
            return step as f64 / self.warmup_steps.max(1) as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps);
        let done = (step - self.warmup_steps) as f64;
        let progress = done / decay_steps.max(1) as f64;
        match self.kind {
            LrScheduler::Constant | LrScheduler::ConstantWithWarmup => 1.0,
            LrScheduler::Linear => {
                let remaining = self.total_steps as f64 - step as f64;
                (remaining / decay_steps.max(1) as f64).max(0.0)
            }
            // transformers' default `num_cycles = 0.5`: one half cosine from 1 down to 0.
            LrScheduler::Cosine => (0.5 * (1.0 + (PI * progress).cos())).max(0.0),
            LrScheduler::CosineWithRestarts => {
                if progress >= 1.0 {
                    return 0.0;
                }
                let phase = (self.num_cycles as f64 * progress) % 1.0;
                (0.5 * (1.0 + (PI * phase).cos())).max(0.0)
            }
            LrScheduler::Polynomial => self.polynomial_factor(step, decay_steps),
        }
    }

    fn polynomial_factor(&self, step: usize, decay_steps: usize) -> f64 {
        if step > self.total_steps {
            return POLYNOMIAL_LR_END / self.base_lr;
        }
        if decay_steps == 0 {
            // warmup == total: transformers divides by zero here; the decay is already over.
            return POLYNOMIAL_LR_END / self.base_lr;
        }
        let lr_range = self.base_lr - POLYNOMIAL_LR_END;
        let remaining = 1.0 - (step - self.warmup_steps) as f64 / decay_steps as f64;
        (lr_range * remaining.powf(self.power) + POLYNOMIAL_LR_END) / self.base_lr
    }
}

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn schedule(kind: LrScheduler, warmup_steps: usize, total_steps: usize) -> LrSchedule {
        LrSchedule {
            kind,
            base_lr: 1e-3,
            warmup_steps,
            total_steps,
            num_cycles: 1,
            power: 1.0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn constant_ignores_warmup() {
        let s = schedule(LrScheduler::Constant, 10, 100);
        for step in [0, 5, 10, 100, 1000] {
            assert_eq!(s.lr_at(step), 1e-3);
        }
    }

    #[test]
    fn warmup_is_linear_from_zero() {
        for kind in [
            LrScheduler::ConstantWithWarmup,
            LrScheduler::Linear,
            LrScheduler::Cosine,
            LrScheduler::CosineWithRestarts,
            LrScheduler::Polynomial,
        ] {
            let s = schedule(kind, 10, 100);
            assert_eq!(s.factor_at(0), 0.0, "{kind:?}");
            assert!(close(s.factor_at(5), 0.5), "{kind:?}");
            assert!(close(s.factor_at(9), 0.9), "{kind:?}");
            assert!(close(s.factor_at(10), 1.0), "{kind:?}");
        }
    }

    #[test]
    fn linear_decays_to_zero() {
        let s = schedule(LrScheduler::Linear, 10, 110);
        assert!(close(s.factor_at(60), 0.5));
        assert!(close(s.factor_at(85), 0.25));
        assert_eq!(s.factor_at(110), 0.0);
        assert_eq!(s.factor_at(500), 0.0);
    }

    #[test]
    fn cosine_is_a_half_wave() {
        let s = schedule(LrScheduler::Cosine, 0, 100);
        assert!(close(s.factor_at(0), 1.0));
        assert!(close(s.factor_at(50), 0.5));
        assert!(close(s.factor_at(25), 0.5 * (1.0 + (PI / 4.0).cos())));
        assert!(s.factor_at(100) < 1e-15);
    }

    #[test]
    fn cosine_with_restarts_restarts() {
        let mut s = schedule(LrScheduler::CosineWithRestarts, 0, 100);
        s.num_cycles = 2;
        assert!(close(s.factor_at(0), 1.0));
        assert!(close(s.factor_at(25), 0.5));
        assert!(
            close(s.factor_at(50), 1.0),
            "second cycle starts at the peak"
        );
        assert!(close(s.factor_at(75), 0.5));
        assert_eq!(s.factor_at(100), 0.0);
        assert_eq!(s.factor_at(150), 0.0);
        s.num_cycles = 1;
        assert!(close(s.factor_at(50), 0.5));
    }

    #[test]
    fn polynomial_matches_transformers() {
        let mut s = schedule(LrScheduler::Polynomial, 10, 110);
        s.power = 2.0;
        // pct_remaining = 1 - 50/100 = 0.5; lr = (1e-3 - 1e-7) * 0.25 + 1e-7
        assert!(close(s.lr_at(60), (1e-3 - 1e-7) * 0.25 + 1e-7));
        assert!(close(s.lr_at(110), 1e-7));
        assert!(close(s.lr_at(111), 1e-7));
        s.power = 1.0;
        assert!(close(s.lr_at(35), (1e-3 - 1e-7) * 0.75 + 1e-7));
    }
}
