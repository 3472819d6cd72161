//! LTX-2 text-to-video with loaded models, as ltx-core samples (github:Lightricks/LTX-2 @400fd31: the trainer's
//! `ValidationRunner._run_denoising` and ltx-pipelines' one-stage pipeline, both over ltx-core's components):
//! seeded start noise as tokens [1, F·H·W, 128] (frame-major, the `VideoLatentPatchifier`'s order) at the
//! positions of the trainer's 24 fps; sigmas from `LTX2Scheduler` (the linspace shifted by `exp(μ)` with `μ`
//! linear in the token count between 0.95 at 1024 and 2.05 at 4096 tokens, the pipelines' default 4096 when no
//! latent is given, then stretched so that the last non-zero sigma is 0.1) or, for a distilled checkpoint, the
//! distilled pipeline's fixed eight steps; the transformer's velocity turned into the denoised latents
//! `x − σ·v` (`X0Model`), classifier-free guidance on them as `MultiModalGuider` computes it (`cond + (g − 1)·(cond
//! − uncond)` at 3.0 with the negative prompt as its own pass, then the guidance rescale 0.7: the result scaled by
//! `0.7·std(cond)/std(pred) + 0.3`; STG, which perturbs the model, is not run), and Euler steps
//! (`EulerDiffusionStep`: `x + (x − denoised)/σ · (σ_next − σ)`). The loop itself, over the video stream alone or
//! both streams for sound, and the image-to-video first frame, is [`super::denoise`]. The decoder
//! ([`super::decode`]) turns the latents into frames, [`super::sound`] the audio into sound. `framesmith generate`
//! and samples during training both sample through here.

use std::path::Path;

use candle_core::{DType, Tensor};

use super::train::FRAME_RATE;
use crate::generate::sampler::torch_linspace_f32;
use framesmith_models::ltx2::Ltx2Version;

/// The negative prompt of the official trainer's validation samples (`ltx_trainer.config.DEFAULT_NEGATIVE_PROMPT`).
macro_rules! trainer_negative {
    () => {
        "blurry, out of focus, overexposed, underexposed, low contrast, washed out colors, excessive noise, \
         grainy texture, poor lighting, flickering, motion blur, distorted proportions, unnatural skin tones, \
         deformed facial features, asymmetrical face, missing facial features, extra limbs, disfigured hands, \
         wrong hand count, artifacts around text, inconsistent perspective, camera shake, incorrect depth of \
         field, background too sharp, background clutter, distracting reflections, harsh shadows, inconsistent \
         lighting direction, color banding, cartoonish rendering, 3D CGI look, unrealistic materials, uncanny \
         valley effect, incorrect ethnicity, wrong gender, exaggerated expressions, wrong gaze direction, \
         mismatched lip sync, silent or muted audio, distorted voice, robotic voice, echo, background noise, \
         off-sync audio, incorrect dialogue, added dialogue, repetitive speech, jittery movement, awkward \
         pauses, incorrect timing, unnatural transitions, inconsistent framing, tilted camera, flat lighting, \
         inconsistent tone, cinematic oversaturation, stylized filters, or AI artifacts."
    };
}

/// The negative prompt of samples during training that give none: the official trainer's.
pub const TRAINER_NEGATIVE: &str = trainer_negative!();
/// The negative prompt of `framesmith generate` without `--negative`: ltx-pipelines' `DEFAULT_NEGATIVE_PROMPT`
/// (the trainer's with five tags before it).
pub const PIPELINE_NEGATIVE: &str = concat!(
    "has_subtitles, has_blurbox, transition from black, transition to black, speech_ending_short, ",
    trainer_negative!()
);

/// The official guidance: CFG 3.0 (`video_cfg_scale`) and the guidance rescale 0.7 (`rescale_scale`).
pub const DEFAULT_GUIDANCE: f64 = 3.0;
pub const GUIDANCE_RESCALE: f64 = 0.7;
/// The pipelines' default clip: 121 frames of 768×512 at 24 fps.
pub const DEFAULT_WIDTH: usize = 768;
pub const DEFAULT_HEIGHT: usize = 512;
pub const DEFAULT_FRAMES: usize = 121;
pub const FPS: f64 = FRAME_RATE as f64;
/// The distilled pipeline's sigmas (`DISTILLED_SIGMA_VALUES`): eight steps.
pub const DISTILLED_SIGMAS: [f32; 9] = [
    1.0, 0.993_75, 0.987_5, 0.981_25, 0.975, 0.909_375, 0.725, 0.421_875, 0.0,
];
/// `LTX2Scheduler`'s shift line: `base` at 1024 tokens, `max` at 4096; the pipelines pass no latent, so 4096.
const BASE_SHIFT_ANCHOR: f64 = 1024.0;
const MAX_SHIFT_ANCHOR: f64 = 4096.0;
const BASE_SHIFT: f64 = 0.95;
const MAX_SHIFT: f64 = 2.05;
/// The last non-zero sigma after the stretch.
const TERMINAL: f64 = 0.1;

/// The official steps of a release's full model (`LTX_2_PARAMS`, `LTX_2_3_PARAMS`): 40 and 30.
pub fn default_steps(version: Ltx2Version) -> usize {
    match version {
        Ltx2Version::Ltx2 => 40,
        Ltx2Version::Ltx23 => 30,
    }
}

/// How the sigmas are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// `LTX2Scheduler` over the given steps (a full model).
    Scheduler,
    /// The distilled pipeline's fixed eight steps without guidance (a distilled checkpoint).
    Distilled,
}

impl Schedule {
    /// The schedule of the checkpoint at `path`: ltx-core keeps no flag for it in the file (its pipelines take a
    /// distilled checkpoint by its own argument), so the released files' names say it
    /// (`ltx-2-19b-distilled*.safetensors`, `ltx-2.3-22b-distilled*`).
    pub fn of_checkpoint(path: &Path) -> Self {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if name.contains("distilled") {
            Self::Distilled
        } else {
            Self::Scheduler
        }
    }
}

/// `LTX2Scheduler().execute(steps, latent)` in float32 as torch computes it: `tokens` the latent's token count,
/// `None` for the pipelines' call without one (4096).
pub fn scheduler_sigmas(steps: usize, tokens: Option<usize>) -> Vec<f32> {
    let tokens = tokens.map_or(MAX_SHIFT_ANCHOR, |t| t as f64);
    let slope = (MAX_SHIFT - BASE_SHIFT) / (MAX_SHIFT_ANCHOR - BASE_SHIFT_ANCHOR);
    let shift = tokens * slope + (BASE_SHIFT - slope * BASE_SHIFT_ANCHOR);
    let e = shift.exp() as f32;
    let mut sigmas: Vec<f32> = torch_linspace_f32(1.0, 0.0, steps + 1)
        .into_iter()
        .map(|s| {
            if s == 0.0 {
                return 0.0;
            }
            // `e / (e + (1/s − 1))`: torch's reciprocal-then-multiply for a scalar over a tensor.
            let t = (1.0 / s) - 1.0;
            (1.0 / (e + t)) * e
        })
        .collect();
    let last = sigmas.iter().rev().find(|&&s| s != 0.0).copied();
    if let Some(last) = last {
        let scale = (1.0 - last) / (1.0 - TERMINAL) as f32;
        for s in sigmas.iter_mut().filter(|s| **s != 0.0) {
            *s = 1.0 - ((1.0 - *s) / scale);
        }
    }
    sigmas
}

/// What to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Ltx2Settings {
    /// Clip size in pixels (multiples of the VAE's spatial factor, 32) and frames (8k + 1).
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    /// Denoising steps of the scheduler (a distilled schedule has its own eight).
    pub steps: usize,
    /// Classifier-free guidance scale; at 1 or below the negative prompt is not run.
    pub guidance: f64,
    pub seed: u64,
    pub schedule: Schedule,
    /// Whether the audio stream is sampled too (a clip with sound).
    pub sound: bool,
}

impl Ltx2Settings {
    /// The latent [frames, h, w] of the clip for a VAE of `(space, time)` compression, or what is wrong with the
    /// settings, named as `names` (width, height, frames, steps).
    pub fn latent_shape(
        &self,
        (space, time): (usize, usize),
        names: [&str; 4],
    ) -> anyhow::Result<[usize; 3]> {
        for (name, px) in [(names[0], self.width), (names[1], self.height)] {
            if px == 0 || px % space != 0 {
                let down = (px / space).max(1) * space;
                anyhow::bail!(
                    "{name} {px}: LTX-2 clips are sized in multiples of {space} pixels (e.g. {down} or {})",
                    down + space
                );
            }
        }
        if self.frames == 0 || (self.frames - 1) % time != 0 {
            let down = self.frames.saturating_sub(1) / time * time + 1;
            anyhow::bail!(
                "{} {}: LTX-2 makes {time}k + 1 frames (e.g. {down} or {})",
                names[2],
                self.frames,
                down + time
            );
        }
        if self.steps == 0 && self.schedule == Schedule::Scheduler {
            anyhow::bail!("{} 0: at least one denoising step is needed", names[3]);
        }
        Ok([
            (self.frames - 1) / time + 1,
            self.height / space,
            self.width / space,
        ])
    }

    /// The sigmas the clip is denoised along.
    pub fn sigmas(&self) -> Vec<f32> {
        match self.schedule {
            Schedule::Scheduler => scheduler_sigmas(self.steps, None),
            Schedule::Distilled => DISTILLED_SIGMAS.to_vec(),
        }
    }

    /// Whether the negative prompt runs (a distilled schedule never guides; with sound the audio's guidance of
    /// 7.0 runs it whatever the video's scale).
    pub fn guided(&self) -> bool {
        self.schedule == Schedule::Scheduler && (self.guidance > 1.0 || self.sound)
    }
}

/// The unbiased standard deviation of every element of `xs` (torch's `Tensor.std()`).
fn std_all(xs: &Tensor) -> candle_core::Result<f64> {
    let n = xs.elem_count();
    let mean = xs.mean_all()?;
    let var = xs
        .broadcast_sub(&mean)?
        .sqr()?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?
        / n.saturating_sub(1).max(1) as f64;
    Ok(var.sqrt())
}

/// `MultiModalGuider.calculate` with CFG alone: `cond + (scale − 1)·(cond − uncond)` on the denoised latents,
/// then rescaled towards `cond`'s standard deviation by `rescale` (0: not rescaled).
pub fn guide(
    cond: &Tensor,
    uncond: &Tensor,
    (scale, rescale): (f64, f64),
) -> candle_core::Result<Tensor> {
    let pred = (cond + ((cond - uncond)? * (scale - 1.0))?)?;
    if rescale == 0.0 {
        return Ok(pred);
    }
    let factor = std_all(cond)? / std_all(&pred)?;
    pred * (rescale * factor + (1.0 - rescale))
}

/// One Euler step of `x` (f32) to `next` from its denoised latents at `sigma` (`EulerDiffusionStep.step`).
pub fn euler_step(
    x: &Tensor,
    denoised: &Tensor,
    (sigma, next): (f32, f32),
) -> candle_core::Result<Tensor> {
    let velocity = ((x - denoised)? / f64::from(sigma))?;
    x + (velocity * f64::from(next - sigma))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_scheduler_shifts_by_tokens_and_stretches_to_the_terminal() {
        // LTX2Scheduler().execute(steps=4) and execute(steps=4, latent of 1024 tokens) (torch 2.15, float32).
        let default = scheduler_sigmas(4, None);
        let want = [0.999_999_8f32, 0.867_083_1, 0.631_568_85, 0.100_000_02, 0.0];
        for (g, w) in default.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{default:?}");
        }
        let few = scheduler_sigmas(4, Some(1024));
        let want = [1.0f32, 0.808_645_8, 0.532_669_07, 0.100_000_02, 0.0];
        for (g, w) in few.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "fewer tokens shift less: {few:?}");
        }
        assert_eq!(DISTILLED_SIGMAS.len(), 9);
        assert_eq!(
            Schedule::of_checkpoint(Path::new("/m/ltx-2.3-22b-distilled.safetensors")),
            Schedule::Distilled
        );
        assert_eq!(
            Schedule::of_checkpoint(Path::new("ltx-2.3-22b-dev.safetensors")),
            Schedule::Scheduler
        );
    }

    #[test]
    fn settings_name_what_is_wrong() {
        let s = Ltx2Settings {
            width: 768,
            height: 512,
            frames: 121,
            steps: 2,
            guidance: 3.0,
            seed: 0,
            schedule: Schedule::Scheduler,
            sound: false,
        };
        let names = ["--width", "--height", "--frames", "--steps"];
        assert_eq!(s.latent_shape((32, 8), names).ok(), Some([16, 16, 24]));
        let err = |s: Ltx2Settings| {
            s.latent_shape((32, 8), names)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = err(Ltx2Settings {
            frames: 120,
            ..s.clone()
        });
        assert!(e.contains("8k + 1") && e.contains("113 or 121"), "{e}");
        let e = err(Ltx2Settings {
            width: 770,
            ..s.clone()
        });
        assert!(e.contains("--width 770") && e.contains("768 or 800"), "{e}");
        assert!(err(Ltx2Settings {
            steps: 0,
            ..s.clone()
        })
        .contains("--steps 0"));
        let distilled = Ltx2Settings {
            schedule: Schedule::Distilled,
            ..s
        };
        assert!(!distilled.guided());
        assert_eq!(distilled.sigmas().len(), 9);
        // Sound guides the audio at 7.0 even when the video is not guided.
        let unguided = Ltx2Settings {
            guidance: 1.0,
            schedule: Schedule::Scheduler,
            ..distilled
        };
        assert!(!unguided.guided());
        assert!(Ltx2Settings {
            sound: true,
            ..unguided
        }
        .guided());
    }

    #[test]
    fn guidance_is_cfg_then_the_rescale() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let cond = Tensor::new(&[1.0f32, 2.0, 3.0, 4.0], &dev)?;
        let uncond = Tensor::new(&[1.0f32, 1.0, 1.0, 1.0], &dev)?;
        let plain = guide(&cond, &uncond, (3.0, 0.0))?.to_vec1::<f32>()?;
        assert_eq!(plain, [1.0, 4.0, 7.0, 10.0]);
        // std(cond) = 1.2910, std(pred) = 3.8730: factor 0.7 · 1/3 + 0.3.
        let rescaled = guide(&cond, &uncond, (3.0, 0.7))?.to_vec1::<f32>()?;
        let k = 0.7 / 3.0 + 0.3;
        for (r, p) in rescaled.iter().zip(plain) {
            assert!((r - p * k as f32).abs() < 1e-5, "{rescaled:?}");
        }
        Ok(())
    }
}
