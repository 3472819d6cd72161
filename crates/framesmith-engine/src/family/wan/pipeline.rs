//! Whole clips from a prompt with loaded models, as the official `WanT2V.generate` makes them: the prompt and
//! negative prompt embedded once, latents of `(z, (frames − 1) / 4 + 1, h / 8, w / 8)` denoised by the DiT (and
//! its LoRAs, several combined exactly into one adapter per layer), decoded by the VAE, clamped to [−1, 1] and
//! turned into RGB frames (written by [`crate::generate::run::write_clip`]).

use anyhow::Context;
use candle_core::{DType, Tensor};

use crate::family::wan::denoise::{generate_from, Experts, GenerateRequest, ImageConditioning};
use crate::generate::sampler::Solver;
use framesmith_data::video::encode::RgbFrame;
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{LatentStats, TileConfig, VaeConfig, WanVae};
use framesmith_models::wan::WanConfig;

/// The official default negative prompt (`sample_neg_prompt` of Wan's shared config), used when none is given.
pub const DEFAULT_NEGATIVE_PROMPT: &str = "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，\
最差质量，低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，\
手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走";

/// Frames per second of generated clips (Wan's `sample_fps`).
pub const CLIP_FPS: f64 = 16.0;

/// The text side of a clip: prompt and (for guidance) negative prompt embeddings.
pub struct Conditioning {
    pub context: Tensor,
    pub negative: Option<Tensor>,
}

impl Conditioning {
    /// Embeds `prompt`, and `negative` (the official default when `None`) when `guidance` > 1 needs it.
    pub fn encode(
        text: &TextEncoder,
        prompt: &str,
        negative: Option<&str>,
        guidance: f64,
    ) -> anyhow::Result<Self> {
        let guided = guidance > 1.0;
        let negative = negative.unwrap_or(DEFAULT_NEGATIVE_PROMPT);
        let prompts: Vec<&str> = if guided {
            vec![prompt, negative]
        } else {
            vec![prompt]
        };
        // One prompt at a time, so an embedding never depends on the other prompt's length.
        let mut out = Vec::with_capacity(prompts.len());
        for p in prompts {
            out.extend(text.encode_prompts(&[p])?);
        }
        let mut out = out.into_iter();
        let context = out
            .next()
            .context("the text encoder returned no embedding")?;
        Ok(Self {
            context,
            negative: out.next(),
        })
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipSettings {
    pub width: usize,
    pub height: usize,
    /// 4k + 1 frames.
    pub frames: usize,
    pub steps: usize,
    pub shift: f64,
    pub guidance: f64,
    pub seed: u64,
    pub solver: Solver,
}

/// The latent shape `[z, (frames − 1) / 4 + 1, h / s, w / s]` of a clip, or an error saying which settings
/// work: every clip (`generate`, training samples from a prompt file) passes here before sampling.
pub fn latent_shape(
    dit: &WanConfig,
    vae: &VaeConfig,
    s: &ClipSettings,
) -> anyhow::Result<[usize; 4]> {
    if s.steps == 0 {
        anyhow::bail!("0 steps sample nothing: use at least 1 (50 is the official count)");
    }
    if !(s.shift.is_finite() && s.shift > 0.0) {
        anyhow::bail!(
            "flow shift {} does not work: use a number above 0 (5 is the official value; 3 is common for 480p)",
            s.shift
        );
    }
    if !(s.guidance.is_finite() && s.guidance >= 0.0) {
        anyhow::bail!(
            "guidance scale {} does not work: use 0 or more (1 turns guidance off, 5 is the official value)",
            s.guidance
        );
    }
    let step = vae.spatial_factor() * dit.patch_size[1].max(dit.patch_size[2]);
    if s.width == 0 || s.height == 0 || s.width % step != 0 || s.height % step != 0 {
        anyhow::bail!(
            "{}x{} does not fit this model: width and height must be multiples of {step} (e.g. {}x{})",
            s.width,
            s.height,
            (s.width / step).max(1) * step,
            (s.height / step).max(1) * step
        );
    }
    let t = vae.temporal_factor();
    if s.frames == 0 || (s.frames - 1) % t != 0 {
        anyhow::bail!(
            "{} frames does not fit: the VAE needs {t}k + 1 frames (e.g. {})",
            s.frames,
            (s.frames.saturating_sub(1) / t) * t + 1
        );
    }
    if vae.z_dim != dit.out_dim {
        anyhow::bail!(
            "the VAE has {} latent channels but the DiT denoises {}: use the VAE made for this model (Wan2.1 VAE for \
             Wan2.1 and Wan2.2 A14B, Wan2.2 VAE for TI2V-5B)",
            vae.z_dim,
            dit.out_dim
        );
    }
    Ok([
        vae.z_dim,
        vae.latent_frames(s.frames),
        s.height / vae.spatial_factor(),
        s.width / vae.spatial_factor(),
    ])
}

/// The VAE that turns latents into frames.
pub struct VaeDecoder {
    pub vae: WanVae,
    pub stats: LatentStats,
    /// Spatial tiles, for large frames.
    pub tiles: Option<TileConfig>,
    /// Dtype of the VAE's weights (latents are converted to it).
    pub dtype: DType,
}

impl VaeDecoder {
    /// RGB frames of normalised latents `[C, F, H, W]`: decoded, clamped to [−1, 1], scaled to 0..255.
    pub fn decode(&self, latents: &Tensor) -> anyhow::Result<Vec<RgbFrame>> {
        // The low-noise expert of a pair on its own GPU leaves the latents there.
        let z = framesmith_nn::ops::to_device(latents, self.stats.mean.device())?
            .unsqueeze(0)?
            .to_dtype(self.dtype)?;
        let video = match &self.tiles {
            Some(tiles) => self.vae.decode_tiled(&z, &self.stats, tiles)?,
            None => self.vae.decode(&z, &self.stats)?,
        };
        video_to_frames(&video.squeeze(0)?)
    }
}

pub use crate::generate::frames::video_to_frames;

/// A text embedding `[L, dim]` cut to the DiT's `text_len` tokens, as the tokenizer would have cut the prompt.
pub fn fit_context(context: &Tensor, text_len: usize) -> candle_core::Result<Tensor> {
    let l = context.dim(0)?.min(text_len);
    context.narrow(0, 0, l)
}

/// Denoises and decodes one clip. Contexts longer than the DiT's `text_len` are cut to it, as the tokenizer
/// would have cut the prompt.
pub fn generate_clip(
    experts: &mut Experts,
    decoder: &VaeDecoder,
    conditioning: &Conditioning,
    settings: &ClipSettings,
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<Vec<RgbFrame>> {
    generate_clip_from(experts, decoder, conditioning, None, settings, cancelled)
}

/// [`generate_clip`] conditioned on a start image (see [`crate::family::wan::start_image::image_conditioning`]).
pub fn generate_clip_from(
    experts: &mut Experts,
    decoder: &VaeDecoder,
    conditioning: &Conditioning,
    image: Option<&ImageConditioning>,
    settings: &ClipSettings,
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<Vec<RgbFrame>> {
    let latents = denoise_clip(experts, decoder, conditioning, image, settings, cancelled)?;
    decoder.decode(&latents)
}

/// The denoising of [`generate_clip_from`] without the decoding: the clip's normalised latents `[C, F, H, W]`
/// for `decoder`'s VAE.
pub fn denoise_clip(
    experts: &mut Experts,
    decoder: &VaeDecoder,
    conditioning: &Conditioning,
    image: Option<&ImageConditioning>,
    settings: &ClipSettings,
    cancelled: &dyn Fn() -> bool,
) -> anyhow::Result<Tensor> {
    let cfg = experts.high_noise.config();
    let latent_shape = latent_shape(cfg, decoder.vae.config(), settings)?;
    let context = fit_context(&conditioning.context, cfg.text_len)?;
    let negative = conditioning
        .negative
        .as_ref()
        .map(|n| fit_context(n, cfg.text_len))
        .transpose()?;
    let request = GenerateRequest {
        context: &context,
        negative: negative.as_ref(),
        latent_shape,
        steps: settings.steps,
        shift: settings.shift,
        guidance: settings.guidance,
        seed: settings.seed,
        solver: settings.solver,
    };
    Ok(generate_from(experts, &request, image, cancelled)?)
}

#[cfg(test)]
mod tests;
