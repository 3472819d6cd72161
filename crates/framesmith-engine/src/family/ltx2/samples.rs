//! Samples during LTX-2 training: the prompt file's prompts (and negative prompts, `--n`, the official trainer's
//! default negative prompt when not given) are encoded by Gemma 3 and the checkpoint's connector
//! ([`super::encoder`]) before the DiT loads, Gemma dropped right after, and the encodings cached in the output
//! folder so a later start loads no encoder; each sample is then the clip `framesmith generate` makes
//! ([`super::pipeline`]: seeded noise, `LTX2Scheduler`'s sigmas over `--s` steps or a distilled checkpoint's
//! eight, Euler with CFG at `--l`, 3.0 when not given, and the guidance rescale) with the LoRA being trained,
//! decoded by the video VAE (`model.vae`, else the checkpoint) and written as `samples/{stem}.mp4` with its frames
//! beside it. A run that trains the audio stream samples sound with the video (both streams denoised jointly, the
//! prompts encoded by the audio connector too, the audio guided at 7.0), decoded by the checkpoint's audio VAE and
//! vocoder and muxed into the MP4; a text-to-video run computes nothing for audio. A prompt's `--i` image (relative
//! to the prompt file, read before anything loads) is resized and centre-cropped to the clip, encoded by the video
//! VAE as the first latent frame and kept clean through denoising (image-to-video, as the trainer's validation
//! conditions on a first frame). `--ci` and `--fs` are refused.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::decode::{Ltx2Clip, Ltx2Decoder};
use super::denoise::{audio_latent_frames, denoise_clip, ClipStart, Ltx2Context, Ltx2Prompt};
use super::encoder::{encode_texts_for, LoadGemma, Ltx2EncoderFiles};
use super::pipeline::{Ltx2Settings, Schedule, DEFAULT_GUIDANCE, FPS, TRAINER_NEGATIVE};
use super::sound::Ltx2SoundDecoder;
use super::text_cache::encoding_tag;
use crate::family::image::prompt_cache::{cached_encodings, CachedEncoding};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use crate::prep::frames_to_video;
use crate::train::samples::{SampleFiles, SampleSet};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::probe::load_rgb;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_data::resize::resize_to_bucket;
use framesmith_models::ltx2::text::TextParts;
use framesmith_models::ltx2::vae::identify_vae;
use framesmith_models::ltx2::Ltx2Transformer;

/// One sample: its prompt, encoding, settings and where it starts (its latent shape, and for image-to-video the
/// first frame's latents; for sound the audio frames).
pub struct Ltx2SamplePrompt {
    pub prompt: String,
    pub encoded: Ltx2Prompt,
    pub settings: Ltx2Settings,
    pub start: ClipStart,
}

/// The samples of an LTX-2 run and the VAEs that decode them.
pub struct Ltx2Samples {
    pub prompts: Vec<Ltx2SamplePrompt>,
    pub decoder: Ltx2Decoder,
    /// The audio VAE's decoder and the vocoder of a run that trains the audio stream.
    pub sound: Option<Ltx2SoundDecoder>,
    /// The dtype the DiT computes in.
    pub dtype: DType,
    /// The seed of the sample denoised last, which its decode noise is drawn from.
    pub last_seed: Cell<u64>,
    /// The audio tokens of the sample denoised last (sound only), which its write decodes.
    pub last_audio: RefCell<Option<Tensor>>,
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
        let clip = denoise_clip(
            model,
            &p.encoded,
            &p.settings,
            (&p.start, self.dtype, &device),
            cancelled,
        )?;
        self.last_audio.replace(clip.audio);
        Ok(clip.video)
    }

    fn write(&self, latents: Tensor, dir: &Path, stem: &str) -> anyhow::Result<SampleFiles> {
        let sound = match (&self.sound, self.last_audio.take()) {
            (Some(decoder), Some(tokens)) => Some(decoder.decode_tokens(&tokens)?),
            _ => None,
        };
        let clip = Ltx2Clip {
            frames: self.decoder.decode(&latents, self.last_seed.get())?,
            fps: FPS,
            sound,
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

/// What one prompt samples.
struct SampleSpec {
    settings: Ltx2Settings,
    latent: [usize; 3],
    /// The `--i` start image, read.
    image: Option<RgbImage>,
}

/// What each prompt samples, checked against the VAE's `(space, time)` compression, with its `--i` image read
/// (a missing or unreadable one refused by prompt and file); the options LTX-2 does not take are refused.
fn clip_settings(
    specs: &[PromptSpec],
    (prompts_file, factors, schedule): (&Path, (usize, usize), Schedule),
    sound: bool,
) -> anyhow::Result<Vec<SampleSpec>> {
    specs
        .iter()
        .map(|spec| {
            let at = || format!("sample prompt \"{}\" in {}", spec.prompt, prompts_file.display());
            if !spec.controls.is_empty() || spec.flow_shift.is_some() {
                anyhow::bail!(
                    "{}: --ci and --fs are not for LTX-2 samples (clips from --w, --h, --f, --s, --l, --n, --d and \
                     an --i start image; the scheduler shifts by itself): remove them",
                    at()
                );
            }
            let image = spec
                .image
                .as_deref()
                .map(|path| {
                    load_rgb(path).map_err(|e| {
                        anyhow::anyhow!(
                            "{}: the start image --i cannot be used: {}: {}; point --i at a PNG, JPEG, WebP or \
                             BMP image (relative to the prompt file)",
                            at(),
                            e.reason(),
                            path.display()
                        )
                    })
                })
                .transpose()?;
            let settings = Ltx2Settings {
                width: spec.width,
                height: spec.height,
                frames: spec.clip_frames(),
                steps: spec.steps,
                guidance: spec.guidance.unwrap_or(DEFAULT_GUIDANCE),
                seed: spec.seed,
                schedule,
                sound,
            };
            let latent = settings
                .latent_shape(factors, ["--w", "--h", "--f", "--s"])
                .with_context(at)?;
            Ok(SampleSpec {
                settings,
                latent,
                image,
            })
        })
        .collect()
}

/// The prompt cache's key parts of a sample text (the files it is encoded with key the cache itself).
fn key_parts(text: &str) -> Vec<String> {
    vec!["ltx-2 gemma-3 connector".to_owned(), text.to_owned()]
}

/// A cached encoding: the video connector's output (and the audio connector's, when it was encoded for sound).
fn from_tensors(mut t: HashMap<String, Tensor>) -> Option<Ltx2Context> {
    Some(Ltx2Context {
        video: t.remove("video_prompt_embeds")?,
        audio: t.remove("audio_prompt_embeds"),
    })
}

/// A cached encoding with the audio connector's output (an entry encoded without sound is encoded again).
fn from_tensors_av(t: HashMap<String, Tensor>) -> Option<Ltx2Context> {
    from_tensors(t).filter(|c| c.audio.is_some())
}

/// An encoding's tensors as the cache stores them.
fn to_tensors(text: &Ltx2Context) -> Vec<(&'static str, &Tensor)> {
    let mut out = vec![("video_prompt_embeds", &text.video)];
    if let Some(audio) = &text.audio {
        out.push(("audio_prompt_embeds", audio));
    }
    out
}

/// How the encodings go in and out of the prompt cache: video only, and for sound.
const CACHED: CachedEncoding<Ltx2Context> = CachedEncoding {
    parts: key_parts,
    from_tensors,
    tensors: to_tensors,
};
const CACHED_AV: CachedEncoding<Ltx2Context> = CachedEncoding {
    parts: key_parts,
    from_tensors: from_tensors_av,
    tensors: to_tensors,
};

/// Every distinct text the prompts need: each prompt and its negative prompt (the trainer's default when none
/// is given and guidance runs it).
fn texts_of<'a>(specs: &'a [PromptSpec], settings: &[SampleSpec]) -> Vec<&'a str> {
    let mut texts: Vec<&str> = Vec::new();
    for (spec, s) in specs.iter().zip(settings) {
        let negative = s
            .settings
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
/// and its tokenizer, and for sound the file holding the audio VAE's decoder and the vocoder.
pub struct SampleFilesIn<'a> {
    pub dit: &'a Path,
    pub vae: &'a Path,
    pub text_encoder: &'a Path,
    pub sound: Option<&'a Path>,
}

/// The connector outputs of `texts`, in order (with the audio connector's for `sound`): from the run's prompt
/// cache where it holds them, the rest encoded by Gemma 3 from `load` with the connectors of `files.dit` (Gemma
/// loaded only when something is missing).
fn encode_prompts(
    plan: &RunPlan,
    files: &SampleFilesIn<'_>,
    (texts, sound): (&[&str], bool),
    (dtype, device): (DType, &Device),
    (load, log): (LoadGemma<'_>, &mut dyn FnMut(LogLevel, String)),
) -> anyhow::Result<Vec<Ltx2Context>> {
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
        let encoded = encode_texts_for(
            encoder_files,
            load,
            (missing, sound),
            (dtype, device),
            &mut |l: &str| lines.push(l.to_owned()),
        )?;
        Ok(encoded
            .into_iter()
            .map(|t| Ltx2Context {
                video: t.embeds,
                audio: t.audio_embeds,
            })
            .collect())
    };
    let how = if sound { &CACHED_AV } else { &CACHED };
    let (encoded, fresh) = cached_encodings((&cache, how), texts, (dtype, device), encode, log)?;
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

/// The first-frame latents [C, 1, H, W] of `image` resized to cover the clip of `settings` and centre-cropped (the
/// trainer's validation `_resize_and_center_crop`, here with the datasets' resize filters rather than bicubic),
/// encoded by the video VAE. ltx-pipelines also re-compresses the image as H.264 at CRF 33 before encoding; the
/// trainer's validation does not, nor does this.
pub(super) fn first_frame(
    decoder: &Ltx2Decoder,
    image: &RgbImage,
    settings: &Ltx2Settings,
) -> anyhow::Result<Tensor> {
    let frame = resize_to_bucket(image, (settings.width as u32, settings.height as u32));
    let video = frames_to_video(std::slice::from_ref(&frame), &decoder.device)?;
    Ok(decoder
        .vae
        .encode(&video)
        .context("encoding the start image with the LTX-2 video VAE")?
        .squeeze(0)?
        .to_dtype(DType::F32)?)
}

/// The samples of an LTX-2 run (`None` when nothing is sampled): the prompt file read and checked (its `--i` images
/// read), the prompts encoded (through the prompt cache, Gemma 3 from `load`; with the audio connector too when
/// `files.sound` names the audio decoder's file) and the VAEs loaded, in `dtype` on `device`. Called before the DiT
/// loads.
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
    let sound = files.sound.is_some();
    let settings = clip_settings(&specs, (&sampling.prompts, factors, schedule), sound)?;
    let texts = texts_of(&specs, &settings);
    let encoded = encode_prompts(plan, &files, (&texts, sound), (dtype, device), (load, log))?;
    let text_of = |text: &str| -> anyhow::Result<Ltx2Context> {
        let i = texts
            .iter()
            .position(|t| *t == text)
            .context("a sample prompt was not encoded")?;
        Ok(encoded[i].clone())
    };
    // After Gemma is gone: the VAEs stay on the device for the whole run.
    let decoder = Ltx2Decoder::load(files.vae, (dtype, device)).with_context(vae_context)?;
    let prompts = specs
        .iter()
        .zip(settings)
        .map(|(spec, s)| {
            let negative = s
                .settings
                .guided()
                .then(|| text_of(spec.negative.as_deref().unwrap_or(TRAINER_NEGATIVE)))
                .transpose()?;
            let first = s
                .image
                .as_ref()
                .map(|image| first_frame(&decoder, image, &s.settings))
                .transpose()?;
            Ok(Ltx2SamplePrompt {
                prompt: spec.prompt.clone(),
                encoded: Ltx2Prompt {
                    text: text_of(&spec.prompt)?,
                    negative,
                },
                start: ClipStart {
                    latent: s.latent,
                    first_frame: first,
                    audio_frames: sound.then(|| audio_latent_frames(s.settings.frames, FPS)),
                },
                settings: s.settings,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sound = files
        .sound
        .map(|path| Ltx2SoundDecoder::load(path, dtype, device))
        .transpose()?;
    Ok(Some(Ltx2Samples {
        prompts,
        decoder,
        sound,
        dtype,
        last_seed: Cell::new(0),
        last_audio: RefCell::new(None),
    }))
}
