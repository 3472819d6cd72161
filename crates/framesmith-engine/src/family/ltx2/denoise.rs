//! LTX-2's denoising loop over both streams, as ltx-pipelines' `euler_denoising_loop` with its guided denoiser runs
//! it (github:Lightricks/LTX-2 @400fd31): the video tokens and, for sound, the audio stream's tokens go through one
//! transformer forward per pass (the audio latents' frames follow the clip's duration: `AudioLatentShape
//! .from_video_pixel_shape`, 25 latent frames a second, rounded half to even as Python rounds); each stream's
//! velocity becomes its denoised latents (`X0Model`: `x − σ·v`, per token: a clean first-frame token's timestep is
//! 0), the negative prompt's pass (both streams' negative contexts) guides each stream with its own scale and the
//! rescale (`MultiModalGuider`: video at the request's scale, audio at the pipelines' 7.0), the conditioned
//! first-frame tokens are put back as they were (`post_process_latent`), and both streams take the same Euler step.
//! Image-to-video (`VideoConditionByLatentIndex` at latent 0, strength 1): the image's latents replace the first
//! latent frame's tokens of the start noise and stay clean throughout, at timestep 0 (per-token timesteps).

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::pipeline::{euler_step, guide, Ltx2Settings, GUIDANCE_RESCALE};
use super::train::FRAME_RATE;
use crate::generate::request::Cancelled;
use framesmith_models::ltx2::rope::{audio_positions, video_positions};
use framesmith_models::ltx2::{Ltx2AudioInputs, Ltx2Inputs, Ltx2Transformer};
use framesmith_nn::init::randn;

/// The audio guidance of ltx-pipelines' defaults (`audio_guider_params.cfg_scale`, both releases).
pub const AUDIO_GUIDANCE: f64 = 7.0;
/// Audio latent frames a second: 16 kHz, hop 160, the audio VAE's 4× downsampling (`AudioLatentShape`).
const AUDIO_LATENTS_PER_SECOND: f64 = 16_000.0 / 160.0 / 4.0;

/// The audio latent frames of a clip of `frames` frames at `fps` (`AudioLatentShape.from_video_pixel_shape`).
pub fn audio_latent_frames(frames: usize, fps: f64) -> usize {
    (frames as f64 / fps * AUDIO_LATENTS_PER_SECOND).round_ties_even() as usize
}

/// A text context of both streams: the video connector's output [L, D] and, for sound, the audio connector's
/// [L, D_audio].
#[derive(Debug, Clone)]
pub struct Ltx2Context {
    pub video: Tensor,
    pub audio: Option<Tensor>,
}

/// A prompt's text context, and the negative prompt's when guidance runs it.
#[derive(Debug, Clone)]
pub struct Ltx2Prompt {
    pub text: Ltx2Context,
    pub negative: Option<Ltx2Context>,
}

/// The tokens being denoised (f32).
#[derive(Debug, Clone)]
pub struct ClipTokens {
    /// Video tokens [1, F·H·W, C] (frame-major) of a latent `[f, h, w]`.
    pub video: Tensor,
    pub latent: [usize; 3],
    /// The audio stream's tokens [1, T, C·mel], for sound.
    pub audio: Option<Tensor>,
    /// Image-to-video: the clean first-frame tokens [1, H·W, C], kept as they are at timestep 0.
    pub first_frame: Option<Tensor>,
}

/// The guidance scales of the two streams (used when the prompt carries a negative one).
#[derive(Debug, Clone, Copy)]
pub struct Guidance {
    pub video: f64,
    pub audio: f64,
}

/// What a clip starts from: its latent `[f, h, w]`, the first frame's latents `[C, 1, H, W]` (normalised, as the
/// VAE's encoder gives them) for image-to-video, and the audio latent frames for sound.
#[derive(Debug, Clone, Default)]
pub struct ClipStart {
    pub latent: [usize; 3],
    pub first_frame: Option<Tensor>,
    pub audio_frames: Option<usize>,
}

/// A denoised clip: the video latents [C, F, H, W] and, for sound, the audio stream's tokens [1, T, C·mel]
/// (both f32, normalised).
pub struct ClipLatents {
    pub video: Tensor,
    pub audio: Option<Tensor>,
}

/// The seeded start noise of the video tokens [1, `tokens`, `channels`] then, for sound, of the audio tokens,
/// drawn in that order from one generator on the host (as the pipelines draw the video state's noise, then the
/// audio state's), so a seed gives the same clip on any device and the video's noise does not depend on sound.
pub fn start_noise(
    seed: u64,
    (video, audio): ((usize, usize), Option<(usize, usize)>),
    device: &Device,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let rng = &mut StdRng::seed_from_u64(seed);
    let v = randn(rng, (1, video.0, video.1), 0.0, 1.0, device)?;
    let a = audio
        .map(|(t, c)| randn(rng, (1, t, c), 0.0, 1.0, device))
        .transpose()?;
    Ok((v, a))
}

/// The video and audio positions of a clip's tokens.
struct Positions {
    video: Tensor,
    audio: Option<Tensor>,
}

/// `tokens` with its leading rows replaced by `lead` (as many rows as it has).
fn with_lead(tokens: &Tensor, lead: &Tensor) -> candle_core::Result<Tensor> {
    let (n, all) = (lead.dim(1)?, tokens.dim(1)?);
    Tensor::cat(&[lead, &tokens.narrow(1, n, all - n)?], 1)
}

/// Both streams' denoised latents for the tokens `x` at `sigma` under the text context `text`, computed in
/// `dtype` (`X0Model`: the first frame's clean tokens, at timestep 0, stay what they are).
fn denoised(
    model: &Ltx2Transformer,
    (x, positions): (&ClipTokens, &Positions),
    text: &Ltx2Context,
    (sigma, dtype): (f32, DType),
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let device = x.video.device();
    let context = |t: &Tensor| t.to_device(device)?.to_dtype(dtype)?.unsqueeze(0);
    let audio = match (&x.audio, &text.audio, &positions.audio) {
        (Some(a), Some(ctx), Some(pos)) => Some(Ltx2AudioInputs {
            latents: a.to_dtype(dtype)?,
            positions: pos.clone(),
            context: context(ctx)?,
        }),
        (None, _, _) => None,
        _ => candle_core::bail!("LTX-2 sound: the prompt carries no audio text context"),
    };
    let conditioned = match &x.first_frame {
        Some(lead) => vec![lead.dim(1)?],
        None => Vec::new(),
    };
    let inputs = Ltx2Inputs {
        latents: x.video.to_dtype(dtype)?,
        sigmas: vec![sigma],
        positions: positions.video.clone(),
        context: context(&text.video)?,
        context_lens: None,
        audio,
        conditioned_tokens: conditioned,
    };
    let (v, a) = model.forward_streams(&inputs)?;
    let sigma = f64::from(sigma);
    let mut video = (&x.video - (v.to_dtype(DType::F32)? * sigma)?)?;
    if let Some(lead) = &x.first_frame {
        video = with_lead(&video, &x.video.narrow(1, 0, lead.dim(1)?)?)?;
    }
    let audio = match (a, &x.audio) {
        (Some(a), Some(xa)) => Some((xa - (a.to_dtype(DType::F32)? * sigma)?)?),
        _ => None,
    };
    Ok((video, audio))
}

/// Guides `cond` away from `uncond` (a stream's denoised latents of the two passes) at `scale` with the rescale.
fn guided(
    cond: Option<Tensor>,
    uncond: Option<Tensor>,
    scale: f64,
) -> candle_core::Result<Option<Tensor>> {
    match (cond, uncond) {
        (Some(c), Some(u)) => Ok(Some(guide(&c, &u, (scale, GUIDANCE_RESCALE))?)),
        (c, _) => Ok(c),
    }
}

/// One step of both streams from `sigma` to `next`.
fn step(
    model: &Ltx2Transformer,
    prompt: &Ltx2Prompt,
    (x, positions): (&ClipTokens, &Positions),
    (sigma, next, guidance): (f32, f32, Guidance),
    dtype: DType,
) -> candle_core::Result<ClipTokens> {
    let (cond_v, cond_a) = denoised(model, (x, positions), &prompt.text, (sigma, dtype))?;
    let (mut video, audio) = match &prompt.negative {
        Some(negative) => {
            let (un_v, un_a) = denoised(model, (x, positions), negative, (sigma, dtype))?;
            (
                guide(&cond_v, &un_v, (guidance.video, GUIDANCE_RESCALE))?,
                guided(cond_a, un_a, guidance.audio)?,
            )
        }
        None => (cond_v, cond_a),
    };
    if let Some(lead) = &x.first_frame {
        video = with_lead(&video, lead)?;
    }
    let audio = match (&x.audio, audio) {
        (Some(xa), Some(da)) => Some(euler_step(xa, &da, (sigma, next))?),
        _ => None,
    };
    Ok(ClipTokens {
        video: euler_step(&x.video, &video, (sigma, next))?,
        latent: x.latent,
        audio,
        first_frame: x.first_frame.clone(),
    })
}

/// Denoises `x` along `sigmas` under `prompt` (guided at `guidance` when the prompt carries a negative one),
/// polling `cancelled` between steps; returns the tokens.
pub fn denoise_tokens(
    model: &Ltx2Transformer,
    prompt: &Ltx2Prompt,
    mut x: ClipTokens,
    (sigmas, guidance): (&[f32], Guidance),
    (dtype, cancelled): (DType, &dyn Fn() -> bool),
) -> anyhow::Result<ClipTokens> {
    let device = x.video.device().clone();
    let [f, h, w] = x.latent;
    let positions = Positions {
        video: video_positions(1, (f, h, w), FRAME_RATE, &device)?.to_dtype(DType::F32)?,
        audio: match &x.audio {
            Some(a) => Some(audio_positions(1, a.dim(1)?, &device)?),
            None => None,
        },
    };
    for pair in sigmas.windows(2) {
        if cancelled() {
            return Err(Cancelled.into());
        }
        let (sigma, next) = (pair[0], pair[1]);
        x = framesmith_nn::lora::untracked(|| {
            step(
                model,
                prompt,
                (&x, &positions),
                (sigma, next, guidance),
                dtype,
            )
        })?;
    }
    Ok(x)
}

/// The tokens [1, F·H·W, C] of latents [C, F, H, W] (frame-major, the `VideoLatentPatchifier`'s order).
pub fn video_tokens(latents: &Tensor) -> candle_core::Result<Tensor> {
    let (c, f, h, w) = latents.dims4()?;
    latents
        .permute((1, 2, 3, 0))?
        .reshape((1, f * h * w, c))?
        .contiguous()
}

/// Denoises the clip `settings` asks for from `start` under `prompt` into its latents (the video [C, F, H, W]
/// normalised as the VAE's encoder gives them; for sound the audio tokens), polling `cancelled` between steps.
pub fn denoise_clip(
    model: &Ltx2Transformer,
    prompt: &Ltx2Prompt,
    settings: &Ltx2Settings,
    (start, dtype, device): (&ClipStart, DType, &Device),
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<ClipLatents> {
    let channels = model.cfg.out_channels;
    let [f, h, w] = start.latent;
    let audio_shape = start.audio_frames.map(|t| (t, model.cfg.audio_in_channels));
    let (mut video, audio) =
        start_noise(settings.seed, ((f * h * w, channels), audio_shape), device)?;
    let first_frame = match &start.first_frame {
        Some(latents) => {
            let lead = video_tokens(&latents.to_device(device)?.to_dtype(DType::F32)?)?;
            video = with_lead(&video, &lead)?;
            Some(lead)
        }
        None => None,
    };
    let prompt = if settings.guided() {
        prompt.clone()
    } else {
        Ltx2Prompt {
            text: prompt.text.clone(),
            negative: None,
        }
    };
    let tokens = ClipTokens {
        video,
        latent: start.latent,
        audio,
        first_frame,
    };
    let guidance = Guidance {
        video: settings.guidance,
        audio: AUDIO_GUIDANCE,
    };
    let out = denoise_tokens(
        model,
        &prompt,
        tokens,
        (&settings.sigmas(), guidance),
        (dtype, cancelled),
    )?;
    Ok(ClipLatents {
        video: out
            .video
            .squeeze(0)?
            .reshape((f, h, w, channels))?
            .permute((3, 0, 1, 2))?
            .contiguous()?,
        audio: out.audio,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audio_frames_follow_the_duration_rounded_as_python_rounds() {
        // 121 frames at 24 fps: 5.0417 s, 126.04 latent frames.
        assert_eq!(audio_latent_frames(121, 24.0), 126);
        assert_eq!(audio_latent_frames(5, 24.0), 5);
        // 0.5 rounds to even: 12 frames at 24 fps is 12.5 latent frames.
        assert_eq!(audio_latent_frames(12, 24.0), 12);
        assert_eq!(audio_latent_frames(36, 24.0), 38);
    }

    #[test]
    fn the_video_noise_does_not_depend_on_sound() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (alone, none) = start_noise(3, ((6, 4), None), &dev)?;
        let (with, audio) = start_noise(3, ((6, 4), Some((5, 2))), &dev)?;
        assert!(none.is_none());
        assert_eq!(alone.to_vec3::<f32>()?, with.to_vec3::<f32>()?);
        assert_eq!(audio.map(|a| a.dims().to_vec()), Some(vec![1, 5, 2]));
        Ok(())
    }

    #[test]
    fn tokens_are_frame_major() -> candle_core::Result<()> {
        let latents = Tensor::arange(0f32, 24.0, &Device::Cpu)?.reshape((2, 3, 2, 2))?;
        let tokens = video_tokens(&latents)?;
        assert_eq!(tokens.dims(), [1, 12, 2]);
        // Token (frame 0, row 0, column 1) holds channel 0's value 1 and channel 1's value 13.
        assert_eq!(tokens.get(0)?.get(1)?.to_vec1::<f32>()?, [1.0, 13.0]);
        Ok(())
    }
}
