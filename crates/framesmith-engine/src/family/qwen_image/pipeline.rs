//! Qwen-Image text-to-image with loaded models, as diffusers' `QwenImagePipeline` samples: seeded start noise of the
//! latent size packed into 2×2 tokens, the FlowMatch Euler schedule of Qwen-Image's scheduler config (sigmas
//! `linspace(1, 1/n, n)` under the dynamic shift exp(μ), μ linear in the image tokens through (256, 0.5) and
//! (8192, 0.9), then stretched so the last sigma is `shift_terminal` = 0.02), and true classifier-free guidance when
//! a negative prompt is given (`true_cfg_scale` > 1: `neg + s·(cond − neg)`, rescaled per token to the conditional
//! prediction's norm). The VAE decodes the latent; the image is `round(255·clamp(x/2 + 1/2, 0, 1))`. `framesmith
//! generate` and samples during Qwen-Image training both sample through here.

use candle_core::{DType, Tensor, D};
use image::RgbImage;

use crate::family::image::pipeline::{check_sides, rgb_image, start_noise};
use framesmith_models::qwen_image::latents::{pack, unpack};
use framesmith_models::qwen_image::rope::ImageGrid;
use framesmith_models::qwen_image::vae::QwenImageVae;
use framesmith_models::qwen_image::{QwenImageInputs, QwenImageTransformer};

/// The pipeline's defaults: 50 steps, `true_cfg_scale` 4.0, 1024×1024.
pub const DEFAULT_STEPS: usize = 50;
pub const DEFAULT_CFG_SCALE: f64 = 4.0;
pub const DEFAULT_SIDE: usize = 1024;
/// Pixels per latent pixel of Qwen-Image's VAE.
pub const VAE_FACTOR: usize = 8;

/// The scheduler's dynamic-shift line and terminal sigma (`scheduler/scheduler_config.json`).
const BASE_SEQ_LEN: f64 = 256.0;
const MAX_SEQ_LEN: f64 = 8192.0;
const BASE_SHIFT: f64 = 0.5;
const MAX_SHIFT: f64 = 0.9;
const SHIFT_TERMINAL: f64 = 0.02;

/// What to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenImageSettings {
    /// Image size in pixels: multiples of 16 (the VAE's 8 × the 2×2 packing).
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    /// The true-CFG scale, applied when there is a negative prompt.
    pub cfg_scale: f64,
    pub seed: u64,
}

/// A prompt as the transformer takes it: the hidden states of its valid tokens [L, D], and those of the negative
/// prompt when classifier-free guidance is on; for Qwen-Image-Edit, the latents [1, 16, h, w] of the images it edits.
#[derive(Debug, Clone)]
pub struct QwenImagePrompt {
    pub embed: Tensor,
    pub negative: Option<Tensor>,
    /// Qwen-Image-Edit's control images' latents, in order: their tokens follow the image's at every step, each
    /// its own grid (frame k of the RoPE), as the edit pipelines concatenate them.
    pub controls: Vec<Tensor>,
}

/// The control images' packed tokens [1, n, 4c] (in `dtype`) and their grids; `None` without controls.
fn control_tokens(
    controls: &[Tensor],
    dtype: DType,
) -> candle_core::Result<Option<(Tensor, Vec<ImageGrid>)>> {
    if controls.is_empty() {
        return Ok(None);
    }
    let mut tokens = Vec::with_capacity(controls.len());
    let mut grids = Vec::with_capacity(controls.len());
    for control in controls {
        let (_, _, h, w) = control.dims4()?;
        tokens.push(pack(&control.to_dtype(dtype)?)?);
        grids.push(ImageGrid::image(h / 2, w / 2));
    }
    Ok(Some((Tensor::cat(&tokens, 1)?, grids)))
}

pub use crate::family::image::pipeline::Cancelled;

impl QwenImageSettings {
    /// The latent [h, w] of the image, or what is wrong with the settings named as `names` (width, height, steps).
    pub fn latent_size(&self, names: [&str; 3]) -> anyhow::Result<[usize; 2]> {
        let sides = [(names[0], self.width), (names[1], self.height)];
        check_sides(sides, 2 * VAE_FACTOR, "Qwen-Image")?;
        if self.steps == 0 {
            anyhow::bail!(
                "{} 0: give at least one sampling step (Qwen-Image samples with {DEFAULT_STEPS})",
                names[2]
            );
        }
        Ok([self.height / VAE_FACTOR, self.width / VAE_FACTOR])
    }
}

/// The sigmas of `steps` Euler steps for `image_tokens` tokens, ending in 0 (`steps + 1` values).
pub fn sigmas(steps: usize, image_tokens: usize) -> Vec<f64> {
    let slope = (MAX_SHIFT - BASE_SHIFT) / (MAX_SEQ_LEN - BASE_SEQ_LEN);
    let mu = image_tokens as f64 * slope + (BASE_SHIFT - slope * BASE_SEQ_LEN);
    let n = steps.max(1);
    let last = 1.0 / n as f64;
    let shifted: Vec<f64> = (0..n)
        .map(|i| {
            let t = if n == 1 {
                1.0
            } else {
                1.0 + (last - 1.0) * i as f64 / (n - 1) as f64
            };
            mu.exp() / (mu.exp() + (1.0 / t - 1.0))
        })
        .collect();
    let scale = (1.0 - shifted[n - 1]) / (1.0 - SHIFT_TERMINAL);
    let mut out: Vec<f64> = shifted.iter().map(|s| 1.0 - (1.0 - s) / scale).collect();
    out.push(0.0);
    out
}

/// The model's velocity for `img` at sigma `t` under `embed` [L, D], with `controls` (tokens and grids) after the
/// image's tokens; the prediction keeps the image's rows (`noise_pred[:, :latents.size(1)]`).
fn velocity(
    model: &QwenImageTransformer,
    (img, controls): (&Tensor, Option<&(Tensor, Vec<ImageGrid>)>),
    embed: &Tensor,
    (grid, t, dtype): (ImageGrid, f64, DType),
) -> candle_core::Result<Tensor> {
    let mut xs = img.to_dtype(dtype)?;
    let mut img_grids = vec![grid];
    if let Some((tokens, grids)) = controls {
        xs = Tensor::cat(&[&xs, tokens], 1)?;
        img_grids.extend_from_slice(grids);
    }
    let inputs = QwenImageInputs {
        img: xs,
        img_grids,
        txt: embed.to_dtype(dtype)?.unsqueeze(0)?,
        txt_lens: None,
        timesteps: Tensor::new(&[t as f32], img.device())?,
    };
    model
        .forward(&inputs)?
        .narrow(1, 0, grid.tokens())?
        .to_dtype(DType::F32)
}

/// `neg + scale·(cond − neg)`, rescaled per token to the norm of `cond` (the pipeline's true CFG).
pub fn true_cfg(cond: &Tensor, neg: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let combined = (neg + ((cond - neg)? * scale)?)?;
    let norm = |x: &Tensor| x.sqr()?.sum_keepdim(D::Minus1)?.sqrt();
    combined.broadcast_mul(&norm(cond)?.broadcast_div(&norm(&combined)?)?)
}

/// Denoises the seeded noise of `latent` [h, w] with `model` (its linears computing in `dtype`) under `prompt`;
/// `cancelled` is polled before each step. LoRAs being trained are read as plain tensors, so no step keeps an
/// autograd graph. Returns the latent [1, 16, 1, h, w] (f32).
pub fn denoise_image(
    model: &QwenImageTransformer,
    prompt: &QwenImagePrompt,
    settings: &QwenImageSettings,
    latent: [usize; 2],
    dtype: DType,
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<Tensor> {
    let device = prompt.embed.device();
    let channels = model.config().in_channels / 4;
    let noise = start_noise(settings.seed, channels, latent, device)?;
    let mut img = pack(&noise)?;
    let grid = ImageGrid::image(latent[0] / 2, latent[1] / 2);
    let sigmas = sigmas(settings.steps, grid.tokens());
    let controls = control_tokens(&prompt.controls, dtype)?;
    let guided = prompt
        .negative
        .as_ref()
        .filter(|_| settings.cfg_scale > 1.0);
    for pair in sigmas.windows(2) {
        if cancelled() {
            return Err(Cancelled.into());
        }
        let (t, next) = (pair[0], pair[1]);
        let v = framesmith_nn::lora::untracked(|| -> candle_core::Result<Tensor> {
            let x = (&img, controls.as_ref());
            let cond = velocity(model, x, &prompt.embed, (grid, t, dtype))?;
            match guided {
                Some(neg) => {
                    let uncond = velocity(model, x, neg, (grid, t, dtype))?;
                    true_cfg(&cond, &uncond, settings.cfg_scale)
                }
                None => Ok(cond),
            }
        })?;
        img = (img + (v * (next - t))?)?;
    }
    Ok(unpack(&img, latent)?.unsqueeze(2)?)
}

/// The decoded image of `latent` [1, 16, 1, h, w] through `vae` (in `dtype`).
pub fn decode_image(vae: &QwenImageVae, latent: &Tensor, dtype: DType) -> anyhow::Result<RgbImage> {
    let x = vae.decode(&latent.to_dtype(dtype)?)?.to_dtype(DType::F32)?;
    let (_, c, _, _) = x.dims4()?;
    if c != 3 {
        anyhow::bail!("the VAE decodes {c} channels, not RGB");
    }
    rgb_image(
        &((x * 0.5)? + 0.5)?
            .clamp(0f32, 1f32)?
            .affine(255.0, 0.0)?
            .round()?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_the_shifted_linspace_stretched_to_its_terminal() {
        // 1024×1024: 4096 tokens, μ = 0.5 + 3840·0.4/7936.
        let s = sigmas(4, 4096);
        assert_eq!(s.len(), 5);
        let mu = 0.5 + 3840.0 * 0.4 / 7936.0_f64;
        let shift = |t: f64| mu.exp() / (mu.exp() + (1.0 / t - 1.0));
        let raw = [1.0, 0.75, 0.5, 0.25].map(shift);
        let scale = (1.0 - raw[3]) / 0.98;
        for (got, r) in s.iter().zip(raw) {
            assert!((got - (1.0 - (1.0 - r) / scale)).abs() < 1e-12, "{s:?}");
        }
        assert!((s[0] - 1.0).abs() < 1e-12 && (s[3] - 0.02).abs() < 1e-12 && s[4] == 0.0);
        assert!(s.windows(2).all(|p| p[0] > p[1]));
    }

    #[test]
    fn true_cfg_keeps_the_conditional_norm_per_token() -> candle_core::Result<()> {
        let dev = candle_core::Device::Cpu;
        let cond = Tensor::new(&[[[3f32, 4.0], [1.0, 0.0]]], &dev)?;
        let neg = Tensor::new(&[[[1f32, 0.0], [0.0, 1.0]]], &dev)?;
        let out = true_cfg(&cond, &neg, 4.0)?;
        // Token 0: 1 + 4·2 = 9, 0 + 4·4 = 16, rescaled to norm 5.
        let norm = (81f32 + 256.0).sqrt();
        let want = [9.0 * 5.0 / norm, 16.0 * 5.0 / norm];
        let got = out.get(0)?.get(0)?.to_vec1::<f32>()?;
        assert!(
            (got[0] - want[0]).abs() < 1e-5 && (got[1] - want[1]).abs() < 1e-5,
            "{got:?}"
        );
        let t1 = out.get(0)?.get(1)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
        assert!((t1 - 1.0).abs() < 1e-5);
        Ok(())
    }

    #[test]
    fn sizes_are_multiples_of_16_and_steps_positive() {
        let mut s = QwenImageSettings {
            width: 1024,
            height: 768,
            steps: 50,
            cfg_scale: 4.0,
            seed: 0,
        };
        let names = ["--width", "--height", "--steps"];
        assert_eq!(s.latent_size(names).ok(), Some([96, 128]));
        s.width = 1000;
        let err = s
            .latent_size(names)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with("--width 1000") && err.contains("992"),
            "{err}"
        );
        s.width = 1024;
        s.steps = 0;
        assert!(s.latent_size(names).is_err());
    }
}
