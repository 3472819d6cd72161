//! What training's optimizer and timestep sampling are resolved into (plain data the engine runs with), and the
//! defaults of the block streamer the memory settings refer to.

use crate::run::{TimestepSampling, WeightingScheme};

/// Timesteps of the training schedule (musubi's `FlowMatchDiscreteScheduler(num_train_timesteps=1000)`).
pub const NUM_TRAIN_TIMESTEPS: usize = 1000;

/// AdamW hyper-parameters (the learning rate comes with each step, from the schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip gradients to this global L2 norm before the update; `None` never clips.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    /// torch.optim.AdamW's defaults, no clipping.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: None,
        }
    }
}

/// Resolved timestep-sampling settings (from `[training]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimestepConfig {
    pub sampling: TimestepSampling,
    /// Shift of the `shift` mode: t ↦ s·t / (1 + (s − 1)·t).
    pub discrete_flow_shift: f64,
    /// Scale of the normal before the sigmoid (`sigmoid`, `shift`, `qinglong`).
    pub sigmoid_scale: f64,
    /// logSNR normal of `logsnr` / `qinglong`.
    pub logit_mean: f64,
    pub logit_std: f64,
    /// Range in timestep units, 0 ≤ min < max ≤ 1000.
    pub min_timestep: f64,
    pub max_timestep: f64,
    /// Reject draws outside the range instead of scaling [0, 1] onto it (not used by `sigma`).
    pub preserve_distribution_shape: bool,
    pub weighting: WeightingScheme,
}

impl Default for TimestepConfig {
    fn default() -> Self {
        Self {
            sampling: TimestepSampling::Shift,
            discrete_flow_shift: 3.0,
            sigmoid_scale: 1.0,
            logit_mean: 0.0,
            logit_std: 1.0,
            min_timestep: 0.0,
            max_timestep: 1000.0,
            preserve_distribution_shape: false,
            weighting: WeightingScheme::None,
        }
    }
}

/// GPU slots a streamed block is copied into (one computes while the next arrives).
pub const DEFAULT_GPU_SLOTS: usize = 2;

/// Default chunk buffers of `staged`'s page-locked ring (the block streamer's own default; a test in the engine
/// checks the two agree).
pub const STAGING_SLOTS: usize = 4;
