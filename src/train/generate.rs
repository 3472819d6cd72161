//! Clip generation with the DiT (and its LoRAs): the official flow-matching sampling loop with UniPC, DPM++ or
//! Euler, classifier-free guidance with a negative prompt, seeded noise, and Wan 2.2's switch from the
//! high-noise to the low-noise expert at the timestep boundary. Returns latents; decoding is the caller's.

use candle_core::{Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::sampler::{
    FlowDpmSolverScheduler, FlowEulerScheduler, FlowScheduler, FlowUniPcScheduler, SchedulerConfig,
};
use crate::models::wan::{Timesteps, WanInputs, WanModel};
use crate::nn::init::randn;

/// Sampling solver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Solver {
    Unipc,
    Dpmpp,
    Euler,
}

impl Solver {
    fn scheduler(self) -> Box<dyn FlowScheduler> {
        let cfg = SchedulerConfig::default();
        match self {
            Solver::Unipc => Box::new(FlowUniPcScheduler::new(cfg)),
            Solver::Dpmpp => Box::new(FlowDpmSolverScheduler::new(cfg)),
            Solver::Euler => Box::new(FlowEulerScheduler::new(cfg)),
        }
    }
}

/// The denoiser: one model, or a Wan 2.2 pair whose low-noise expert takes over below `boundary` (0..1000).
pub struct Experts<'a> {
    pub high_noise: &'a WanModel,
    pub low_noise: Option<(&'a WanModel, f64)>,
}

impl Experts<'_> {
    fn at(&self, timestep: f64) -> &WanModel {
        match self.low_noise {
            Some((low, boundary)) if timestep < boundary => low,
            _ => self.high_noise,
        }
    }
}

/// What to generate.
pub struct GenerateRequest<'a> {
    /// Text embedding of the prompt [L, text_dim].
    pub context: &'a Tensor,
    /// Text embedding of the negative prompt; used when `guidance` > 1.
    pub negative: Option<&'a Tensor>,
    /// Latent shape [C, F, H, W].
    pub latent_shape: [usize; 4],
    pub steps: usize,
    pub shift: f64,
    pub guidance: f64,
    pub seed: u64,
    pub solver: Solver,
}

/// Runs the sampling loop; `cancelled` is polled between denoising steps.
pub fn generate(
    experts: &Experts,
    req: &GenerateRequest,
    cancelled: &dyn Fn() -> bool,
) -> Result<Tensor> {
    let device = experts.high_noise.device();
    let rng = &mut StdRng::seed_from_u64(req.seed);
    let mut latents = randn(rng, req.latent_shape.as_slice(), 0.0, 1.0, device)?;
    let mut scheduler = req.solver.scheduler();
    scheduler.set_timesteps(req.steps.max(1), req.shift)?;
    let timesteps = scheduler.timesteps().to_vec();
    let guided = req.guidance > 1.0 && req.negative.is_some();
    for t in timesteps {
        if cancelled() {
            candle_core::bail!("generation cancelled");
        }
        let model = experts.at(t as f64);
        let predict = |context: &Tensor| -> Result<Tensor> {
            let inputs = WanInputs {
                latents: vec![latents.clone()],
                timesteps: Timesteps::PerSample(vec![t as f64]),
                context: vec![context.clone()],
                seq_len: None,
                clip: None,
                y: None,
            };
            model.forward(&inputs)?.remove(0).to_dtype(latents.dtype())
        };
        let cond = predict(req.context)?;
        let velocity = match (guided, req.negative) {
            (true, Some(negative)) => {
                let uncond = predict(negative)?;
                (&uncond + ((cond - &uncond)? * req.guidance)?)?
            }
            _ => cond,
        };
        latents = scheduler.step(&velocity, t, &latents)?;
    }
    Ok(latents)
}
