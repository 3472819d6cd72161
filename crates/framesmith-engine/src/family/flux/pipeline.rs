//! FLUX.1 text-to-image with loaded models, as the official `cli.py` samples: seeded start noise of the latent
//! size, packed into 2×2 tokens, the schedule with the resolution-dependent shift (`get_schedule(…, shift=True)`
//! for dev; none for schnell), the Euler `denoise` loop with the guidance strength as the model's input (dev is
//! guidance-distilled: one pass a step, no negative prompt), then the autoencoder's decoder, clamped to [−1, 1] and
//! mapped to 8-bit RGB. The prompt goes through CLIP-L and T5-XXL first ([`encode_prompts`]), after the files
//! beside the DiT are checked ([`check_companions`]); writing the image is the caller's. `framesmith generate` and
//! samples during FLUX.1 training both sample through here.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::train::control_tokens;
use crate::family::image::pipeline::{check_sides, rgb_image};
use framesmith_models::flux::autoencoder::AutoEncoder;
use framesmith_models::flux::sampling::{denoise, pack, schedule, Shift, LATENT_CHANNELS};
use framesmith_models::flux::text_encoder::{FluxTextEncoder, TextEncoderFiles};
use framesmith_models::flux::weights::{identify_expected, FluxComponent, FluxFile, FluxKind};
use framesmith_models::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::offload::release_cached_memory;

/// The guidance strength of the official FLUX.1 [dev] sampling (`cli.py`'s default).
pub const DEV_GUIDANCE: f64 = 3.5;

/// T5 tokens of a FLUX.1 [dev] prompt (the official `load_t5(max_length=512)`).
pub const DEV_T5_TOKENS: usize = 512;

/// How the settings are named where they were given: `framesmith generate`'s flags, or a prompt file's options.
#[derive(Debug, Clone, Copy)]
pub struct SettingNames {
    pub width: &'static str,
    pub height: &'static str,
    pub steps: &'static str,
    pub guidance: &'static str,
}

impl SettingNames {
    /// `framesmith generate`'s flags.
    pub const FLAGS: Self = Self {
        width: "--width",
        height: "--height",
        steps: "--steps",
        guidance: "--guidance",
    };
    /// A musubi-tuner prompt file's options.
    pub const PROMPT_FILE: Self = Self {
        width: "--w",
        height: "--h",
        steps: "--s",
        guidance: "--l",
    };
}

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

pub use crate::family::image::pipeline::Cancelled;

/// The prompt as the DiT takes it: T5's token states `txt` [1, L, context_in_dim] and CLIP's pooled `vec`
/// [1, vec_in_dim]; for FLUX.1 Kontext, the latents [1, 16, h, w] of the image it edits.
#[derive(Debug, Clone)]
pub struct FluxPrompt {
    pub txt: Tensor,
    pub vec: Tensor,
    /// Kontext's control image latents, appended as conditioning tokens (ids axis 0 = 1) at every step.
    pub control: Option<Tensor>,
}

impl FluxImageSettings {
    /// The latent [h, w] of the image for an autoencoder that down-samples `factor`×, or what is wrong with the
    /// settings (named as `framesmith generate`'s flags): sides that the autoencoder and the 2×2 packing cannot
    /// divide, no steps, a guidance that is not a finite number.
    pub fn latent_size(&self, factor: usize) -> anyhow::Result<[usize; 2]> {
        self.latent_size_as(factor, SettingNames::FLAGS)
    }

    /// [`FluxImageSettings::latent_size`] with the settings named by `names`.
    pub fn latent_size_as(&self, factor: usize, names: SettingNames) -> anyhow::Result<[usize; 2]> {
        let sides = [(names.width, self.width), (names.height, self.height)];
        check_sides(sides, 2 * factor.max(1), "FLUX.1")?;
        if self.steps == 0 {
            anyhow::bail!(
                "{} 0: give at least one sampling step (FLUX.1 [dev] is made for 20 to 50)",
                names.steps
            );
        }
        if !self.guidance.is_finite() || self.guidance < 0.0 {
            anyhow::bail!(
                "{} {}: give a number of 0 or more (FLUX.1 [dev] samples at {DEV_GUIDANCE})",
                names.guidance,
                self.guidance
            );
        }
        Ok([self.height / factor, self.width / factor])
    }
}

/// The start noise [1, 16, h, w] (f32) of `seed`, drawn on the host so a seed gives the same image on any device.
pub fn start_noise(seed: u64, latent: [usize; 2], device: &Device) -> candle_core::Result<Tensor> {
    crate::family::image::pipeline::start_noise(seed, LATENT_CHANNELS, latent, device)
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
/// f32. `cancelled` is polled before each step. LoRAs being trained are read as plain tensors
/// ([`framesmith_nn::lora::untracked`]), so no step keeps an autograd graph. Returns the latent [1, 16, h, w] (f32).
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
    let target_len = img.dim(1)?;
    // Kontext: the control tokens follow the image's at every step; the prediction keeps the image's rows.
    let (control, img_ids) = match &prompt.control {
        Some(c) => {
            let empty = img.narrow(1, 0, 0)?.to_dtype(dtype)?;
            let (tokens, ids) = control_tokens(&c.to_dtype(dtype)?, empty, img_ids)?;
            (Some(tokens), ids)
        }
        None => (None, img_ids),
    };
    let guided = model.config().guidance_embed;
    let timesteps = schedule(settings.steps, img.dim(1)?, guided.then(Shift::default));
    let txt = prompt.txt.to_dtype(dtype)?;
    let y = prompt.vec.to_dtype(dtype)?;
    let mut stopped = false;
    let latent_tokens = framesmith_nn::lora::untracked(|| {
        denoise(&img, &timesteps, settings.guidance as f32, |img, t, g| {
            if cancelled() {
                stopped = true;
                candle_core::bail!("{Cancelled}");
            }
            let img = img.to_dtype(dtype)?;
            let img = match &control {
                Some(c) => Tensor::cat(&[&img, c], 1)?,
                None => img,
            };
            let inputs = FluxInputs {
                img,
                img_ids: img_ids.clone(),
                txt: txt.clone(),
                txt_ids: txt_ids.clone(),
                timesteps: t.clone(),
                y: y.clone(),
                guidance: guided.then(|| g.clone()),
            };
            model
                .forward(&inputs)?
                .narrow(1, 0, target_len)?
                .to_dtype(DType::F32)
        })
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
    let (_, c, _, _) = x.dims4()?;
    if c != 3 {
        anyhow::bail!("the autoencoder decodes {c} channels, not RGB");
    }
    rgb_image(&((x.clamp(-1f32, 1f32)? + 1.0)? * 127.5)?.floor()?)
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

/// A FLUX.1 file given beside the DiT, with the flag or config key it was given as (messages name it).
#[derive(Debug, Clone, Copy)]
pub struct Companion<'a> {
    pub key: &'a str,
    pub path: &'a Path,
}

/// The files FLUX.1 samples with beside its DiT.
#[derive(Debug, Clone, Copy)]
pub struct Companions<'a> {
    pub autoencoder: Companion<'a>,
    pub clip_l: Companion<'a>,
    pub t5: Companion<'a>,
}

/// `identify_expected` with the flag or key the file was given as in the message.
fn expect(file: Companion, component: FluxComponent) -> anyhow::Result<FluxFile> {
    identify_expected(file.path, component, None).map_err(|e| anyhow::anyhow!("{}: {e}", file.key))
}

/// Checks the autoencoder and the text encoders against the DiT of config `cfg` before anything loads: each file
/// the component its key names, the latent channels, CLIP's vector and T5's state widths the DiT's.
pub fn check_companions(files: &Companions, cfg: &FluxConfig) -> anyhow::Result<()> {
    let mismatch = |file: Companion, component: FluxComponent, what: String| {
        anyhow::anyhow!(
            "{}: {what}; give the file made for this DiT ({} for FLUX.1): {}",
            file.key,
            component.file(),
            file.path.display()
        )
    };
    let ae = FluxComponent::Autoencoder;
    if let FluxKind::Autoencoder { z_channels, .. } = expect(files.autoencoder, ae)?.kind {
        if z_channels * 4 != cfg.in_channels {
            let what = format!(
                "the autoencoder makes {z_channels} latent channels, but the DiT takes {} (packed 2×2)",
                cfg.in_channels / 4
            );
            return Err(mismatch(files.autoencoder, ae, what));
        }
    }
    let clip = FluxComponent::ClipL;
    if let FluxKind::ClipText { hidden, .. } = expect(files.clip_l, clip)?.kind {
        if hidden != cfg.vec_in_dim {
            let what = format!(
                "CLIP gives {hidden}-wide vectors, but the DiT takes {}",
                cfg.vec_in_dim
            );
            return Err(mismatch(files.clip_l, clip, what));
        }
    }
    let t5 = FluxComponent::T5;
    if let FluxKind::T5 { dim, .. } = expect(files.t5, t5)?.kind {
        if dim != cfg.context_in_dim {
            let what = format!(
                "T5 gives {dim}-wide states, but the DiT takes {}",
                cfg.context_in_dim
            );
            return Err(mismatch(files.t5, t5, what));
        }
    }
    Ok(())
}

/// Each of `prompts` through CLIP-L and T5-XXL loaded from `files` in `dtype` on `device`, one at a time (so a
/// prompt is encoded as it is alone). The encoders are dropped and the device's cached memory given back before
/// this returns.
pub fn encode_prompts(
    files: TextEncoderFiles,
    prompts: &[&str],
    (dtype, device): (DType, &Device),
) -> anyhow::Result<Vec<FluxPrompt>> {
    let encoder = FluxTextEncoder::load(files, dtype, device).with_context(|| {
        format!(
            "loading the FLUX.1 text encoders {} and {}",
            files.clip.display(),
            files.t5.display()
        )
    })?;
    let encoded = prompts
        .iter()
        .map(|prompt| {
            let (txt, vec) = encoder
                .encode(&[*prompt])
                .with_context(|| format!("encoding the prompt \"{prompt}\""))?;
            Ok(FluxPrompt {
                txt,
                vec,
                control: None,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop(encoder);
    release_cached_memory(device)?;
    Ok(encoded)
}

#[cfg(test)]
mod tests;
