//! FLUX.1's part of the generation call: one PNG image from a prompt — FLUX.1 [dev] (or [schnell]) with its LoRAs,
//! CLIP-L and T5-XXL, the autoencoder; FLUX.1 Kontext [dev] edits the image given with `--control` (kept at its size
//! rounded down to 16 pixels, as musubi-tuner samples Kontext; the output takes that size by default). Every file is checked to be the component its flag names (and the text
//! encoders and autoencoder to fit the DiT) before anything loads; then the text encoders run and are dropped, the
//! autoencoder and the DiT load, and the engine samples ([`crate::family::flux::pipeline`]).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use framesmith_config::RunConfig;
use framesmith_models::flux::text_encoder::TextEncoderFiles;
use framesmith_models::flux::weights::{
    identify_expected, load_autoencoder, load_dit, FluxComponent, FluxFile, FluxKind, FluxVariant,
};
use framesmith_models::flux::{Flux, FluxConfig};
use framesmith_models::identify::{identify, IdentifyError, ModelFile};

use crate::family::flux::pipeline::{
    check_companions, decode_image, denoise_image, encode_prompts, Companion, Companions,
    FluxImageSettings, FluxPrompt, DEV_GUIDANCE, DEV_T5_TOKENS,
};
use crate::family::image::generate::{
    check_out, control_images, edit_size, finish_image, foreign_options, hold_budget, one_device,
    refuse_foreign, ControlSizing, ImageSteps, OutKind,
};
use crate::generate::request::{
    open_device, pick_dtype, DitSource, GenerationOutput, GenerationRequest,
};
use crate::generate::run::{given, loras_as_one, Session};

/// Image side when --width / --height are not given (the official `cli.py`'s default).
const DEFAULT_SIDE: usize = 1024;
/// Sampling steps when --steps is not given: the official defaults.
const DEV_STEPS: usize = 50;
const SCHNELL_STEPS: usize = 4;
/// T5 tokens of schnell (256, as the official `load_t5` is called for it; dev takes [`DEV_T5_TOKENS`]).
const SCHNELL_T5_TOKENS: usize = 256;

/// Whether `dit` is a FLUX.1 file of any kind (so generation goes the FLUX.1 way and names it if it is not the
/// DiT).
pub fn is_flux_dit(dit: &DitSource) -> bool {
    match dit {
        DitSource::File(path) => {
            !path.is_dir()
                && matches!(
                    identify(path),
                    Ok(ModelFile::Flux(_)) | Err(IdentifyError::Flux(_))
                )
        }
        DitSource::Demo => false,
    }
}

/// The options given that only other families take, by flag.
fn wan_options(request: &GenerationRequest) -> Vec<&'static str> {
    foreign_options(
        request,
        "--solver (FLUX.1 samples with euler)",
        &["--text-encoder", "--negative", "--blocks-to-swap"],
    )
}

/// `identify_expected` with the flag the file was given to in the message.
fn expect(path: &Path, flag: &str, component: FluxComponent) -> anyhow::Result<FluxFile> {
    identify_expected(path, component, None).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// The DiT's sizes and variant, checked against the control images given: Kontext edits one (`--control`), dev
/// and schnell make images from text alone.
fn dit_of(dit: &Path, controls: usize) -> anyhow::Result<(FluxVariant, FluxConfig)> {
    let file = expect(dit, "--dit", FluxComponent::Dit)?;
    let FluxKind::Dit { variant, config } = file.kind else {
        anyhow::bail!("--dit holds no FLUX.1 DiT: {}", dit.display());
    };
    match (variant, controls) {
        (FluxVariant::Kontext, 1) | (FluxVariant::Dev | FluxVariant::Schnell, 0) => {}
        (FluxVariant::Kontext, 0) => anyhow::bail!(
            "--dit is FLUX.1 Kontext [dev], which edits an image: give it with --control IMAGE, or pick \
             flux1-dev.safetensors to make one from text ({})",
            dit.display()
        ),
        (FluxVariant::Kontext, n) => anyhow::bail!(
            "--control was given {n} times; FLUX.1 Kontext [dev] edits one image ({})",
            dit.display()
        ),
        (other, _) => anyhow::bail!(
            "--control is for edit models; --dit is {other}, which makes images from text: drop --control, or pick \
             flux1-kontext-dev.safetensors ({})",
            dit.display()
        ),
    }
    Ok((variant, config))
}

/// The files FLUX.1 samples with beside its DiT.
struct Files<'a> {
    autoencoder: &'a Path,
    clip_l: &'a Path,
    t5: &'a Path,
}

/// Checks the autoencoder and the text encoders against the DiT ([`check_companions`]).
fn check_files<'a>(
    dit: &Path,
    request: &'a GenerationRequest,
    cfg: &FluxConfig,
) -> anyhow::Result<Files<'a>> {
    let f = &request.files;
    let (Some(clip_l), Some(t5)) = (f.clip_l.as_deref(), f.t5.as_deref()) else {
        anyhow::bail!(
            "a FLUX.1 DiT needs both of its text encoders: --clip-l clip_l.safetensors and --t5 \
             t5xxl_fp16.safetensors (or t5xxl_fp8_e4m3fn_scaled.safetensors) ({})",
            dit.display()
        );
    };
    let Some(autoencoder) = f.vae.as_deref() else {
        anyhow::bail!(
            "a FLUX.1 DiT needs its autoencoder: --vae ae.safetensors ({})",
            dit.display()
        );
    };
    let files = Companions {
        autoencoder: Companion {
            key: "--vae",
            path: autoencoder,
        },
        clip_l: Companion {
            key: "--clip-l",
            path: clip_l,
        },
        t5: Companion {
            key: "--t5",
            path: t5,
        },
    };
    check_companions(&files, cfg)?;
    Ok(Files {
        autoencoder,
        clip_l,
        t5,
    })
}

/// The prompt through CLIP-L and T5-XXL (dropped before returning, their memory given back).
fn encode_prompt(
    request: &GenerationRequest,
    files: &Files,
    t5_max_tokens: usize,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<FluxPrompt> {
    let files = TextEncoderFiles {
        clip: files.clip_l,
        clip_tokenizer: request.files.clip_l_tokenizer.as_deref(),
        t5: files.t5,
        t5_tokenizer: request.files.tokenizer.as_deref(),
        t5_max_tokens,
    };
    encode_prompts(files, &[request.prompt.as_str()], (dtype, device))?
        .pop()
        .context("the text encoders returned no prompt")
}

/// Loads the DiT and attaches the LoRAs (several are combined into one adapter per layer).
fn load_dit_with_loras(
    (dit, variant): (&Path, FluxVariant),
    request: &GenerationRequest,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<Flux> {
    let mut model = load_dit(dit, Some(variant), dtype, device, request.fp8)?;
    session.log(format!("DiT: {variant} ({})", dit.display()));
    if let Some((lora, multiplier)) = loras_as_one(&request.loras, device, session)? {
        lora.apply(model.linears_mut(), multiplier, dtype)
            .context("the LoRA does not fit this FLUX.1 DiT (a LoRA made for another model?)")?;
    }
    Ok(model)
}

/// The request's checks before anything loads: the DiT's variant, no Wan options, the companion files, the output.
fn check_request<'a>(
    dit: &Path,
    request: &'a GenerationRequest,
) -> anyhow::Result<(FluxVariant, FluxConfig, Files<'a>)> {
    let (variant, cfg) = dit_of(dit, request.controls.len())?;
    refuse_foreign(
        &wan_options(request),
        (
            "Wan",
            "a FLUX.1 DiT makes one image from --prompt with --vae, --clip-l and --t5",
        ),
        dit,
    )?;
    let files = check_files(dit, request, &cfg)?;
    check_out(&request.out, "FLUX.1", OutKind::Png)?;
    Ok((variant, cfg, files))
}

/// The request for the models of the FLUX.1 run `config`: its DiT, autoencoder, T5-XXL and CLIP-L, its device,
/// an image written to `out_stem`.png.
pub fn run_request(config: &RunConfig, out_stem: &Path) -> GenerationRequest {
    let m = &config.model;
    let mut request = GenerationRequest::new(
        DitSource::File(m.dit.clone()),
        "",
        out_stem.with_extension("png"),
    );
    request.files.vae = given(&m.vae);
    request.files.t5 = given(&m.text_encoder);
    request.files.clip_l = given(&m.clip);
    request.placement.device = config.training.device;
    request
}

/// Generates the image `request` asks for with the FLUX.1 DiT it names.
pub fn generate(
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    let DitSource::File(dit) = &request.dit else {
        anyhow::bail!("FLUX.1 generates from a DiT file: give --dit flux1-dev.safetensors");
    };
    let (variant, cfg, files) = check_request(dit, request)?;
    let schnell = variant == FluxVariant::Schnell;
    let mut settings = FluxImageSettings {
        width: request.width.unwrap_or(DEFAULT_SIDE),
        height: request.height.unwrap_or(DEFAULT_SIDE),
        steps: request
            .steps
            .unwrap_or(if schnell { SCHNELL_STEPS } else { DEV_STEPS }),
        guidance: request.guidance.unwrap_or(DEV_GUIDANCE),
        seed: 0,
    };
    let device = open_device(one_device(&request.placement, "FLUX.1")?)?;
    let dtype = pick_dtype(request.dtype, &device)?;
    let held = hold_budget(request, &device)?;
    let ae = load_autoencoder(files.autoencoder, dtype, &device)?;
    let factor = ae.config().downsample_factor();
    let step = (2 * factor) as u32;
    let controls = control_images(&request.controls, ControlSizing::Own { step }, &device)?;
    (settings.width, settings.height) = edit_size(request, &controls, DEFAULT_SIDE)?;
    let latent = settings.latent_size(factor)?;
    let control = controls
        .first()
        .map(|c| -> anyhow::Result<Tensor> {
            Ok(ae.encode(&c.to_dtype(dtype)?)?.to_dtype(DType::F32)?)
        })
        .transpose()?;
    let t5_tokens = if schnell {
        SCHNELL_T5_TOKENS
    } else {
        DEV_T5_TOKENS
    };
    let prompt = FluxPrompt {
        control,
        ..encode_prompt(request, &files, t5_tokens, (dtype, &device))?
    };
    let dit = load_dit_with_loras((dit, variant), request, (dtype, &device), session)?;
    settings.seed = request.seed.unwrap_or_else(rand::random);
    session.log(format!(
        "seed {}, {}x{}, {} steps{}",
        settings.seed,
        settings.width,
        settings.height,
        settings.steps,
        if cfg.guidance_embed {
            format!(", guidance {}", settings.guidance)
        } else {
            String::new()
        }
    ));
    let seed = settings.seed;
    let steps = ImageSteps {
        steps: settings.steps,
        // The DiT moves in, and is dropped before the autoencoder decodes.
        denoise: move |cancelled: &dyn Fn() -> bool| {
            denoise_image(&dit, &prompt, &settings, latent, dtype, cancelled)
        },
        decode: |z: &Tensor| decode_image(&ae, z, dtype),
    };
    finish_image(request, session, (&device, held.as_ref()), steps, seed)
}
