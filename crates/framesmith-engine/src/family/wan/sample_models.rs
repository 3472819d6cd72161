//! Samples during training with a real Wan model: the prompt file's prompts are embedded by the umT5 encoder
//! (with the tokenizer beside or inside its weights) before the DiT is loaded, and the encoder is dropped right
//! after, so its memory is free again when training starts; the embeddings are cached in the output folder, so a
//! resume or a later run of the same prompts starts without loading the encoder at all; clips are decoded by the Wan VAE. Image-to-video
//! models start each clip from the prompt's image (`--i`), conditioned as `framesmith generate --image` does
//! (its CLIP features, for Wan2.1 I2V, also computed before the DiT loads); TI2V-5B starts from it when a prompt
//! gives one and samples text-to-video otherwise, whichever `training.mode` trains.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::family::wan::denoise::ImageConditioning;
use crate::family::wan::mode::start_image;
use crate::family::wan::pipeline::{
    fit_context, latent_shape, ClipSettings, Conditioning, VaeDecoder, DEFAULT_NEGATIVE_PROMPT,
};
use crate::family::wan::samples::{Decoder, SamplePrompt};
use crate::family::wan::start_image::{
    clip_features, image_channels, image_conditioning, load_start_image,
};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use crate::generate::sampler::Solver;
use framesmith_config::catalog::StartImage;
use framesmith_config::plan::ModelSource;
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_data::prompt_cache::{prompt_cache_dir, PromptCache};
use framesmith_models::wan::clip::{load_clip_vision, ClipVisionConfig};
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats};
use framesmith_models::wan::{weights, ModelType, WanConfig};

/// A sample prompt with its embeddings.
pub struct EncodedPrompt {
    pub spec: PromptSpec,
    pub conditioning: Conditioning,
    /// CLIP features [1, tokens, dim] of the start image (Wan2.1 I2V).
    pub clip: Option<Tensor>,
}

/// The DiT's configuration from its header alone, before any model loads; `None` when it cannot be read (the
/// loader reports that).
fn dit_config(plan: &RunPlan) -> Option<WanConfig> {
    match &plan.model.source {
        ModelSource::File(dit) => weights::inspect(dit).ok().map(|r| r.config),
        ModelSource::Demo => None,
    }
}

/// Embeds the sample prompts of a run on a real model (`None` for the demo model or when nothing is sampled).
/// The text encoder lives only inside this call. Image-to-video models need a start image (`--i`) per prompt;
/// for Wan2.1 I2V its CLIP features are computed here too, with `model.clip`, which is dropped afterwards.
pub fn encode_sample_prompts(
    plan: &RunPlan,
    dtype: DType,
    device: &Device,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<Vec<EncodedPrompt>>> {
    let (Some(sampling), ModelSource::File(_)) = (&plan.sampling, &plan.model.source) else {
        return Ok(None);
    };
    let specs = read_prompt_file(&sampling.prompts)?;
    let cfg = dit_config(plan);
    check_start_images(&specs, cfg.as_ref().map(start_image), &sampling.prompts)?;
    let clips = match cfg.filter(WanConfig::has_clip) {
        Some(_) => Some(clip_features_of(plan, &specs, dtype, device, log)?),
        None => None,
    };
    let path = plan
        .model
        .text_encoder
        .as_ref()
        .context("samples need model.text_encoder (the umT5 weights)")?;
    let cache = PromptCache::new(&prompt_cache_dir(&plan.output.output_dir), &[path]);
    let cached: Vec<Option<Conditioning>> = specs
        .iter()
        .map(|spec| cached_conditioning(&cache, spec, dtype, device))
        .collect();
    let from_cache = cached.iter().flatten().count();
    let encoder = if from_cache < specs.len() {
        Some(
            TextEncoder::load(path, None, dtype, device).with_context(|| {
                format!(
                    "loading the text encoder for samples from {}",
                    path.display()
                )
            })?,
        )
    } else {
        None
    };
    let mut clips = clips.map(Vec::into_iter);
    let encoded = specs
        .into_iter()
        .zip(cached)
        .map(|(spec, cached)| {
            let conditioning = match (cached, &encoder) {
                (Some(conditioning), _) => conditioning,
                (None, Some(encoder)) => encode_and_cache(&cache, encoder, &spec, dtype, log)?,
                (None, None) => {
                    anyhow::bail!("the sample prompt \"{}\" has no embedding", spec.prompt)
                }
            };
            let clip = clips.as_mut().and_then(Iterator::next);
            Ok(EncodedPrompt {
                spec,
                conditioning,
                clip,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    log(
        LogLevel::Info,
        match encoder {
            Some(_) => format!(
                "{} sample prompts encoded ({from_cache} from the prompt cache in {}); text encoder released",
                encoded.len(),
                cache.dir().display()
            ),
            None => format!(
                "{} sample prompts from the prompt cache in {}; the text encoder was not loaded",
                encoded.len(),
                cache.dir().display()
            ),
        },
    );
    Ok(Some(encoded))
}

/// Refuses a start image (`--i`) that the model does not read, and a missing one where every clip starts from one
/// (`takes_image`: the model's rule; `None` before its file is read); a control image (`--ci`) is never Wan's.
fn check_start_images(
    specs: &[PromptSpec],
    takes_image: Option<StartImage>,
    prompts: &Path,
) -> anyhow::Result<()> {
    for spec in specs {
        if let Some(control) = spec.controls.first() {
            anyhow::bail!(
                "sample prompt \"{}\": --ci gives an edit model's control image (FLUX.1 Kontext, Qwen-Image-Edit); \
                 Wan clips start from --i: remove --ci from the line: {}",
                spec.prompt,
                control.display()
            );
        }
        match (&spec.image, takes_image) {
            (Some(image), Some(StartImage::Never)) => anyhow::bail!(
                "sample prompt \"{}\": start images (--i) in training samples are read by the demo model, TI2V-5B \
                 and image-to-video models only; remove --i, or make the clip with `framesmith generate --image`: {}",
                spec.prompt,
                image.display()
            ),
            (None, Some(StartImage::Always)) => anyhow::bail!(
                "sample prompt \"{}\": this image-to-video model starts every clip from an image; add --i with a \
                 start image (PNG, JPEG, WebP or BMP) to the line in {}",
                spec.prompt,
                prompts.display()
            ),
            _ => {}
        }
    }
    Ok(())
}

/// What a Wan prompt's embeddings depend on besides the encoder and dtype: the prompt, the negative prompt and
/// whether guidance embeds the negative.
fn cache_parts(spec: &PromptSpec) -> [&str; 4] {
    [
        "wan umt5",
        &spec.prompt,
        spec.negative.as_deref().unwrap_or(DEFAULT_NEGATIVE_PROMPT),
        if spec.clip_guidance() > 1.0 {
            "guided"
        } else {
            "unguided"
        },
    ]
}

/// The cached embeddings of `spec`, when the cache holds them.
fn cached_conditioning(
    cache: &PromptCache,
    spec: &PromptSpec,
    dtype: DType,
    device: &Device,
) -> Option<Conditioning> {
    let mut tensors = cache.get(&cache_parts(spec), dtype, device)?;
    let context = tensors.remove("context")?;
    let negative = tensors.remove("negative");
    if (spec.clip_guidance() > 1.0) != negative.is_some() {
        return None;
    }
    Some(Conditioning { context, negative })
}

/// Embeds `spec` with `encoder` and caches the result; a cache that cannot be written costs a warning only.
fn encode_and_cache(
    cache: &PromptCache,
    encoder: &TextEncoder,
    spec: &PromptSpec,
    dtype: DType,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Conditioning> {
    let conditioning = Conditioning::encode(
        encoder,
        &spec.prompt,
        spec.negative.as_deref(),
        spec.clip_guidance(),
    )
    .with_context(|| format!("encoding the sample prompt \"{}\"", spec.prompt))?;
    let mut tensors = vec![("context", &conditioning.context)];
    if let Some(negative) = &conditioning.negative {
        tensors.push(("negative", negative));
    }
    if let Err(e) = cache.put(&cache_parts(spec), dtype, &tensors) {
        log(
            LogLevel::Warn,
            format!("the sample prompt's embedding is not cached for the next run: {e}"),
        );
    }
    Ok(conditioning)
}

/// CLIP features of each prompt's start image, with the CLIP image encoder of `model.clip` (Wan2.1 I2V).
fn clip_features_of(
    plan: &RunPlan,
    specs: &[PromptSpec],
    dtype: DType,
    device: &Device,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Vec<Tensor>> {
    let path = plan.model.clip.as_ref().context(
        "samples of Wan2.1 I2V encode their start images with CLIP: set model.clip to \
         models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (or ComfyUI's clip_vision_h.safetensors), or \
         remove sampling.prompts",
    )?;
    let clip = load_clip_vision(path, &ClipVisionConfig::vit_h_14(), dtype, device)
        .with_context(|| format!("loading the CLIP image encoder {}", path.display()))?;
    let features = specs
        .iter()
        .map(|spec| {
            let image = load_image(spec)?;
            clip_features(&clip, &image, (spec.width, spec.height), device)
                .with_context(|| format!("sample prompt \"{}\"", spec.prompt))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    log(
        LogLevel::Info,
        "sample start images encoded; CLIP image encoder released".into(),
    );
    Ok(features)
}

/// The start image of an image-to-video sample prompt.
fn load_image(spec: &PromptSpec) -> anyhow::Result<image::RgbImage> {
    let path = spec
        .image
        .as_ref()
        .with_context(|| format!("sample prompt \"{}\" has no start image (--i)", spec.prompt))?;
    load_start_image(path).with_context(|| format!("sample prompt \"{}\"", spec.prompt))
}

/// The sample prompts and the VAE decoder for a real model of config `cfg`.
pub fn vae_sampling(
    plan: &RunPlan,
    cfg: &WanConfig,
    encoded: Vec<EncodedPrompt>,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<(Vec<SamplePrompt>, Decoder)> {
    let path = plan
        .model
        .vae
        .as_ref()
        .context("samples need model.vae (the Wan VAE weights)")?;
    let vae = load_vae_auto(path, dtype, device)
        .with_context(|| format!("loading the VAE for samples from {}", path.display()))?;
    let stats = LatentStats::official(vae.config().variant, device)?;
    let decoder = VaeDecoder {
        vae,
        stats,
        tiles: None,
        dtype,
    };
    let prompts = encoded
        .into_iter()
        .map(|encoded| sample_prompt(cfg, encoded, &decoder))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((prompts, Decoder::Vae(Box::new(decoder))))
}

/// One prompt ready to sample: its latent shape checked, its contexts fitted, and for an image-to-video model
/// its start image turned into the DiT's conditioning.
fn sample_prompt(
    cfg: &WanConfig,
    EncodedPrompt {
        spec,
        conditioning,
        clip,
    }: EncodedPrompt,
    decoder: &VaeDecoder,
) -> anyhow::Result<SamplePrompt> {
    let settings = ClipSettings {
        width: spec.width,
        height: spec.height,
        frames: spec.clip_frames(),
        steps: spec.steps,
        shift: spec.clip_flow_shift(),
        guidance: spec.clip_guidance(),
        seed: spec.seed,
        solver: Solver::Unipc,
    };
    let latent_shape = latent_shape(cfg, decoder.vae.config(), &settings)
        .with_context(|| format!("sample prompt \"{}\"", spec.prompt))?;
    let image = match (cfg.model_type, &spec.image) {
        (ModelType::I2v, _) => {
            let y = image_channels(cfg, &load_image(&spec)?, decoder, &settings)
                .with_context(|| format!("the start image of the sample \"{}\"", spec.prompt))?;
            Some(ImageConditioning::Channels { y, clip })
        }
        // TI2V-5B: with --i the image's latent is the first latent frame (`WanTI2V.i2v`), else text-to-video.
        (ModelType::Ti2v, Some(_)) => Some(
            image_conditioning(cfg, &load_image(&spec)?, decoder, None, &settings)
                .with_context(|| format!("the start image of the sample \"{}\"", spec.prompt))?,
        ),
        _ => None,
    };
    Ok(SamplePrompt {
        context: fit_context(&conditioning.context, cfg.text_len)?,
        negative: conditioning
            .negative
            .as_ref()
            .map(|n| fit_context(n, cfg.text_len))
            .transpose()?,
        latent_shape,
        steps: spec.steps,
        shift: spec.clip_flow_shift(),
        guidance: spec.clip_guidance(),
        seed: spec.seed,
        prompt: spec.prompt,
        image,
    })
}

#[cfg(test)]
mod tests;
