//! Samples during HunyuanVideo 1.5 training: the prompt file's prompts (and negative prompts, `--n`, "" when not
//! given, as the official pipeline's default) are encoded by Qwen2.5-VL and the byT5 glyph encoder
//! ([`super::encoder`]) before the DiT loads, the encoders dropped right after, and the encodings cached in the
//! output folder so a later start loads no encoder; each sample is then the clip `framesmith generate` makes
//! ([`super::pipeline`]: seeded noise, the shifted schedule (`--fs`, else the official one for its size), Euler
//! with CFG at `--l`, 6.0 when not given) with the LoRA being trained, decoded by the VAE (`model.vae`, in the
//! official tiles) and written as `samples/{stem}.mp4` with its frames in `samples/{stem}/`. `--i` (image-to-video)
//! and `--ci` are refused.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::decode::Hv15Decoder;
use super::encoder::{encode_texts, Hv15EncoderFiles, LoadQwen};
use super::pipeline::{
    default_shift, denoise_clip, Hv15Prompt, Hv15Settings, Hv15Text, DEFAULT_GUIDANCE, FPS,
};
use crate::family::image::prompt_cache::{cached_encodings, CachedEncoding};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use crate::generate::run::write_clip;
use crate::train::samples::{SampleFiles, SampleSet};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;

/// The negative prompt of a sample that gives none (the official pipeline's).
pub const DEFAULT_NEGATIVE: &str = "";

/// One sample: its prompt, encoding, settings and latent shape.
pub struct Hv15SamplePrompt {
    pub prompt: String,
    pub encoded: Hv15Prompt,
    pub settings: Hv15Settings,
    pub latent: [usize; 3],
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
            (&p.encoded, None),
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

/// What each prompt samples, checked; the options HunyuanVideo 1.5 text-to-video does not take are refused.
fn clip_settings(
    specs: &[PromptSpec],
    prompts_file: &Path,
) -> anyhow::Result<Vec<(Hv15Settings, [usize; 3])>> {
    specs
        .iter()
        .map(|spec| {
            let at = || format!("sample prompt \"{}\" in {}", spec.prompt, prompts_file.display());
            if spec.image.is_some() || !spec.controls.is_empty() {
                anyhow::bail!(
                    "{}: --i and --ci are for image-to-video and edit models; HunyuanVideo 1.5 samples are \
                     text-to-video clips from --w, --h, --f, --s, --l, --fs, --n and --d: remove them",
                    at()
                );
            }
            let settings = Hv15Settings {
                width: spec.width,
                height: spec.height,
                frames: spec.clip_frames(),
                steps: spec.steps,
                guidance: spec.guidance.unwrap_or(DEFAULT_GUIDANCE),
                shift: spec
                    .flow_shift
                    .unwrap_or_else(|| default_shift(spec.width, spec.height, false)),
                seed: spec.seed,
            };
            let latent = settings
                .latent_shape(["--w", "--h", "--f", "--s"])
                .with_context(at)?;
            Ok((settings, latent))
        })
        .collect()
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

/// The samples of a HunyuanVideo 1.5 run (`None` when nothing is sampled): the prompt file read and checked, the
/// prompts encoded (through the prompt cache, Qwen2.5-VL from `load`) and the VAE loaded, in `dtype` on `device`
/// for a card of `vram_bytes`. Called before the DiT loads.
pub fn clip_samples(
    plan: &RunPlan,
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
    let settings = clip_settings(&specs, &sampling.prompts)?;
    let mut texts: Vec<&str> = Vec::new();
    for spec in &specs {
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
    let prompts = specs
        .iter()
        .zip(settings)
        .map(|(spec, (settings, latent))| {
            let negative = spec.negative.as_deref().unwrap_or(DEFAULT_NEGATIVE);
            Ok(Hv15SamplePrompt {
                prompt: spec.prompt.clone(),
                encoded: Hv15Prompt {
                    text: text_of(&spec.prompt)?,
                    negative: Some(text_of(negative)?),
                },
                settings,
                latent,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let decoder = Hv15Decoder::load(vae_path, (dtype, device), vram_bytes).with_context(|| {
        format!(
            "model.vae: loading the VAE for samples from {}",
            vae_path.display()
        )
    })?;
    Ok(Some(Hv15Samples {
        prompts,
        decoder,
        dtype,
    }))
}
