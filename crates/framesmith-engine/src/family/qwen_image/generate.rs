//! Qwen-Image's part of the generation call: one PNG image from a prompt with the Qwen-Image transformer and its
//! LoRAs, the text encoder (through the seam, [`super::encoder`]) and the VAE. Options of other families are refused
//! by flag and the output checked before anything loads; then the prompt (and `--negative`, for true CFG at
//! `--guidance`, 4.0 by default) is encoded and the encoder dropped, the VAE and the DiT load (its blocks streamed
//! with `--blocks-to-swap`), and the engine samples ([`super::pipeline`]). Qwen-Image-Edit (-2509) edits the images
//! given with `--control` (their tokens after the image's; the output takes the first one's size by default),
//! the prompt and the negative prompt each encoded with them by Qwen2.5-VL's vision tower, as the edit pipeline the
//! DiT's files say ([`super::edit`]) encodes them.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use framesmith_config::RunConfig;
use framesmith_data::control::read_controls;
use framesmith_models::qwen_image::vae::load_vae;
use framesmith_models::qwen_image::weights::load_dit_streamed;
use framesmith_models::qwen_image::QwenImageTransformer;
use framesmith_nn::offload::OffloadOptions;

use super::edit::edit_pipeline_of;
use super::encoder::{encode_each, EncoderFiles, EncoderLoaders};
use super::pipeline::{
    decode_image, denoise_image, QwenImagePrompt, QwenImageSettings, DEFAULT_CFG_SCALE,
    DEFAULT_SIDE, DEFAULT_STEPS,
};
use super::train::{dit_config, is_qwen_image_file};
use crate::family::image::generate::{
    apply_loras, check_request, control_images, edit_size, finish_image, foreign_options,
    hold_budget, one_device, ControlSizing, ImageSteps, OutKind, RequestChecks,
};
use crate::family::image::plan::spread_streamed_blocks;
use crate::generate::request::{
    open_device, pick_dtype, DitSource, GenerationOutput, GenerationRequest,
};
use crate::generate::run::{given, Session};
use framesmith_nn::offload::release_cached_memory;

/// Qwen-Image-Edit's control images: about 1024² pixels at their aspect ratio in 16-pixel steps, as the edit
/// pipelines (and musubi-tuner's sampling) size them for the VAE.
pub(super) const CONTROL_SIZING: ControlSizing = ControlSizing::Area {
    area: (1024, 1024),
    step: 16,
};

/// Whether `dit` is a Qwen-Image transformer (so generation goes the Qwen-Image way).
pub fn is_qwen_image_dit(dit: &DitSource) -> bool {
    match dit {
        DitSource::File(path) => is_qwen_image_file(path),
        DitSource::Demo => false,
    }
}

/// The options given that only other families take, by flag.
fn other_options(request: &GenerationRequest) -> Vec<&'static str> {
    foreign_options(
        request,
        "--solver (Qwen-Image samples with euler)",
        &["--clip-l", "--t5"],
    )
}

/// The request for the models of the Qwen-Image run `config`: its DiT, VAE and text encoder, its device, an image
/// written to `out_stem`.png.
pub fn run_request(config: &RunConfig, out_stem: &Path) -> GenerationRequest {
    let m = &config.model;
    let mut request = GenerationRequest::new(
        DitSource::File(m.dit.clone()),
        "",
        out_stem.with_extension("png"),
    );
    request.files.vae = given(&m.vae);
    request.files.text_encoder = given(&m.text_encoder);
    request.placement.device = config.training.device;
    request
}

/// The request's checks before anything loads; returns the VAE and the text encoder's weights.
fn check_qwen_request<'a>(
    dit: &Path,
    request: &'a GenerationRequest,
) -> anyhow::Result<[&'a Path; 2]> {
    let checks = RequestChecks {
        family: "Qwen-Image",
        foreign: other_options(request),
        refusal: (
            "other models",
            "a Qwen-Image DiT makes one image from --prompt (and --negative) with --vae and --text-encoder",
        ),
        vae: "qwen_image_vae.safetensors",
        text_encoder: "qwen_2.5_vl_7b.safetensors",
        out: OutKind::Png,
    };
    check_request((dit, dit_config(dit)), request, &checks)
}

/// The prompt (and negative prompt) through the encoder `load` gives, dropped before returning: with `--control`,
/// the edit encoder of the pipeline the DiT `dit` takes, each text encoded with the control images.
pub(super) fn encode_prompt(
    request: &GenerationRequest,
    (weights, dit): (&Path, &Path),
    load: EncoderLoaders<'_>,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<QwenImagePrompt> {
    let files = EncoderFiles {
        weights,
        tokenizer: request.files.tokenizer.as_deref(),
    };
    let mut texts = vec![request.prompt.as_str()];
    texts.extend(request.negative.as_deref());
    let encoded = if request.controls.is_empty() {
        let encoder = (load.text)(files, dtype, device)?;
        encode_each(encoder.as_ref(), &texts, dtype)?
    } else {
        let images = read_controls(Path::new("--prompt"), &request.controls)?;
        let encoder = (load.edit)(files, edit_pipeline_of(Some(dit)), dtype, device)?;
        texts
            .iter()
            .map(|text| Ok(encoder.encode_edit(text, &images)?.to_dtype(dtype)?))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    release_cached_memory(device)?;
    let mut encoded = encoded.into_iter();
    let embed = encoded
        .next()
        .context("the text encoder returned no prompt")?
        .to_device(device)?;
    let negative = encoded.next().map(|n| n.to_device(device)).transpose()?;
    Ok(QwenImagePrompt {
        embed,
        negative,
        controls: Vec::new(),
    })
}

/// Loads the DiT (streaming `--blocks-to-swap` of its blocks) and applies the LoRAs.
fn load_dit_with_loras(
    dit: &Path,
    request: &GenerationRequest,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<QwenImageTransformer> {
    let cfg = dit_config(dit)?;
    let streamed = spread_streamed_blocks(cfg.num_layers, request.blocks_to_swap);
    let mut model = load_dit_streamed(
        dit,
        (dtype, device),
        request.fp8,
        false,
        (&streamed, &OffloadOptions::default()),
    )?;
    session.log(format!("DiT: Qwen-Image ({})", dit.display()));
    apply_loras(&mut model, request, (dtype, device), session, "Qwen-Image")?;
    Ok(model)
}

/// Generates the image `request` asks for with the Qwen-Image DiT it names.
pub fn generate(
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    generate_with(request, session, EncoderLoaders::real())
}

/// [`generate`] with the text encoders from `load`.
pub(crate) fn generate_with(
    request: &GenerationRequest,
    session: &mut Session,
    load: EncoderLoaders<'_>,
) -> anyhow::Result<GenerationOutput> {
    let DitSource::File(dit) = &request.dit else {
        anyhow::bail!(
            "Qwen-Image generates from a DiT file: give --dit qwen_image_bf16.safetensors"
        );
    };
    let [vae_path, text_encoder] = check_qwen_request(dit, request)?;
    let mut settings = QwenImageSettings {
        width: request.width.unwrap_or(DEFAULT_SIDE),
        height: request.height.unwrap_or(DEFAULT_SIDE),
        steps: request.steps.unwrap_or(DEFAULT_STEPS),
        cfg_scale: request.guidance.unwrap_or(DEFAULT_CFG_SCALE),
        seed: 0,
    };
    let device = open_device(one_device(&request.placement, "Qwen-Image")?)?;
    let dtype = pick_dtype(request.dtype, &device)?;
    let held = hold_budget(request, &device)?;
    let controls = control_images(&request.controls, CONTROL_SIZING, &device)?;
    (settings.width, settings.height) = edit_size(request, &controls, DEFAULT_SIDE)?;
    let latent = settings.latent_size(["--width", "--height", "--steps"])?;
    let mut prompt = encode_prompt(
        request,
        (text_encoder, dit.as_path()),
        load,
        (dtype, &device),
    )?;
    let vae = load_vae(vae_path, dtype, &device)
        .with_context(|| format!("--vae {}", vae_path.display()))?;
    prompt.controls = controls
        .iter()
        .map(|c| -> anyhow::Result<Tensor> {
            Ok(vae
                .encode(&c.to_dtype(dtype)?)?
                .squeeze(2)?
                .to_dtype(DType::F32)?)
        })
        .collect::<anyhow::Result<_>>()?;
    let model = load_dit_with_loras(dit, request, (dtype, &device), session)?;
    settings.seed = request.seed.unwrap_or_else(rand::random);
    let cfg_line = match &prompt.negative {
        Some(_) if settings.cfg_scale > 1.0 => format!(", true CFG {}", settings.cfg_scale),
        _ => String::new(),
    };
    session.log(format!(
        "seed {}, {}x{}, {} steps{cfg_line}",
        settings.seed, settings.width, settings.height, settings.steps
    ));
    let seed = settings.seed;
    let steps = ImageSteps {
        steps: settings.steps,
        // The DiT moves in, and is dropped before the VAE decodes.
        denoise: move |cancelled: &dyn Fn() -> bool| {
            denoise_image(&model, &prompt, &settings, latent, dtype, cancelled)
        },
        decode: |z: &Tensor| decode_image(&vae, z, dtype),
    };
    finish_image(request, session, (&device, held.as_ref()), steps, seed)
}
