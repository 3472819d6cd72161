//! Samples during training with a real Wan model: the prompt file's prompts are embedded by the umT5 encoder
//! (with the tokenizer beside or inside its weights) before the DiT is loaded, and the encoder is dropped right
//! after, so its memory is free again when training starts; clips are decoded by the Wan VAE.

use anyhow::Context;
use candle_core::{DType, Device};

use crate::generate::denoise::Solver;
use crate::generate::pipeline::{
    fit_context, latent_shape, ClipSettings, Conditioning, VaeDecoder,
};
use crate::generate::prompts::{read_prompt_file, PromptSpec};
use crate::train::samples::{Decoder, SamplePrompt};
use framesmith_config::plan::ModelSource;
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_models::wan::text_encoder::TextEncoder;
use framesmith_models::wan::vae::{load_vae_auto, LatentStats};
use framesmith_models::wan::{weights, ModelType, WanConfig};

/// A sample prompt with its embeddings.
pub struct EncodedPrompt {
    pub spec: PromptSpec,
    pub conditioning: Conditioning,
}

/// Embeds the sample prompts of a run on a real model (`None` for the demo model or when nothing is sampled).
/// The text encoder lives only inside this call.
pub fn encode_sample_prompts(
    plan: &RunPlan,
    dtype: DType,
    device: &Device,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<Option<Vec<EncodedPrompt>>> {
    let (Some(sampling), ModelSource::File(dit)) = (&plan.sampling, &plan.model.source) else {
        return Ok(None);
    };
    // Read from the header alone, before any model loads; a file that cannot be read is reported by the loader.
    if let Ok(report) = weights::inspect(dit) {
        if report.config.model_type == ModelType::I2v {
            anyhow::bail!(
                "{} is an image-to-video model: its clips need a start image, which samples during training cannot \
                 take yet. Remove sampling.prompts from the run config (the LoRA trains the same), and make clips \
                 from the saved LoRA with `framesmith generate --image … --lora …`",
                weights::variant_name(&report.config, report.expert)
            );
        }
    }
    let path = plan
        .model
        .text_encoder
        .as_ref()
        .context("samples need model.text_encoder (the umT5 weights)")?;
    let specs = read_prompt_file(&sampling.prompts)?;
    let encoder = TextEncoder::load(path, None, dtype, device).with_context(|| {
        format!(
            "loading the text encoder for samples from {}",
            path.display()
        )
    })?;
    let encoded = specs
        .into_iter()
        .map(|spec| {
            let conditioning = Conditioning::encode(
                &encoder,
                &spec.prompt,
                spec.negative.as_deref(),
                spec.guidance,
            )
            .with_context(|| format!("encoding the sample prompt \"{}\"", spec.prompt))?;
            if let Some(image) = &spec.image {
                anyhow::bail!(
                    "sample prompt \"{}\": start images (--i) in training samples are read by the demo model \
                     only; remove --i, or make the clip with `framesmith generate --image`: {}",
                    spec.prompt,
                    image.display()
                );
            }
            Ok(EncodedPrompt { spec, conditioning })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    log(
        LogLevel::Info,
        format!(
            "{} sample prompts encoded; text encoder released",
            encoded.len()
        ),
    );
    Ok(Some(encoded))
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
    let prompts = encoded
        .into_iter()
        .map(|EncodedPrompt { spec, conditioning }| {
            let settings = ClipSettings {
                width: spec.width,
                height: spec.height,
                frames: spec.frames,
                steps: spec.steps,
                shift: spec.flow_shift,
                guidance: spec.guidance,
                seed: spec.seed,
                solver: Solver::Unipc,
            };
            let latent_shape = latent_shape(cfg, vae.config(), &settings)
                .with_context(|| format!("sample prompt \"{}\"", spec.prompt))?;
            Ok(SamplePrompt {
                context: fit_context(&conditioning.context, cfg.text_len)?,
                negative: conditioning
                    .negative
                    .as_ref()
                    .map(|n| fit_context(n, cfg.text_len))
                    .transpose()?,
                latent_shape,
                steps: spec.steps,
                shift: spec.flow_shift,
                guidance: spec.guidance,
                seed: spec.seed,
                prompt: spec.prompt,
                start_frame: None,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let decoder = Decoder::Vae(Box::new(VaeDecoder {
        vae,
        stats,
        tiles: None,
        dtype,
    }));
    Ok((prompts, decoder))
}

#[cfg(test)]
#[path = "sample_models_tests.rs"]
mod tests;
