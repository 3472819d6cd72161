//! FLUX.1 text-to-image with loaded models, as the official `cli.py` samples: seeded start noise of the latent
//! size, packed into 2×2 tokens, the schedule with the resolution-dependent shift (`get_schedule(…, shift=True)`
//! for dev; none for schnell), the Euler `denoise` loop with the guidance strength as the model's input (dev is
//! guidance-distilled: one pass a step, no negative prompt), then the autoencoder's decoder, clamped to [−1, 1] and
//! mapped to 8-bit RGB. Text encoding is the caller's (`FluxTextEncoder`); so is writing the image.

use candle_core::{DType, Device, Tensor};
use image::RgbImage;
use rand::rngs::StdRng;
use rand::SeedableRng;

use framesmith_models::flux::autoencoder::AutoEncoder;
use framesmith_models::flux::sampling::{denoise, pack, schedule, Shift, LATENT_CHANNELS};
use framesmith_models::flux::{Flux, FluxInputs};
use framesmith_nn::init::randn;

/// The guidance strength of the official FLUX.1 [dev] sampling (`cli.py`'s default).
pub const DEV_GUIDANCE: f64 = 3.5;

/// What to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct FluxImageSettings {
    /// Image size in pixels: multiples of 2 × the autoencoder's down-sampling (16 for FLUX.1).
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    /// The distilled guidance strength the DiT takes (dev); unused by a model without a guidance input.
    pub guidance: f64,
    pub seed: u64,
}

/// A run of the loop stopped by its cancel poll.
#[derive(Debug, thiserror::Error)]
#[error("generation cancelled")]
pub struct Cancelled;

/// The prompt as the DiT takes it: T5's token states `txt` [1, L, context_in_dim] and CLIP's pooled `vec`
/// [1, vec_in_dim].
#[derive(Debug, Clone)]
pub struct FluxPrompt {
    pub txt: Tensor,
    pub vec: Tensor,
}

impl FluxImageSettings {
    /// The latent [h, w] of the image for an autoencoder that down-samples `factor`×, or what is wrong with the
    /// settings: sides that the autoencoder and the 2×2 packing cannot divide, no steps, a guidance that is not a
    /// finite number.
    pub fn latent_size(&self, factor: usize) -> anyhow::Result<[usize; 2]> {
        let step = 2 * factor.max(1);
        for (name, px) in [("--width", self.width), ("--height", self.height)] {
            if px == 0 || px % step != 0 {
                anyhow::bail!(
                    "{name} {px}: FLUX.1 images are sized in multiples of {step} pixels (e.g. {})",
                    (px / step).max(1) * step
                );
            }
        }
        if self.steps == 0 {
            anyhow::bail!(
                "--steps 0: give at least one sampling step (FLUX.1 [dev] is made for 20 to 50)"
            );
        }
        if !self.guidance.is_finite() || self.guidance < 0.0 {
            anyhow::bail!(
                "--guidance {}: give a number of 0 or more (FLUX.1 [dev] samples at {DEV_GUIDANCE})",
                self.guidance
            );
        }
        Ok([self.height / factor, self.width / factor])
    }
}

/// The start noise [1, 16, h, w] (f32) of `seed`, drawn on the host so a seed gives the same image on any device.
pub fn start_noise(seed: u64, [h, w]: [usize; 2], device: &Device) -> candle_core::Result<Tensor> {
    let rng = &mut StdRng::seed_from_u64(seed);
    randn(rng, (1, LATENT_CHANNELS, h, w), 0.0, 1.0, device)
}

/// Tokens [b, (h/2)(w/2), 4c] back to the latent [b, c, h, w] (the official `unpack` on the latent size).
fn unpack_latent(xs: &Tensor, [h, w]: [usize; 2]) -> candle_core::Result<Tensor> {
    let (b, l, d) = xs.dims3()?;
    if l != (h / 2) * (w / 2) || d % 4 != 0 {
        candle_core::bail!("FLUX: {l} tokens of width {d} do not unpack to a {h}×{w} latent");
    }
    xs.reshape((b, h / 2, w / 2, d / 4, 2, 2))?
        .permute((0, 3, 1, 4, 2, 5))?
        .reshape((b, d / 4, h, w))
}

/// Denoises the seeded noise of `latent` [h, w] with `model` (its linears computing in `dtype`) under `prompt`:
/// the shifted schedule when `model` is guidance-distilled (dev), the plain one otherwise (schnell), Euler steps in
/// f32. `cancelled` is polled before each step. Returns the latent [1, 16, h, w] (f32).
pub fn denoise_image(
    model: &Flux,
    prompt: &FluxPrompt,
    settings: &FluxImageSettings,
    latent: [usize; 2],
    dtype: DType,
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<Tensor> {
    let device = prompt.txt.device();
    let noise = start_noise(settings.seed, latent, device)?;
    let img = pack(&noise)?;
    let txt_len = prompt.txt.dim(1)?;
    let [_, img_ids, txt_ids] = framesmith_models::flux::sampling::prepare(&noise, txt_len)?;
    let guided = model.config().guidance_embed;
    let timesteps = schedule(settings.steps, img.dim(1)?, guided.then(Shift::default));
    let txt = prompt.txt.to_dtype(dtype)?;
    let y = prompt.vec.to_dtype(dtype)?;
    let mut stopped = false;
    let latent_tokens = denoise(&img, &timesteps, settings.guidance as f32, |img, t, g| {
        if cancelled() {
            stopped = true;
            candle_core::bail!("{Cancelled}");
        }
        let inputs = FluxInputs {
            img: img.to_dtype(dtype)?,
            img_ids: img_ids.clone(),
            txt: txt.clone(),
            txt_ids: txt_ids.clone(),
            timesteps: t.clone(),
            y: y.clone(),
            guidance: guided.then(|| g.clone()),
        };
        model.forward(&inputs)?.to_dtype(DType::F32)
    });
    if stopped {
        return Err(Cancelled.into());
    }
    Ok(unpack_latent(&latent_tokens?, latent)?)
}

/// The decoded image: the autoencoder (in `dtype`) on the latent, clamped to [−1, 1], `127.5·(x + 1)` truncated to
/// 8 bits as the official `cli.py` saves it.
pub fn decode_image(ae: &AutoEncoder, latent: &Tensor, dtype: DType) -> anyhow::Result<RgbImage> {
    let x = ae.decode(&latent.to_dtype(dtype)?)?.to_dtype(DType::F32)?;
    let (_, c, h, w) = x.dims4()?;
    if c != 3 {
        anyhow::bail!("the autoencoder decodes {c} channels, not RGB");
    }
    let bytes = ((x.clamp(-1f32, 1f32)? + 1.0)? * 127.5)?
        .floor()?
        .get(0)?
        .permute((1, 2, 0))?
        .to_dtype(DType::U8)?
        .flatten_all()?
        .to_vec1::<u8>()?;
    RgbImage::from_raw(w as u32, h as u32, bytes)
        .ok_or_else(|| anyhow::anyhow!("the decoded image has the wrong number of pixels"))
}

/// [`denoise_image`] then [`decode_image`]: the image for `prompt` with these settings.
pub fn generate_image(
    model: &Flux,
    ae: &AutoEncoder,
    prompt: &FluxPrompt,
    settings: &FluxImageSettings,
    dtype: DType,
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<RgbImage> {
    let latent = settings.latent_size(ae.config().downsample_factor())?;
    let z = denoise_image(model, prompt, settings, latent, dtype, cancelled)?;
    decode_image(ae, &z, dtype)
}
