//! Samples during HunyuanVideo 1.5 training: the prompt file's prompts (and negative prompts, `--n`, "" when not
//! given, as the official pipeline's default) are encoded by Qwen2.5-VL and the byT5 glyph encoder
//! ([`super::encoder`]) before the DiT loads, the encoders dropped right after, and the encodings cached in the
//! output folder so a later start loads no encoder; each sample is then the clip `framesmith generate` makes
//! ([`super::pipeline`]: seeded noise, the shifted schedule (`--fs`, else the official one for its size), Euler
//! with CFG at `--l`, 6.0 when not given) with the LoRA being trained, decoded by the VAE (`model.vae`, in the
//! official tiles) and written as `samples/{stem}.mp4` with its frames in `samples/{stem}/`. An image-to-video
//! run's samples start from the image each prompt names with `--i` (relative to the prompt file), resized to the
//! sample's size and encoded by SigLIP (`model.clip`, loaded and dropped) and the VAE's encoder as `framesmith
//! generate --image` encodes it; every start image is read before any model loads. A text-to-video run refuses
//! `--i`, and `--ci` is refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::decode::Hv15Decoder;
use super::encoder::{encode_texts, Hv15EncoderFiles, LoadQwen};
use super::generate::encode_start_images;
use super::pipeline::{
    default_shift, denoise_clip, Hv15Image, Hv15Prompt, Hv15Settings, Hv15Text, DEFAULT_GUIDANCE,
    FPS,
};
use crate::family::image::prompt_cache::{cached_encodings, CachedEncoding};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use crate::generate::run::write_clip;
use crate::train::samples::{SampleFiles, SampleSet};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::probe::load_rgb;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_models::hunyuan_video15::vae::Hv15Vae;
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;
use framesmith_models::siglip::{siglip_weights_file, SIGLIP_FILES};

/// The negative prompt of a sample that gives none (the official pipeline's).
pub const DEFAULT_NEGATIVE: &str = "";

/// One sample: its prompt, encoding, settings and latent shape.
pub struct Hv15SamplePrompt {
    pub prompt: String,
    pub encoded: Hv15Prompt,
    pub settings: Hv15Settings,
    pub latent: [usize; 3],
    /// The start image of an image-to-video sample (its latents and SigLIP features, on the device for the run).
    pub image: Option<Hv15Image>,
}

/// The samples of a HunyuanVideo 1.5 run and the VAE that decodes them.
pub struct Hv15Samples {
    pub prompts: Vec<Hv15SamplePrompt>,
    pub decoder: Hv15Decoder,
    /// The dtype the DiT computes in.
    pub dtype: DType,
}

impl SampleSet<HunyuanVideo15Transformer> for Hv15Samples {
    fn prompt_count(&self) -> usize {
        self.prompts.len()
    }

    fn prompt(&self, i: usize) -> &str {
        &self.prompts[i].prompt
    }

    fn denoise(
        &self,
        i: usize,
        model: &mut HunyuanVideo15Transformer,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        let p = &self.prompts[i];
        let device = self.decoder.device.clone();
        denoise_clip(
            model,
            (&p.encoded, p.image.as_ref()),
            &p.settings,
            (p.latent, self.dtype, &device),
            cancelled,
        )
    }

    fn write(&self, latents: Tensor, dir: &Path, stem: &str) -> anyhow::Result<SampleFiles> {
        let frames = self.decoder.decode(&latents)?;
        drop(latents);
        let video = dir.join(format!("{stem}.mp4"));
        let frames_dir = write_clip(&video, &frames, FPS)?;
        Ok(SampleFiles {
            file: video,
            frames: frames_dir,
        })
    }
}

/// One prompt's sample as checked before anything loads: its settings, latent shape and, for image-to-video, its
/// start image read from the file `--i` names.
struct SampleSpec {
    settings: Hv15Settings,
    latent: [usize; 3],
    image: Option<RgbImage>,
}

/// What each prompt of `prompts_file` samples, checked, with an image-to-video run's (`i2v`) start images read: a
/// missing `--i` or an image that cannot be read is refused by prompt and file, as are `--i` in a text-to-video
/// run and `--ci`.
fn sample_specs(
    specs: &[PromptSpec],
    prompts_file: &Path,
    i2v: bool,
) -> anyhow::Result<Vec<SampleSpec>> {
    specs
        .iter()
        .map(|spec| {
            let at = || format!("sample prompt \"{}\" in {}", spec.prompt, prompts_file.display());
            if !spec.controls.is_empty() {
                anyhow::bail!(
                    "{}: --ci gives an edit model's control image; HunyuanVideo 1.5 samples start from --i in an \
                     image-to-video run: remove --ci",
                    at()
                );
            }
            let image = match (&spec.image, i2v) {
                (Some(path), false) => anyhow::bail!(
                    "{}: --i {} gives a start image, but this run trains text-to-video (its caches hold no \
                     first-frame latents): remove --i, or cache the dataset with `framesmith cache latents --i2v \
                     --clip <SigLIP>` to train image-to-video",
                    at(),
                    path.display()
                ),
                (None, true) => anyhow::bail!(
                    "{}: this run trains image-to-video, so every sample starts from an image: add --i with a start \
                     image (PNG, JPEG, WebP or BMP; relative to the prompt file) to the line",
                    at()
                ),
                (Some(path), true) => Some(load_rgb(path).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: the start image --i cannot be used: {}: {}; point --i at a PNG, JPEG, WebP or BMP \
                         image",
                        at(),
                        e.reason(),
                        path.display()
                    )
                })?),
                (None, false) => None,
            };
            let settings = Hv15Settings {
                width: spec.width,
                height: spec.height,
                frames: spec.clip_frames(),
                steps: spec.steps,
                guidance: spec.guidance.unwrap_or(DEFAULT_GUIDANCE),
                shift: spec
                    .flow_shift
                    .unwrap_or_else(|| default_shift(spec.width, spec.height, i2v)),
                seed: spec.seed,
            };
            let latent = settings
                .latent_shape(["--w", "--h", "--f", "--s"])
                .with_context(at)?;
            Ok(SampleSpec {
                settings,
                latent,
                image,
            })
        })
        .collect()
}

/// The SigLIP weights of an image-to-video run's samples (`model.clip`), found before anything loads.
fn sample_siglip(plan: &RunPlan) -> anyhow::Result<PathBuf> {
    let clip = plan.model.clip.as_deref().context(
        "model.clip is not set, but this run trains image-to-video and its samples start from images (--i) that \
         the SigLIP image encoder encodes: set model.clip to ComfyUI's sigclip_vision_patch14_384.safetensors (or \
         the image_encoder folder of FLUX.1-Redux-dev), or remove sampling.prompts",
    )?;
    siglip_weights_file(clip).with_context(|| {
        format!(
            "model.clip: the SigLIP image encoder of the samples' start images ({SIGLIP_FILES}): {}",
            clip.display()
        )
    })
}

/// The prompt cache's key parts of a sample text.
fn key_parts(text: &str) -> Vec<String> {
    vec![
        "hunyuan-video-1.5 qwen2.5-vl byt5".to_owned(),
        text.to_owned(),
    ]
}

/// A cached encoding: the Qwen2.5-VL states, and the glyph states when the text quotes something.
fn from_tensors(mut t: HashMap<String, Tensor>) -> Option<Hv15Text> {
    Some(Hv15Text {
        txt: t.remove("vl_embed")?,
        glyph: t.remove("byt5_embed"),
    })
}

/// An encoding's tensors as the cache stores them.
fn to_tensors(text: &Hv15Text) -> Vec<(&'static str, &Tensor)> {
    let mut out = vec![("vl_embed", &text.txt)];
    out.extend(text.glyph.as_ref().map(|g| ("byt5_embed", g)));
    out
}

/// How the encodings go in and out of the prompt cache.
const CACHED: CachedEncoding<Hv15Text> = CachedEncoding {
    parts: key_parts,
    from_tensors,
    tensors: to_tensors,
};

/// Each prompt's encoding and its negative prompt's ("" when it gives none), through the prompt cache of the run's
/// output folder, Qwen2.5-VL from `load` (with the glyph encoder beside `text_encoder`) encoding what it lacks.
fn encode_prompts(
    plan: &RunPlan,
    specs: &[PromptSpec],
    (text_encoder, load): (&Path, LoadQwen<'_>),
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Vec<Hv15Prompt>> {
    let mut texts: Vec<&str> = Vec::new();
    for spec in specs {
        for text in [
            spec.prompt.as_str(),
            spec.negative.as_deref().unwrap_or(DEFAULT_NEGATIVE),
        ] {
            if !texts.contains(&text) {
                texts.push(text);
            }
        }
    }
    let files = Hv15EncoderFiles {
        text_encoder,
        tokenizer: None,
        glyph: None,
    };
    let cache = PromptCache::new(&prompt_cache_dir(&plan.output.output_dir), &[text_encoder]);
    let encode = |missing: &[&str]| encode_texts(files, load, missing, (dtype, device));
    let (encoded, fresh) =
        cached_encodings((&cache, &CACHED), &texts, (dtype, device), encode, log)?;
    log(
        LogLevel::Info,
        match fresh {
            0 => format!(
                "{} sample prompts from the prompt cache; no text encoder loaded",
                texts.len()
            ),
            n => format!("{n} sample prompts encoded, the text encoders released"),
        },
    );
    let text_of = |text: &str| -> anyhow::Result<Hv15Text> {
        let i = texts
            .iter()
            .position(|t| *t == text)
            .context("a sample prompt was not encoded")?;
        Ok(encoded[i].clone())
    };
    specs
        .iter()
        .map(|spec| {
            Ok(Hv15Prompt {
                text: text_of(&spec.prompt)?,
                negative: Some(text_of(
                    spec.negative.as_deref().unwrap_or(DEFAULT_NEGATIVE),
                )?),
            })
        })
        .collect()
}

/// The start image of each of `samples` (all of them, in an image-to-video run whose SigLIP is `siglip`) as the DiT
/// takes it, through SigLIP and `vae`'s encoder; none for a text-to-video run (`siglip` `None`).
fn start_images(
    samples: &[SampleSpec],
    siglip: Option<&Path>,
    vae: &Hv15Vae,
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Vec<Option<Hv15Image>>> {
    let Some(siglip) = siglip else {
        return Ok(samples.iter().map(|_| None).collect());
    };
    let starts: Vec<(&RgbImage, &Hv15Settings)> = samples
        .iter()
        .map(|s| {
            s.image
                .as_ref()
                .map(|image| (image, &s.settings))
                .context("an image-to-video sample lost its start image")
        })
        .collect::<anyhow::Result<_>>()?;
    let encoded = encode_start_images(&starts, (siglip, "model.clip"), vae, (dtype, device))?;
    log(
        LogLevel::Info,
        format!(
            "{} sample start images encoded by SigLIP and the VAE, SigLIP released",
            encoded.len()
        ),
    );
    Ok(encoded.into_iter().map(Some).collect())
}

/// The samples of a HunyuanVideo 1.5 run (`None` when nothing is sampled): the prompt file read and checked (and,
/// for an image-to-video run (`i2v`), every start image read and SigLIP found) before any model loads, the prompts
/// encoded (through the prompt cache, Qwen2.5-VL from `load`), the VAE loaded and, for image-to-video, the start
/// images encoded by SigLIP and the VAE's encoder, in `dtype` on `device` for a card of `vram_bytes`. Called before
/// the DiT loads.
pub fn clip_samples(
    plan: &RunPlan,
    i2v: bool,
    (dtype, device, vram_bytes): (DType, &Device, u64),
    load: LoadQwen<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<Hv15Samples>> {
    let Some(sampling) = &plan.sampling else {
        return Ok(None);
    };
    let m = &plan.model;
    let vae_path = m
        .vae
        .as_deref()
        .context("HunyuanVideo 1.5 samples need model.vae; set it, or remove sampling.prompts")?;
    let text_encoder = m.text_encoder.as_deref().context(
        "HunyuanVideo 1.5 samples need model.text_encoder (Qwen2.5-VL-7B, with the byT5 glyph encoder beside it); \
         set it, or remove sampling.prompts",
    )?;
    let specs = read_prompt_file(&sampling.prompts)?;
    let samples = sample_specs(&specs, &sampling.prompts, i2v)?;
    let siglip = i2v.then(|| sample_siglip(plan)).transpose()?;
    if !i2v && m.clip.is_some() {
        log(
            LogLevel::Warn,
            "model.clip is not used: this run trains text-to-video, whose samples start from no image".into(),
        );
    }
    let encoded = encode_prompts(plan, &specs, (text_encoder, load), (dtype, device), log)?;
    let decoder = Hv15Decoder::load(vae_path, (dtype, device), vram_bytes).with_context(|| {
        format!(
            "model.vae: loading the VAE for samples from {}",
            vae_path.display()
        )
    })?;
    let images = start_images(
        &samples,
        siglip.as_deref(),
        &decoder.vae,
        (dtype, device),
        log,
    )?;
    let prompts = specs
        .into_iter()
        .zip(encoded)
        .zip(samples.into_iter().zip(images))
        .map(|((spec, encoded), (sample, image))| Hv15SamplePrompt {
            prompt: spec.prompt,
            encoded,
            settings: sample.settings,
            latent: sample.latent,
            image,
        })
        .collect();
    Ok(Some(Hv15Samples {
        prompts,
        decoder,
        dtype,
    }))
}
