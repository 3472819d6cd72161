//! Clip generation with the DiT (and its LoRAs): the official flow-matching sampling loop with UniPC, DPM++ or
//! Euler, classifier-free guidance with a negative prompt, seeded noise, and Wan 2.2's switch from the
//! high-noise to the low-noise expert at the timestep boundary, and the image-to-video conditioning of the
//! official I2V / TI2V loops. Returns latents; decoding is the caller's.

use candle_core::{Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::generate::sampler::{FlowScheduler, Solver};
use framesmith_models::wan::{Timesteps, WanConfig, WanInputs, WanModel};
use framesmith_nn::init::randn;

/// Where the two experts of a Wan 2.2 pair live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residency {
    /// Both on one device: only the expert in use is there, the other parked in host RAM (`WanModel::park`) and
    /// brought in, the first one parked, when the timesteps reach it.
    #[default]
    Shared,
    /// Each on its own device (Wan 2.2 A14B over two GPUs: the high-noise expert on the first, the low-noise one
    /// on the second), both resident: nothing is parked, and the sampling state moves to the expert's device
    /// at the boundary.
    OwnDevices,
}

/// The denoiser: one model, or a Wan 2.2 pair whose low-noise expert takes over below `boundary` (0..1000),
/// sharing a device or each on its own ([`Residency`]).
pub struct Experts<'a> {
    pub high_noise: &'a mut WanModel,
    pub low_noise: Option<(&'a mut WanModel, f64)>,
    pub residency: Residency,
}

impl<'a> Experts<'a> {
    /// One model, no expert switch.
    pub fn single(model: &'a mut WanModel) -> Self {
        Self {
            high_noise: model,
            low_noise: None,
            residency: Residency::Shared,
        }
    }

    /// The expert for `timestep`, on its device (brought in from host RAM when the pair shares one).
    pub fn at(&mut self, timestep: f64) -> Result<&WanModel> {
        let use_low = matches!(&self.low_noise, Some((_, boundary)) if timestep < *boundary);
        if let Some((low, _)) = &mut self.low_noise {
            let high = &mut *self.high_noise;
            let (going, coming) = if use_low {
                (high, &mut **low)
            } else {
                (&mut **low, high)
            };
            match self.residency {
                Residency::Shared => {
                    coming.take_over_from(going)?;
                }
                // Both stay where they are; one parked before (a caller's choice) comes back to its own device.
                Residency::OwnDevices => coming.unpark()?,
            }
        }
        Ok(match &self.low_noise {
            Some((low, _)) if use_low => low,
            _ => self.high_noise,
        })
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

/// How a start image conditions the clip, as the official image-to-video loops do it.
#[derive(Clone, Debug)]
pub enum ImageConditioning {
    /// Wan2.1 I2V-14B and Wan2.2 I2V-A14B (`WanI2V.generate`): `y` [4 + z, F, H, W] — the mask channels (1 on
    /// the first latent frame), then the latent of the image followed by black frames — concatenated to the
    /// latents at every call, for the conditional and the unconditional pass alike; and, for Wan2.1, the CLIP
    /// features [1, 257, clip_dim] of the image.
    Channels { y: Tensor, clip: Option<Tensor> },
    /// Wan2.2 TI2V-5B (`WanTI2V.i2v`): the image's latent [z, 1, H, W] replaces the first latent frame of the
    /// noise and of every step's result, and that frame's tokens are denoised at timestep 0.
    FirstFrame { latent: Tensor },
}

/// Runs the sampling loop; `cancelled` is polled between denoising steps.
pub fn generate(
    experts: &mut Experts,
    req: &GenerateRequest,
    cancelled: &dyn Fn() -> bool,
) -> Result<Tensor> {
    generate_from(experts, req, None, cancelled)
}

/// `latents` [C, F, H, W] with the first frame replaced by `first` [C, 1, H, W] (the official
/// `(1 − mask) · z + mask · latent` with a 0/1 mask, exactly).
pub(crate) fn with_first_frame(latents: &Tensor, first: &Tensor) -> Result<Tensor> {
    let f = latents.dim(1)?;
    if f == 1 {
        return Ok(first.clone());
    }
    Tensor::cat(&[first, &latents.narrow(1, 1, f - 1)?], 1)
}

/// TI2V per-token timesteps: 0 for the tokens of the first latent frame, `t` for the others (the official
/// `mask2[0][0][:, ::2, ::2] * t`, flattened; no padding since `seq_len` is the token count).
fn first_frame_timesteps(cfg: &WanConfig, latent_shape: [usize; 4], t: f64) -> Timesteps {
    Timesteps::PerToken(vec![first_frame_row(cfg, latent_shape, t)])
}

/// One sample's row of [`first_frame_timesteps`].
pub(crate) fn first_frame_row(cfg: &WanConfig, latent_shape: [usize; 4], t: f64) -> Vec<f64> {
    let [_, f, h, w] = latent_shape;
    let [pt, ph, pw] = cfg.patch_size;
    let per_frame = (h / ph.max(1)) * (w / pw.max(1));
    let frames = f / pt.max(1);
    let mut row = vec![t; per_frame * frames];
    for v in row.iter_mut().take(per_frame) {
        *v = 0.0;
    }
    row
}

/// [`generate`] with a start image's conditioning (image-to-video variants).
pub fn generate_from(
    experts: &mut Experts,
    req: &GenerateRequest,
    image: Option<&ImageConditioning>,
    cancelled: &dyn Fn() -> bool,
) -> Result<Tensor> {
    let device = experts.high_noise.device().clone();
    let mut denoising = Denoising::new(req, image, &device)?;
    while let Some(t) = denoising.next_timestep() {
        if cancelled() {
            candle_core::bail!("generation cancelled");
        }
        let model = experts.at(t)?;
        // What the last step left cached in the memory pool goes back to the driver, so each step (and an expert
        // coming in) lays out its memory from the same start: under a VRAM budget a pool fragmented by the last
        // step can fail a large allocation that a trimmed one serves.
        framesmith_nn::offload::release_cached_memory(model.device())?;
        denoising.step(model)?;
    }
    Ok(denoising.into_latents())
}

/// The sampling loop one denoising step at a time, so a caller can change the model between steps (bring in
/// the low-noise expert at the boundary) while the solver keeps its history. Everything a step reads (latents,
/// text embeddings, start-image conditioning, the solver's history) follows the model to its device.
pub struct Denoising<'a> {
    req: &'a GenerateRequest<'a>,
    latents: Tensor,
    /// The request's text embeddings, on the latents' device.
    context: Tensor,
    negative: Option<Tensor>,
    scheduler: Box<dyn FlowScheduler>,
    timesteps: Vec<i64>,
    next: usize,
    /// I2V channels, CLIP features, or the TI2V first frame.
    y: Option<Vec<Tensor>>,
    clip: Option<Tensor>,
    first: Option<Tensor>,
}

impl<'a> Denoising<'a> {
    /// Seeded noise of the request's shape on `device`, the start image's conditioning and the solver's
    /// timesteps.
    pub fn new(
        req: &'a GenerateRequest<'a>,
        image: Option<&ImageConditioning>,
        device: &Device,
    ) -> Result<Self> {
        let rng = &mut StdRng::seed_from_u64(req.seed);
        let mut latents = randn(rng, req.latent_shape.as_slice(), 0.0, 1.0, device)?;
        let dtype = latents.dtype();
        let (y, clip, first) = match image {
            Some(ImageConditioning::Channels { y, clip }) => {
                (Some(vec![y.to_dtype(dtype)?]), clip.clone(), None)
            }
            Some(ImageConditioning::FirstFrame { latent }) => {
                (None, None, Some(latent.to_dtype(dtype)?))
            }
            None => (None, None, None),
        };
        let first = first.map(|f| f.to_device(device)).transpose()?;
        if let Some(first) = &first {
            latents = with_first_frame(&latents, first)?;
        }
        let mut scheduler = req.solver.scheduler();
        scheduler.set_timesteps(req.steps.max(1), req.shift)?;
        let timesteps = scheduler.timesteps().to_vec();
        Ok(Self {
            req,
            latents,
            context: req.context.to_device(device)?,
            negative: req.negative.map(|n| n.to_device(device)).transpose()?,
            scheduler,
            timesteps,
            next: 0,
            y,
            clip,
            first,
        })
    }

    /// The timestep (0..1000) the next [`Denoising::step`] denoises at; `None` when done.
    pub fn next_timestep(&self) -> Option<f64> {
        self.timesteps.get(self.next).map(|&t| t as f64)
    }

    /// One denoising step with `model` (classifier-free guidance when asked).
    pub fn step(&mut self, model: &WanModel) -> Result<()> {
        let Some(&step_t) = self.timesteps.get(self.next) else {
            candle_core::bail!("the sampling loop is already done");
        };
        self.move_to(model.device())?;
        let t = step_t as f64;
        let req = self.req;
        let dtype = self.latents.dtype();
        let model_timesteps = match self.first {
            Some(_) => first_frame_timesteps(model.config(), req.latent_shape, t),
            None => Timesteps::PerSample(vec![t]),
        };
        let predict = |context: &Tensor| -> Result<Tensor> {
            let inputs = WanInputs {
                latents: vec![self.latents.clone()],
                timesteps: model_timesteps.clone(),
                context: vec![context.clone()],
                seq_len: None,
                clip: self.clip.clone(),
                y: self.y.clone(),
            };
            model.forward_untracked(&inputs)?.remove(0).to_dtype(dtype)
        };
        let cond = predict(&self.context)?;
        let velocity = match &self.negative {
            Some(negative) if req.guidance > 1.0 => {
                let uncond = predict(negative)?;
                (&uncond + ((cond - &uncond)? * req.guidance)?)?
            }
            _ => cond,
        };
        let mut latents = self.scheduler.step(&velocity, step_t, &self.latents)?;
        if let Some(first) = &self.first {
            latents = with_first_frame(&latents, first)?;
        }
        self.latents = latents;
        self.next += 1;
        Ok(())
    }

    /// Moves the sampling state to `device` (a no-op where it already is): the latents, the text embeddings, the
    /// start image's conditioning and the solver's history, so the next step runs there.
    pub fn move_to(&mut self, device: &Device) -> Result<()> {
        if self.latents.device().same_device(device) {
            return Ok(());
        }
        // Between GPUs through host memory (see `framesmith_nn::ops::to_device`).
        let to = |t: &Tensor| framesmith_nn::ops::to_device(t, device);
        self.latents = to(&self.latents)?;
        self.context = to(&self.context)?;
        self.negative = self.negative.as_ref().map(to).transpose()?;
        self.y = self
            .y
            .as_ref()
            .map(|ys| framesmith_nn::ops::all_to_device(ys, device))
            .transpose()?;
        self.clip = self.clip.as_ref().map(to).transpose()?;
        self.first = self.first.as_ref().map(to).transpose()?;
        self.scheduler.move_to(device)
    }

    /// The device the sampling state is on.
    pub fn device(&self) -> &Device {
        self.latents.device()
    }

    /// The denoised latents.
    pub fn into_latents(self) -> Tensor {
        self.latents
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    use framesmith_models::wan::random::random_weights;
    use framesmith_models::wan::ModelOptions;
    use framesmith_nn::vb::Vb;

    /// A tiny random expert (the pair: two seeds).
    fn tiny_expert(seed: u64, device: &Device) -> Result<WanModel> {
        let cfg = WanConfig::tiny(2);
        let weights = random_weights(&cfg, seed, DType::F32, device)?;
        WanModel::new(
            &cfg,
            Vb::from_tensors(weights, DType::F32, device),
            &ModelOptions::default(),
        )
    }

    /// Four steps at timesteps 1000, 750, 500, 250 (shift 1): the boundary 600 gives two to each expert.
    fn pair_request<'a>(
        context: &'a Tensor,
        negative: &'a Tensor,
        solver: Solver,
    ) -> GenerateRequest<'a> {
        GenerateRequest {
            context,
            negative: Some(negative),
            latent_shape: [16, 2, 4, 4],
            steps: 4,
            shift: 1.0,
            guidance: 3.0,
            seed: 5,
            solver,
        }
    }

    /// The seeded prompt and negative-prompt contexts of the pair tests.
    fn pair_prompts(dev: &Device) -> Result<(Tensor, Tensor)> {
        let context = randn(
            &mut StdRng::seed_from_u64(1),
            &[3usize, 32][..],
            0.0,
            1.0,
            dev,
        )?;
        let negative = randn(
            &mut StdRng::seed_from_u64(2),
            &[2usize, 32][..],
            0.0,
            1.0,
            dev,
        )?;
        Ok((context, negative))
    }

    /// The pair's latents with the low-noise expert on `low_device` and `residency`, and whether each expert
    /// ended parked.
    fn run_pair(
        residency: Residency,
        low_device: &Device,
        solver: Solver,
    ) -> Result<(Vec<f32>, bool, bool)> {
        let dev = Device::Cpu;
        let (context, negative) = pair_prompts(&dev)?;
        let req = pair_request(&context, &negative, solver);
        let mut high = tiny_expert(11, &dev)?;
        let mut low = tiny_expert(12, low_device)?;
        if residency == Residency::Shared {
            low.park()?;
        }
        let mut experts = Experts {
            high_noise: &mut high,
            low_noise: Some((&mut low, 600.0)),
            residency,
        };
        let latents = generate(&mut experts, &req, &|| false)?;
        let values = latents.flatten_all()?.to_vec1::<f32>()?;
        Ok((values, high.is_parked(), low.is_parked()))
    }

    #[test]
    fn experts_on_their_own_devices_denoise_exactly_as_one_device() -> Result<()> {
        for solver in [Solver::Unipc, Solver::Dpmpp, Solver::Euler] {
            // The two-GPU placement with both "GPUs" the CPU: the same clip, bit for bit, and nothing parked.
            let (shared, high_parked, low_parked) =
                run_pair(Residency::Shared, &Device::Cpu, solver)?;
            assert!(
                high_parked && !low_parked,
                "one device: the high-noise expert parked"
            );
            let (own, high_parked, low_parked) =
                run_pair(Residency::OwnDevices, &Device::Cpu, solver)?;
            assert!(!high_parked && !low_parked, "own devices: nothing parked");
            assert_eq!(shared, own, "{solver:?}");

            // Both experts were used: the high-noise one alone gives another result.
            let dev = Device::Cpu;
            let (context, negative) = pair_prompts(&dev)?;
            let req = pair_request(&context, &negative, solver);
            let mut high = tiny_expert(11, &dev)?;
            let alone = generate(&mut Experts::single(&mut high), &req, &|| false)?;
            assert_ne!(alone.flatten_all()?.to_vec1::<f32>()?, own, "{solver:?}");
        }
        Ok(())
    }

    #[test]
    fn first_frame_tokens_get_timestep_zero() {
        let cfg = WanConfig::wan22_ti2v_5b();
        let Timesteps::PerToken(rows) = first_frame_timesteps(&cfg, [48, 3, 4, 6], 937.0) else {
            panic!("per-token timesteps expected");
        };
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].len(), 3 * 2 * 3);
        assert!(rows[0][..6].iter().all(|&v| v == 0.0));
        assert!(rows[0][6..].iter().all(|&v| v == 937.0));
    }

    #[test]
    fn first_frame_replacement_keeps_the_rest() -> Result<()> {
        let dev = Device::Cpu;
        let latents = Tensor::arange(0f32, 24.0, &dev)?.reshape((2, 3, 2, 2))?;
        let first = Tensor::full(-1f32, (2, 1, 2, 2), &dev)?;
        let out = with_first_frame(&latents, &first)?;
        assert_eq!(
            out.narrow(1, 0, 1)?.flatten_all()?.to_vec1::<f32>()?,
            vec![-1.0; 8]
        );
        assert_eq!(
            out.narrow(1, 1, 2)?.flatten_all()?.to_vec1::<f32>()?,
            latents.narrow(1, 1, 2)?.flatten_all()?.to_vec1::<f32>()?
        );
        assert_eq!(out.dtype(), DType::F32);
        Ok(())
    }
}
