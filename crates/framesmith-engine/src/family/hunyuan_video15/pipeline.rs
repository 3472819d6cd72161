//! HunyuanVideo 1.5 text-to-video with loaded models, as the official pipeline samples
//! (github:Tencent-Hunyuan/HunyuanVideo-1.5 @60783e7, `HunyuanVideo_1_5_Pipeline.__call__` with its
//! `FlowMatchDiscreteScheduler`): seeded start noise [1, 32, (F − 1)/4 + 1, H/16, W/16], sigmas
//! `linspace(1, 0, n + 1)` under the time shift `s·σ / (1 + (s − 1)·σ)` (5 at 480p; 9 at 720p, 7 for I2V;
//! `PIPELINE_CONFIGS`), the transformer given `σ·1000` and the T2V input (zero condition latents and mask) or the
//! I2V one (the start image's scaled VAE latents at frame 0 with mask 1 there, and its SigLIP features as image
//! tokens, in both guidance passes), classifier-free guidance `uncond + g·(cond − uncond)` at 6.0 with the
//! negative prompt ("" by default) run as its own pass, and Euler steps `x += (σ_next − σ)·v`. An I2V clip without
//! a size takes the official 480p bucket of its image's aspect ratio ([`i2v_size`]). The decoder
//! ([`super::decode`]) turns the latents into frames. `framesmith generate` and samples during training both sample
//! through here.

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::generate::request::Cancelled;
use crate::generate::sampler::torch_linspace_f32;
use framesmith_models::hunyuan_video15::conditioning::model_input;
use framesmith_models::hunyuan_video15::transformer::TextStates;
use framesmith_models::hunyuan_video15::{HunyuanVideo15Inputs, HunyuanVideo15Transformer};
use framesmith_nn::init::randn;

/// The official defaults: 50 steps, guidance 6.0, 121 frames of 848×480 at 24 fps.
pub const DEFAULT_STEPS: usize = 50;
pub const DEFAULT_GUIDANCE: f64 = 6.0;
pub const DEFAULT_FRAMES: usize = 121;
pub const DEFAULT_WIDTH: usize = 848;
pub const DEFAULT_HEIGHT: usize = 480;
pub const FPS: f64 = 24.0;
/// The flow shift of the 480p configs, and of the 720p T2V and I2V ones.
const SHIFT_480P: f64 = 5.0;
const SHIFT_720P: f64 = 9.0;
const SHIFT_720P_I2V: f64 = 7.0;
/// `bucket_hw_base_size` of the pipeline's 480p I2V sizes: buckets of about 640² pixels.
const I2V_BUCKET_BASE: usize = 640;
/// Largest aspect ratio of an I2V bucket.
const I2V_MAX_RATIO: f64 = 4.0;
/// Pixels per latent pixel, and frames per latent frame after the first.
const SPATIAL: usize = 16;
const TEMPORAL: usize = 4;

/// What to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Hv15Settings {
    /// Clip size in pixels (multiples of 16) and frames (4n + 1).
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    pub steps: usize,
    /// Classifier-free guidance scale; at 1 or below the negative prompt is not run.
    pub guidance: f64,
    pub shift: f64,
    pub seed: u64,
}

/// The official flow shift for a clip of `width`×`height` (`i2v`: from a start image): the 720p configs' from
/// 720p up, else the 480p ones'.
pub fn default_shift(width: usize, height: usize, i2v: bool) -> f64 {
    match (width.min(height) >= 720, i2v) {
        (false, _) => SHIFT_480P,
        (true, false) => SHIFT_720P,
        (true, true) => SHIFT_720P_I2V,
    }
}

/// The official 480p I2V size (width, height) for a start image of `width`×`height`: of the pipeline's buckets
/// (`generate_crop_size_list(640, 16)`: sides in 16s, at most 40² patches, aspect ratio up to 4), the first whose
/// height/width ratio (rounded to 5 places) is closest to the image's (`get_closest_ratio`).
pub fn i2v_size(width: u32, height: u32) -> (usize, usize) {
    let patches = (I2V_BUCKET_BASE / SPATIAL).pow(2);
    let mut buckets = Vec::new();
    let (mut wp, mut hp) = (patches, 1usize);
    while wp > 0 {
        if wp.max(hp) as f64 / wp.min(hp) as f64 <= I2V_MAX_RATIO {
            // The official list holds (wp, hp) · 16 and reads each as (height, width).
            buckets.push((wp * SPATIAL, hp * SPATIAL));
        }
        if (hp + 1) * wp <= patches {
            hp += 1;
        } else {
            wp -= 1;
        }
    }
    let ratio = f64::from(height) / f64::from(width.max(1));
    let round5 = |x: f64| (x * 1e5).round() / 1e5;
    let mut best = (f64::INFINITY, (DEFAULT_WIDTH, DEFAULT_HEIGHT));
    for (h, w) in buckets {
        let gap = (round5(h as f64 / w as f64) - ratio).abs();
        if gap < best.0 {
            best = (gap, (w, h));
        }
    }
    best.1
}

impl Hv15Settings {
    /// The latent [frames, h, w] of the clip, or what is wrong with the settings, named as `names` (width,
    /// height, frames, steps).
    pub fn latent_shape(&self, names: [&str; 4]) -> anyhow::Result<[usize; 3]> {
        for (name, px) in [(names[0], self.width), (names[1], self.height)] {
            if px == 0 || px % SPATIAL != 0 {
                anyhow::bail!(
                    "{name} {px}: HunyuanVideo 1.5 clips are sized in multiples of {SPATIAL} pixels (e.g. {})",
                    (px / SPATIAL).max(1) * SPATIAL
                );
            }
        }
        if self.frames == 0 || (self.frames - 1) % TEMPORAL != 0 {
            anyhow::bail!(
                "{} {}: HunyuanVideo 1.5 makes 4n + 1 frames (e.g. {})",
                names[2],
                self.frames,
                (self.frames / TEMPORAL) * TEMPORAL + 1
            );
        }
        if self.steps == 0 {
            anyhow::bail!("{} 0: at least one denoising step is needed", names[3]);
        }
        Ok([
            (self.frames - 1) / TEMPORAL + 1,
            self.height / SPATIAL,
            self.width / SPATIAL,
        ])
    }
}

/// A prompt's encoding: the Qwen2.5-VL states of its valid tokens [L, 3584] and its glyph states [L2, 1472]
/// (`None`: nothing quoted).
#[derive(Debug, Clone)]
pub struct Hv15Text {
    pub txt: Tensor,
    pub glyph: Option<Tensor>,
}

/// A prompt, and the negative prompt's encoding when guidance runs it.
#[derive(Debug, Clone)]
pub struct Hv15Prompt {
    pub text: Hv15Text,
    pub negative: Option<Hv15Text>,
}

/// An image-to-video start image as the DiT takes it: its VAE latents × the scaling factor [1, c, 1, h, w] and its
/// SigLIP `last_hidden_state` [1, tokens, 1152].
#[derive(Debug, Clone)]
pub struct Hv15Image {
    pub latents: Tensor,
    pub siglip: Tensor,
}

/// The scheduler's sigmas (n + 1 of them, the last 0), in float32 as the official scheduler computes them.
pub fn sigmas(steps: usize, shift: f64) -> Vec<f32> {
    let shift = shift as f32;
    torch_linspace_f32(1.0, 0.0, steps + 1)
        .into_iter()
        .map(|s| shift * s / (1.0 + (shift - 1.0) * s))
        .collect()
}

/// The seeded start noise [1, `channels`, f, h, w] (f32), drawn on the host so a seed gives the same clip on any
/// device.
pub fn start_noise(
    seed: u64,
    channels: usize,
    [f, h, w]: [usize; 3],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let rng = &mut StdRng::seed_from_u64(seed);
    randn(rng, (1, channels, f, h, w), 0.0, 1.0, device)
}

/// The transformer's velocity for the model input `x` at sigma `sigma` under `text` (and the image tokens of
/// `image`).
fn velocity(
    model: &HunyuanVideo15Transformer,
    (x, image): (&Tensor, Option<&Hv15Image>),
    text: &Hv15Text,
    (sigma, dtype): (f32, DType),
) -> candle_core::Result<Tensor> {
    let device = x.device();
    let states = |t: &Tensor| -> candle_core::Result<TextStates> {
        TextStates::all_valid(t.to_device(device)?.to_dtype(dtype)?.unsqueeze(0)?)
    };
    let inputs = HunyuanVideo15Inputs {
        latents: x.to_dtype(dtype)?,
        timesteps: Tensor::new(&[sigma * 1000.0], device)?,
        txt: states(&text.txt)?,
        byt5: text.glyph.as_ref().map(states).transpose()?,
        image_embeds: image
            .map(|i| i.siglip.to_device(device)?.to_dtype(dtype))
            .transpose()?,
    };
    model.forward(&inputs)?.to_dtype(DType::F32)
}

/// Denoises the clip `settings` asks for under `prompt` (from the start image `image`, for I2V) into the DiT's
/// latents [c, f, h, w] (f32), polling `cancelled` between steps.
pub fn denoise_clip(
    model: &HunyuanVideo15Transformer,
    (prompt, image): (&Hv15Prompt, Option<&Hv15Image>),
    settings: &Hv15Settings,
    (latent, dtype, device): ([usize; 3], DType, &Device),
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<Tensor> {
    let channels = model.config().out_channels;
    let mut latents = start_noise(settings.seed, channels, latent, device)?;
    let guided = prompt.negative.as_ref().filter(|_| settings.guidance > 1.0);
    let first_frame = image
        .map(|i| i.latents.to_device(device)?.to_dtype(DType::F32))
        .transpose()?;
    for pair in sigmas(settings.steps, settings.shift).windows(2) {
        if cancelled() {
            return Err(Cancelled.into());
        }
        let (sigma, next) = (pair[0], pair[1]);
        let v = framesmith_nn::lora::untracked(|| -> candle_core::Result<Tensor> {
            let x = model_input(&latents, first_frame.as_ref())?;
            let cond = velocity(model, (&x, image), &prompt.text, (sigma, dtype))?;
            match guided {
                Some(negative) => {
                    let uncond = velocity(model, (&x, image), negative, (sigma, dtype))?;
                    uncond.clone() + ((cond - uncond)? * settings.guidance)?
                }
                None => Ok(cond),
            }
        })?;
        latents = (latents + (v * f64::from(next - sigma))?)?;
    }
    Ok(latents.squeeze(0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_the_official_shifted_linspace() {
        // FlowMatchDiscreteScheduler(shift=5.0).set_timesteps(4).sigmas of the official scheduler (torch 2.15).
        let want = [1.0f32, 0.937_5, 0.833_333_3, 0.625, 0.0];
        let got = sigmas(4, 5.0);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
        assert_eq!(sigmas(3, 1.0).len(), 4);
        assert_eq!(
            (
                default_shift(848, 480, false),
                default_shift(1280, 720, false)
            ),
            (5.0, 9.0)
        );
        assert_eq!(
            (
                default_shift(848, 480, true),
                default_shift(1280, 720, true)
            ),
            (5.0, 7.0)
        );
    }

    #[test]
    fn an_i2v_clip_takes_the_official_480p_bucket_of_its_image() {
        // `get_closest_ratio` over `generate_crop_size_list(640, 16)` of the official code, for (width, height).
        for (image, want) in [
            ((1920, 1080), (848, 480)),
            ((1080, 1920), (480, 848)),
            ((512, 512), (640, 640)),
            ((100, 37), (1040, 384)),
            ((1000, 1), (1280, 320)),
            ((640, 480), (720, 544)),
        ] {
            assert_eq!(i2v_size(image.0, image.1), want, "{image:?}");
        }
    }

    #[test]
    fn settings_name_what_is_wrong() {
        let s = Hv15Settings {
            width: 848,
            height: 480,
            frames: 121,
            steps: 2,
            guidance: 6.0,
            shift: 5.0,
            seed: 0,
        };
        let names = ["--width", "--height", "--frames", "--steps"];
        assert_eq!(s.latent_shape(names).ok(), Some([31, 30, 53]));
        let err = |s: Hv15Settings| {
            s.latent_shape(names)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(Hv15Settings {
            frames: 120,
            ..s.clone()
        })
        .contains("4n + 1"));
        assert!(err(Hv15Settings {
            width: 850,
            ..s.clone()
        })
        .contains("--width 850"));
        assert!(err(Hv15Settings { steps: 0, ..s }).contains("--steps 0"));
    }
}
