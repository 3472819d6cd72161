//! Samples during Qwen-Image training: the prompt file's prompts (and negative prompts, `--n`, " " when not given,
//! as musubi-tuner samples Qwen-Image) are encoded through the text-encoder seam ([`super::encoder`]) before the DiT
//! loads, the encoder dropped right after, and the embeddings cached in the output folder so a later start loads
//! no encoder; each sample is then the image `framesmith generate` makes ([`super::pipeline`]: seeded noise, the
//! shifted schedule, Euler with true CFG at `--l`, 4.0 when not given) with the LoRA being trained, decoded by the
//! VAE (`model.vae`) and written as `samples/{step:06}-{prompt:02}.png`; `--ci` gives a Qwen-Image-Edit sample its
//! control images, with which its prompt and negative prompt are encoded (the vision tower, as the edit pipeline
//! `model.dit` says), keyed in the prompt cache by the images' contents. Wan's `--f`, `--fs` and `--i` are refused.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use super::edit::{control_record, edit_pipeline_of};
use super::encoder::{encode_each, EditPromptEncoder, EncoderFiles, EncoderLoaders};
use super::generate::CONTROL_SIZING;
use super::pipeline::{
    decode_image, denoise_image, QwenImagePrompt, QwenImageSettings, DEFAULT_CFG_SCALE,
};
use crate::family::image::generate::control_images;
use crate::family::image::prompt_cache::{cached_encodings, CachedEncoding};
use crate::family::image::samples::{self, ImagePipeline};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::control::read_controls;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_models::qwen25vl::EditPipeline;
use framesmith_models::qwen_image::vae::{load_vae, QwenImageVae, LATENT_CHANNELS};
use framesmith_models::qwen_image::{QwenImageConfig, QwenImageTransformer};
use framesmith_nn::offload::release_cached_memory;

/// The negative prompt of a sample that gives none (musubi-tuner's default).
pub const DEFAULT_NEGATIVE: &str = " ";

/// Qwen-Image's sampling pipeline ([`super::pipeline`]): the transformer's denoising with true CFG, the VAE's
/// decoding.
pub struct QwenImages;

impl ImagePipeline for QwenImages {
    type Model = QwenImageTransformer;
    type Prompt = QwenImagePrompt;
    type Settings = QwenImageSettings;
    type Decoder = QwenImageVae;

    fn denoise(
        model: &QwenImageTransformer,
        (prompt, settings): (&QwenImagePrompt, &QwenImageSettings),
        latent: [usize; 2],
        dtype: DType,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        denoise_image(model, prompt, settings, latent, dtype, cancelled)
    }

    fn decode(vae: &QwenImageVae, latents: &Tensor, dtype: DType) -> anyhow::Result<RgbImage> {
        decode_image(vae, latents, dtype)
    }
}

/// One Qwen-Image prompt: its text, its hidden states (and its negative prompt's) and what to sample.
pub type ImagePrompt = samples::ImagePrompt<QwenImages>;

/// The prompts of a Qwen-Image run's samples and the VAE that decodes them.
pub type ImageSamples = samples::ImageSamples<QwenImages>;

/// A sample's text as it is encoded: alone, or with the control images (`--ci`) it is encoded with and their record
/// (the edit pipeline and the images' contents), which keys the prompt cache.
pub(super) struct SampleText<'a> {
    pub text: &'a str,
    pub controls: &'a [PathBuf],
    pub stamp: Option<String>,
}

/// The prompt cache's key parts of a sample text: a text with control images is another entry for other images.
fn key_parts(text: &SampleText<'_>) -> Vec<String> {
    match &text.stamp {
        None => vec!["qwen-image qwen2.5-vl".to_owned(), text.text.to_owned()],
        Some(stamp) => vec![
            "qwen-image-edit qwen2.5-vl vision".to_owned(),
            stamp.clone(),
            text.text.to_owned(),
        ],
    }
}

/// The embeddings of `texts` [L, D]: from the output folder's prompt cache where it holds them, the rest encoded
/// (loading the encoder only then, and dropping it after; the edit encoder of `pipeline` when a text has control
/// images) and cached for the next start.
pub(super) fn cached_embeddings(
    (files, load, pipeline): (EncoderFiles<'_>, EncoderLoaders<'_>, EditPipeline),
    texts: &[&SampleText<'_>],
    run_dir: &Path,
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Vec<Tensor>> {
    let mut encoders = vec![files.weights];
    encoders.extend(files.tokenizer);
    let cache = PromptCache::new(&prompt_cache_dir(run_dir), &encoders);
    let how = CachedEncoding {
        parts: key_parts,
        from_tensors: |mut t| t.remove("vl_embed"),
        tensors: |embed| vec![("vl_embed", embed)],
    };
    let encode = |missing: &[&SampleText<'_>]| -> anyhow::Result<Vec<Tensor>> {
        let encoded = if missing.iter().all(|t| t.controls.is_empty()) {
            let encoder = (load.text)(files, dtype, device)?;
            let plain: Vec<&str> = missing.iter().map(|t| t.text).collect();
            encode_each(encoder.as_ref(), &plain, dtype)?
        } else {
            let encoder = (load.edit)(files, pipeline, dtype, device)?;
            missing
                .iter()
                .map(|t| sample_embedding(encoder.as_ref(), t, dtype))
                .collect::<anyhow::Result<Vec<_>>>()?
        };
        release_cached_memory(device)?;
        encoded
            .into_iter()
            .map(|e| Ok(e.to_device(device)?))
            .collect()
    };
    let (embeds, encoded) = cached_encodings((&cache, &how), texts, (dtype, device), encode, log)?;
    let line = if encoded == 0 {
        format!(
            "{} sample prompts from the prompt cache in {}; the text encoder was not loaded",
            texts.len(),
            cache.dir().display()
        )
    } else {
        format!("{encoded} sample prompts encoded, the text encoder released")
    };
    log(LogLevel::Info, line);
    Ok(embeds)
}

/// One sample text's embedding [L, D] in `dtype`: with its control images through the vision tower, else the
/// language model alone.
fn sample_embedding(
    encoder: &dyn EditPromptEncoder,
    text: &SampleText<'_>,
    dtype: DType,
) -> anyhow::Result<Tensor> {
    if text.controls.is_empty() {
        return encode_each(encoder, &[text.text], dtype)?
            .pop()
            .context("the text encoder returned no prompt");
    }
    let images = read_controls(Path::new(text.text), text.controls)?;
    Ok(encoder.encode_edit(text.text, &images)?.to_dtype(dtype)?)
}

/// What each prompt samples, checked; Wan's options are refused by name.
fn image_settings(
    specs: &[PromptSpec],
    prompts_file: &Path,
) -> anyhow::Result<Vec<(QwenImageSettings, [usize; 2])>> {
    specs
        .iter()
        .map(|spec| {
            let wan: Vec<&str> = [
                (spec.frames.is_some(), "--f (a frame count)"),
                (spec.flow_shift.is_some(), "--fs (Qwen-Image shifts its schedule by the image size)"),
                (spec.image.is_some(), "--i (a start image)"),
            ]
            .into_iter()
            .filter_map(|(given, name)| given.then_some(name))
            .collect();
            if !wan.is_empty() {
                anyhow::bail!(
                    "sample prompt \"{}\": {} for Wan clips; a Qwen-Image sample is an image from --w, --h, --s, \
                     --l (true CFG scale), --n (negative prompt) and --d (seed): remove it from the line in {}",
                    spec.prompt,
                    wan.join(", "),
                    prompts_file.display()
                );
            }
            let settings = QwenImageSettings {
                width: spec.width,
                height: spec.height,
                steps: spec.steps,
                cfg_scale: spec.guidance.unwrap_or(DEFAULT_CFG_SCALE),
                seed: spec.seed,
            };
            let latent = settings
                .latent_size(["--w", "--h", "--s"])
                .with_context(|| {
                    format!("sample prompt \"{}\" in {}", spec.prompt, prompts_file.display())
                })?;
            Ok((settings, latent))
        })
        .collect()
}

/// A Qwen-Image-Edit sample's control images (`--ci`, in order) as the VAE's latents [1, 16, h, w] (f32), sized
/// as `framesmith generate` sizes them; none for a text-to-image sample.
fn sample_controls(
    spec: &PromptSpec,
    vae: &QwenImageVae,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<Vec<Tensor>> {
    control_images(&spec.controls, CONTROL_SIZING, device)?
        .iter()
        .map(|c| {
            Ok(vae
                .encode(&c.to_dtype(dtype)?)?
                .squeeze(2)?
                .to_dtype(DType::F32)?)
        })
        .collect()
}

/// Each prompt and negative prompt of `specs` once (with the sample's control images, which the edit pipelines
/// encode both with), in order of appearance; a text with control images records them as `pipeline` encodes them.
fn sample_texts<'a>(
    specs: &'a [PromptSpec],
    pipeline: EditPipeline,
    prompts_file: &Path,
) -> anyhow::Result<Vec<SampleText<'a>>> {
    let mut texts: Vec<SampleText<'a>> = Vec::new();
    for spec in specs {
        let stamp = if spec.controls.is_empty() {
            None
        } else {
            Some(control_record(prompts_file, &spec.controls, pipeline)?)
        };
        for text in [
            spec.prompt.as_str(),
            spec.negative.as_deref().unwrap_or(DEFAULT_NEGATIVE),
        ] {
            if !texts.iter().any(|t| t.text == text && t.stamp == stamp) {
                texts.push(SampleText {
                    text,
                    controls: &spec.controls,
                    stamp: stamp.clone(),
                });
            }
        }
    }
    Ok(texts)
}

/// The samples of a Qwen-Image run whose DiT has config `cfg` (`None` when nothing is sampled): the prompt file
/// read and checked, the prompts encoded through `load`'s encoder and the VAE loaded, in `dtype` on `device`.
/// Called before the DiT loads.
pub fn image_samples(
    plan: &RunPlan,
    cfg: &QwenImageConfig,
    (dtype, device): (DType, &Device),
    load: EncoderLoaders<'_>,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<ImageSamples>> {
    let Some(sampling) = &plan.sampling else {
        return Ok(None);
    };
    let m = &plan.model;
    let vae_path = m
        .vae
        .as_deref()
        .context("Qwen-Image samples need model.vae; set it, or remove sampling.prompts")?;
    let weights = m.text_encoder.as_deref().context(
        "Qwen-Image samples need model.text_encoder; set it, or remove sampling.prompts",
    )?;
    let specs = read_prompt_file(&sampling.prompts)?;
    let settings = image_settings(&specs, &sampling.prompts)?;
    let vae = load_vae(vae_path, dtype, device).with_context(|| {
        format!(
            "model.vae: loading the VAE for samples from {}",
            vae_path.display()
        )
    })?;
    if cfg.in_channels != 4 * LATENT_CHANNELS {
        anyhow::bail!(
            "model.vae makes {LATENT_CHANNELS}-channel latents, but this transformer takes {} (packed 2×2): {}",
            cfg.in_channels / 4,
            vae_path.display()
        );
    }
    let pipeline = edit_pipeline_of(super::train::qwen_dit_of(plan).as_deref());
    let texts = sample_texts(&specs, pipeline, &sampling.prompts)?;
    let files = EncoderFiles {
        weights,
        tokenizer: None,
    };
    let embeds = cached_embeddings(
        (files, load, pipeline),
        &texts.iter().collect::<Vec<_>>(),
        &plan.output.output_dir,
        (dtype, device),
        log,
    )?;
    let embed_of = |text: &str, controls: &[PathBuf]| -> anyhow::Result<Tensor> {
        let i = texts
            .iter()
            .position(|t| t.text == text && t.controls == controls)
            .context("a sample prompt was not encoded")?;
        Ok(embeds[i].clone())
    };
    let prompts = specs
        .iter()
        .zip(settings)
        .map(|(spec, (settings, latent))| {
            let negative = spec.negative.as_deref().unwrap_or(DEFAULT_NEGATIVE);
            let controls = sample_controls(spec, &vae, (dtype, device))
                .with_context(|| format!("sample prompt \"{}\"", spec.prompt))?;
            Ok(ImagePrompt {
                prompt: spec.prompt.clone(),
                encoded: QwenImagePrompt {
                    embed: embed_of(&spec.prompt, &spec.controls)?,
                    negative: Some(embed_of(negative, &spec.controls)?),
                    controls,
                },
                settings,
                latent,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(ImageSamples {
        prompts,
        decoder: vae,
        dtype,
    }))
}
