//! Samples during FLUX.1 [dev] training: the prompt file's prompts are encoded by CLIP-L (`model.clip`) and T5-XXL
//! (`model.text_encoder`) before the DiT loads, and the encoders dropped right after, as Wan's samples do (and
//! cached in the output folder as Wan's are, so a later start loads no encoder); each
//! sample is then the image `framesmith generate` makes ([`crate::family::flux::pipeline`]: seeded noise, the shifted
//! schedule, Euler with the guidance input) with the LoRA being trained, decoded by the autoencoder (`model.vae`)
//! and written as `samples/{step:06}-{prompt:02}.png` ([`crate::train::samples`] schedules and names them). A
//! prompt line takes `--w --h --s --l --d` (and for FLUX.1 Kontext [dev], `--ci` the image it edits); Wan's `--f`,
//! `--fs`, `--n` and `--i` are refused by name.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::RgbImage;

use crate::family::flux::pipeline::{
    check_companions, decode_image, denoise_image, encode_prompts, Companion, Companions,
    FluxImageSettings, FluxPrompt, SettingNames, DEV_GUIDANCE, DEV_T5_TOKENS,
};
use crate::family::image::generate::{control_images, ControlSizing};
use crate::family::image::prompt_cache::{cached_encodings, CachedEncoding};
use crate::family::image::samples::{self, ImagePipeline};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_models::flux::autoencoder::AutoEncoder;
use framesmith_models::flux::text_encoder::TextEncoderFiles;
use framesmith_models::flux::weights::{load_autoencoder, FluxVariant};
use framesmith_models::flux::{Flux, FluxConfig};

/// FLUX.1's sampling pipeline ([`crate::family::flux::pipeline`]): the DiT's denoising with the guidance input,
/// the autoencoder's decoding.
pub struct FluxImages;

impl ImagePipeline for FluxImages {
    type Model = Flux;
    type Prompt = FluxPrompt;
    type Settings = FluxImageSettings;
    type Decoder = AutoEncoder;

    fn denoise(
        model: &Flux,
        (prompt, settings): (&FluxPrompt, &FluxImageSettings),
        latent: [usize; 2],
        dtype: DType,
        cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        denoise_image(model, prompt, settings, latent, dtype, cancelled)
    }

    fn decode(ae: &AutoEncoder, latents: &Tensor, dtype: DType) -> anyhow::Result<RgbImage> {
        decode_image(ae, latents, dtype)
    }
}

/// One FLUX.1 image prompt: its text, its CLIP-L and T5-XXL outputs and what to sample.
pub type ImagePrompt = samples::ImagePrompt<FluxImages>;

/// The prompts of a FLUX.1 run's samples and the autoencoder that decodes them.
pub type ImageSamples = samples::ImageSamples<FluxImages>;

/// The prompts' CLIP-L and T5-XXL outputs: from the output folder's prompt cache where it holds them (as Wan's
/// samples do), the rest encoded (loading the encoders only then) and cached for the next start.
pub(super) fn cached_prompts(
    files: TextEncoderFiles,
    texts: &[&str],
    run_dir: &Path,
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Vec<FluxPrompt>> {
    let cache = PromptCache::new(&prompt_cache_dir(run_dir), &[files.clip, files.t5]);
    let how = CachedEncoding {
        parts: |text: &str| {
            vec![
                "flux clip-l t5-xxl".to_owned(),
                format!("t5 tokens {DEV_T5_TOKENS}"),
                text.to_owned(),
            ]
        },
        from_tensors: |mut t| {
            Some(FluxPrompt {
                txt: t.remove("txt")?,
                vec: t.remove("vec")?,
                control: None,
            })
        },
        tensors: |p| vec![("txt", &p.txt), ("vec", &p.vec)],
    };
    let encode = |missing: &[&str]| encode_prompts(files, missing, (dtype, device));
    let (prompts, encoded) = cached_encodings((&cache, &how), texts, (dtype, device), encode, log)?;
    let dir = cache.dir().display();
    let line = if encoded == 0 {
        format!(
            "{} sample prompts from the prompt cache in {dir}; CLIP-L and T5-XXL were not loaded",
            texts.len()
        )
    } else {
        format!(
            "{} sample prompts encoded ({} from the prompt cache in {dir}); CLIP-L and T5-XXL released",
            texts.len(),
            texts.len() - encoded
        )
    };
    log(LogLevel::Info, line);
    Ok(prompts)
}

/// The Wan options a prompt line gives, by name, with why FLUX.1 takes none of them.
fn wan_options(spec: &PromptSpec) -> Vec<&'static str> {
    [
        (
            spec.frames.is_some(),
            "--f (a frame count: FLUX.1 samples images)",
        ),
        (
            spec.flow_shift.is_some(),
            "--fs (FLUX.1 shifts its schedule by the image size)",
        ),
        (
            spec.negative.is_some(),
            "--n (FLUX.1 [dev] is guidance-distilled: no negative prompt)",
        ),
        (spec.image.is_some(), "--i (a start image)"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect()
}

/// A Kontext sample's control image (`--ci`) as the autoencoder's latents [1, 16, h, w] (f32), kept at its size
/// rounded down as `framesmith generate` keeps it; `None` for dev. Kontext needs one, dev takes none.
fn sample_control(
    spec: &PromptSpec,
    variant: FluxVariant,
    ae: &AutoEncoder,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<Option<Tensor>> {
    match (variant, spec.controls.as_slice()) {
        (FluxVariant::Kontext, [path]) => {
            let step = (2 * ae.config().downsample_factor()) as u32;
            let sizing = ControlSizing::Own { step };
            let images = control_images(std::slice::from_ref(path), sizing, device)?;
            let image = images.first().context("no control image")?;
            Ok(Some(ae.encode(&image.to_dtype(dtype)?)?.to_dtype(DType::F32)?))
        }
        (FluxVariant::Kontext, controls) => anyhow::bail!(
            "FLUX.1 Kontext [dev] samples edit one image: give it with --ci IMAGE (the line gives {})",
            controls.len()
        ),
        (_, []) => Ok(None),
        (_, _) => anyhow::bail!(
            "--ci gives a control image, which only FLUX.1 Kontext [dev] edits: remove it from the line"
        ),
    }
}

/// The path a `[model]` key must give for samples (the validator asks for it; this names it again if not).
fn model_file<'a>(path: &'a Option<std::path::PathBuf>, key: &str) -> anyhow::Result<&'a Path> {
    path.as_deref()
        .with_context(|| format!("FLUX.1 samples need {key}; set it, or remove sampling.prompts"))
}

/// What each prompt samples: its size, steps, guidance (`--l`, else FLUX.1 [dev]'s 3.5) and seed, checked for an
/// autoencoder that down-samples `factor`×; Wan options are refused.
fn image_settings(
    specs: &[PromptSpec],
    factor: usize,
    prompts_file: &Path,
) -> anyhow::Result<Vec<(FluxImageSettings, [usize; 2])>> {
    specs
        .iter()
        .map(|spec| {
            let wan = wan_options(spec);
            if !wan.is_empty() {
                anyhow::bail!(
                    "sample prompt \"{}\": {} {} for Wan clips; a FLUX.1 sample is an image from --w, --h, --s, --l \
                     (guidance) and --d (seed): remove {} from the line in {}",
                    spec.prompt,
                    wan.join(", "),
                    if wan.len() == 1 { "is" } else { "are" },
                    if wan.len() == 1 { "it" } else { "them" },
                    prompts_file.display()
                );
            }
            let settings = FluxImageSettings {
                width: spec.width,
                height: spec.height,
                steps: spec.steps,
                guidance: spec.guidance.unwrap_or(DEV_GUIDANCE),
                seed: spec.seed,
            };
            let latent = settings
                .latent_size_as(factor, SettingNames::PROMPT_FILE)
                .with_context(|| {
                    format!(
                        "sample prompt \"{}\" in {}",
                        spec.prompt,
                        prompts_file.display()
                    )
                })?;
            Ok((settings, latent))
        })
        .collect()
}

/// The samples of a FLUX.1 run whose DiT has config `cfg` (`None` when nothing is sampled): the prompt file read
/// and checked, the autoencoder and text encoders checked against the DiT, the prompts encoded (the encoders live
/// only inside this call) and the autoencoder loaded, in `dtype` on `device`. Called before the DiT loads.
pub fn image_samples(
    plan: &RunPlan,
    (cfg, variant): (&FluxConfig, FluxVariant),
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<ImageSamples>> {
    let Some(sampling) = &plan.sampling else {
        return Ok(None);
    };
    let m = &plan.model;
    let files = Companions {
        autoencoder: Companion {
            key: "model.vae",
            path: model_file(&m.vae, "model.vae (ae.safetensors)")?,
        },
        clip_l: Companion {
            key: "model.clip",
            path: model_file(&m.clip, "model.clip (clip_l.safetensors)")?,
        },
        t5: Companion {
            key: "model.text_encoder",
            path: model_file(
                &m.text_encoder,
                "model.text_encoder (t5xxl_fp16.safetensors)",
            )?,
        },
    };
    check_companions(&files, cfg)?;
    let specs = read_prompt_file(&sampling.prompts)?;
    let autoencoder =
        load_autoencoder(files.autoencoder.path, dtype, device).with_context(|| {
            format!(
                "loading the autoencoder for samples from {}",
                files.autoencoder.path.display()
            )
        })?;
    let factor = autoencoder.config().downsample_factor();
    let settings = image_settings(&specs, factor, &sampling.prompts)?;
    let texts: Vec<&str> = specs.iter().map(|s| s.prompt.as_str()).collect();
    let encoder_files = TextEncoderFiles {
        clip: files.clip_l.path,
        clip_tokenizer: None,
        t5: files.t5.path,
        t5_tokenizer: None,
        t5_max_tokens: DEV_T5_TOKENS,
    };
    let encoded = cached_prompts(
        encoder_files,
        &texts,
        &plan.output.output_dir,
        (dtype, device),
        log,
    )?;
    let prompts = specs
        .into_iter()
        .zip(encoded)
        .zip(settings)
        .map(|((spec, encoded), (settings, latent))| {
            let control = sample_control(&spec, variant, &autoencoder, (dtype, device))
                .with_context(|| {
                    format!(
                        "sample prompt \"{}\" in {}",
                        spec.prompt,
                        sampling.prompts.display()
                    )
                })?;
            Ok(ImagePrompt {
                prompt: spec.prompt,
                encoded: FluxPrompt { control, ..encoded },
                settings,
                latent,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Some(ImageSamples {
        prompts,
        decoder: autoencoder,
        dtype,
    }))
}

#[cfg(test)]
mod tests;
