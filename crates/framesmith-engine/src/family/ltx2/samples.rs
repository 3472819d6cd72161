//! Samples during LTX-2 training: the prompt file's prompts (and negative prompts, `--n`, the official trainer's
//! default negative prompt when not given) are encoded by Gemma 3 and the checkpoint's connector
//! ([`super::encoder`]) before the DiT loads, Gemma dropped right after, and the encodings cached in the output
//! folder so a later start loads no encoder; each sample is then the clip `framesmith generate` makes
//! ([`super::pipeline`]: seeded noise, `LTX2Scheduler`'s sigmas over `--s` steps or a distilled checkpoint's
//! eight, Euler with CFG at `--l`, 3.0 when not given, and the guidance rescale) with the LoRA being trained,
//! video only, decoded by the video VAE (`model.vae`, else the checkpoint) and written as `samples/{stem}.mp4`
//! with its frames beside it. `--i` (image-to-video), `--ci` and `--fs` are refused.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::decode::{Ltx2Clip, Ltx2Decoder};
use super::encoder::{encode_texts, LoadGemma, Ltx2EncoderFiles};
use super::pipeline::{
    denoise_clip, Ltx2Prompt, Ltx2Settings, Schedule, DEFAULT_GUIDANCE, FPS, TRAINER_NEGATIVE,
};
use super::text_cache::encoding_tag;
use crate::family::image::prompt_cache::{cached_encodings, CachedEncoding};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use crate::train::samples::{SampleFiles, SampleSet};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_models::ltx2::text::TextParts;
use framesmith_models::ltx2::vae::identify_vae;
use framesmith_models::ltx2::Ltx2Transformer;

/// One sample: its prompt, encoding, settings and latent shape.
pub struct Ltx2SamplePrompt {
    pub prompt: String,
    pub encoded: Ltx2Prompt,
    pub settings: Ltx2Settings,
    pub latent: [usize; 3],
}

/// The samples of an LTX-2 run and the VAE that decodes them.
pub struct Ltx2Samples {
    pub prompts: Vec<Ltx2SamplePrompt>,
    pub decoder: Ltx2Decoder,
    /// The dtype the DiT computes in.
    pub dtype: DType,
    /// The seed of the sample denoised last, which its decode noise is drawn from.
    pub last_seed: Cell<u64>,
}

impl SampleSet<Ltx2Transformer> for Ltx2Samples {
    fn prompt_count(&self) -> usize {
        self.prompts.len()
    }

    fn prompt(&self, i: usize) -> &str {
        &self.prompts[i].prompt
    }

    fn denoise(
        &self,
        i: usize,
        model: &mut Ltx2Transformer,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        let p = &self.prompts[i];
        let device = self.decoder.device.clone();
        self.last_seed.set(p.settings.seed);
        denoise_clip(
            model,
            &p.encoded,
            &p.settings,
            (p.latent, self.dtype, &device),
            cancelled,
        )
    }

    fn write(&self, latents: Tensor, dir: &Path, stem: &str) -> anyhow::Result<SampleFiles> {
        let clip = Ltx2Clip {
            frames: self.decoder.decode(&latents, self.last_seed.get())?,
            fps: FPS,
        };
        drop(latents);
        let video = dir.join(format!("{stem}.mp4"));
        let frames = clip.write(&video)?;
        Ok(SampleFiles {
            file: video,
            frames,
        })
    }
}

/// What each prompt samples, checked against the VAE's `(space, time)` compression; the options LTX-2
/// text-to-video does not take are refused.
fn clip_settings(
    specs: &[PromptSpec],
    (prompts_file, factors, schedule): (&Path, (usize, usize), Schedule),
) -> anyhow::Result<Vec<(Ltx2Settings, [usize; 3])>> {
    specs
        .iter()
        .map(|spec| {
            let at = || format!("sample prompt \"{}\" in {}", spec.prompt, prompts_file.display());
            if spec.image.is_some() || !spec.controls.is_empty() || spec.flow_shift.is_some() {
                anyhow::bail!(
                    "{}: --i, --ci and --fs are not for LTX-2 samples (text-to-video clips from --w, --h, --f, \
                     --s, --l, --n and --d; the scheduler shifts by itself): remove them",
                    at()
                );
            }
            let settings = Ltx2Settings {
                width: spec.width,
                height: spec.height,
                frames: spec.clip_frames(),
                steps: spec.steps,
                guidance: spec.guidance.unwrap_or(DEFAULT_GUIDANCE),
                seed: spec.seed,
                schedule,
            };
            let latent = settings
                .latent_shape(factors, ["--w", "--h", "--f", "--s"])
                .with_context(at)?;
            Ok((settings, latent))
        })
        .collect()
}

/// The prompt cache's key parts of a sample text (the files it is encoded with key the cache itself).
fn key_parts(text: &str) -> Vec<String> {
    vec!["ltx-2 gemma-3 connector".to_owned(), text.to_owned()]
}

/// A cached encoding: the connector's output.
fn from_tensors(mut t: HashMap<String, Tensor>) -> Option<Tensor> {
    t.remove("video_prompt_embeds")
}

/// An encoding's tensors as the cache stores them.
fn to_tensors(text: &Tensor) -> Vec<(&'static str, &Tensor)> {
    vec![("video_prompt_embeds", text)]
}

/// How the encodings go in and out of the prompt cache.
const CACHED: CachedEncoding<Tensor> = CachedEncoding {
    parts: key_parts,
    from_tensors,
    tensors: to_tensors,
};

/// Every distinct text the prompts need: each prompt and its negative prompt (the trainer's default when none
/// is given and guidance runs it).
fn texts_of<'a>(specs: &'a [PromptSpec], settings: &[(Ltx2Settings, [usize; 3])]) -> Vec<&'a str> {
    let mut texts: Vec<&str> = Vec::new();
    for (spec, (s, _)) in specs.iter().zip(settings) {
        let negative = s
            .guided()
            .then(|| spec.negative.as_deref().unwrap_or(TRAINER_NEGATIVE));
        for text in std::iter::once(spec.prompt.as_str()).chain(negative) {
            if !texts.contains(&text) {
                texts.push(text);
            }
        }
    }
    texts
}

/// The files samples are made with: the checkpoint (its connector, and its VAE unless `vae` names one), Gemma 3
/// and its tokenizer.
pub struct SampleFilesIn<'a> {
    pub dit: &'a Path,
    pub vae: &'a Path,
    pub text_encoder: &'a Path,
}

/// The connector outputs of `texts`, in order: from the run's prompt cache where it holds them, the rest encoded
/// by Gemma 3 from `load` with the connector of `files.dit` (Gemma loaded only when something is missing).
fn encode_prompts(
    plan: &RunPlan,
    files: &SampleFilesIn<'_>,
    texts: &[&str],
    (dtype, device): (DType, &Device),
    (load, log): (LoadGemma<'_>, &mut dyn FnMut(LogLevel, String)),
) -> anyhow::Result<Vec<Tensor>> {
    let parts = TextParts::open(files.dit).context("model.dit: the text connector for samples")?;
    let cache = PromptCache::new(
        &prompt_cache_dir(&plan.output.output_dir),
        &[files.text_encoder, files.dit],
    );
    let encoder_files = Ltx2EncoderFiles {
        text_encoder: files.text_encoder,
        tokenizer: None,
        dit: files.dit,
    };
    let mut lines = Vec::new();
    let encode = |missing: &[&str]| {
        let encoded = encode_texts(
            encoder_files,
            load,
            missing,
            (dtype, device),
            &mut |l: &str| lines.push(l.to_owned()),
        )?;
        Ok(encoded.into_iter().map(|t| t.embeds).collect())
    };
    let (encoded, fresh) =
        cached_encodings((&cache, &CACHED), texts, (dtype, device), encode, log)?;
    for line in lines {
        log(LogLevel::Info, line);
    }
    log(
        LogLevel::Info,
        match fresh {
            0 => format!(
                "{} sample prompts from the prompt cache ({}); no text encoder loaded",
                texts.len(),
                encoding_tag(&parts)
            ),
            n => format!("{n} sample prompts encoded, Gemma 3 released"),
        },
    );
    Ok(encoded)
}

/// The samples of an LTX-2 run (`None` when nothing is sampled): the prompt file read and checked, the prompts
/// encoded (through the prompt cache, Gemma 3 from `load`) and the VAE loaded, in `dtype` on `device`. Called
/// before the DiT loads.
pub fn clip_samples(
    plan: &RunPlan,
    files: SampleFilesIn<'_>,
    (dtype, device): (DType, &Device),
    load: LoadGemma<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<Ltx2Samples>> {
    let Some(sampling) = &plan.sampling else {
        return Ok(None);
    };
    let vae_context = || {
        format!(
            "model.vae: LTX-2's video VAE for samples, from {}",
            files.vae.display()
        )
    };
    let factors = identify_vae(files.vae)
        .with_context(vae_context)?
        .config
        .decoder_factors();
    let specs = read_prompt_file(&sampling.prompts)?;
    let schedule = Schedule::of_checkpoint(files.dit);
    let settings = clip_settings(&specs, (&sampling.prompts, factors, schedule))?;
    let texts = texts_of(&specs, &settings);
    let encoded = encode_prompts(plan, &files, &texts, (dtype, device), (load, log))?;
    let text_of = |text: &str| -> anyhow::Result<Tensor> {
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
            let negative = settings
                .guided()
                .then(|| text_of(spec.negative.as_deref().unwrap_or(TRAINER_NEGATIVE)))
                .transpose()?;
            Ok(Ltx2SamplePrompt {
                prompt: spec.prompt.clone(),
                encoded: Ltx2Prompt {
                    text: text_of(&spec.prompt)?,
                    negative,
                },
                settings,
                latent,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // After Gemma is gone: the VAE stays on the device for the whole run.
    let decoder = Ltx2Decoder::load(files.vae, (dtype, device)).with_context(vae_context)?;
    Ok(Some(Ltx2Samples {
        prompts,
        decoder,
        dtype,
        last_seed: Cell::new(0),
    }))
}
