//! HunyuanVideo 1.5's part of the generation call: one clip from a prompt (text-to-video) or from a prompt and a
//! start image (image-to-video: `--image` with the SigLIP image encoder `--clip`) with the transformer and its LoRAs,
//! Qwen2.5-VL and the byT5 glyph encoder ([`super::encoder`]) and the 3-D VAE ([`super::decode`]). Options of other
//! families are refused by flag and the files and output checked before anything loads; then the prompt (and the
//! negative prompt, "" unless `--negative` gives one, when the guidance of 6.0 runs it) is encoded and the encoders
//! dropped, the start image resized to the clip and encoded by SigLIP and the VAE (each dropped), the DiT loads (its
//! blocks streamed with `--blocks-to-swap`) and samples ([`super::pipeline`]), is dropped, and the VAE decodes the
//! clip in the official pipeline's tiles; the MP4 and its frames are written.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};
use image::RgbImage;

use super::decode::Hv15Decoder;
use super::encoder::{encode_texts, load_qwen, Hv15EncoderFiles, LoadQwen};
use super::pipeline::{
    default_shift, denoise_clip, i2v_size, Hv15Image, Hv15Prompt, Hv15Settings, DEFAULT_FRAMES,
    DEFAULT_GUIDANCE, DEFAULT_HEIGHT, DEFAULT_STEPS, DEFAULT_WIDTH, FPS,
};
use super::train::dit_config;
use crate::family::image::generate::{
    apply_loras, check_request, hold_budget, one_device, OutKind, RequestChecks,
};
use crate::family::image::plan::spread_streamed_blocks;
use crate::generate::request::{
    open_device, pick_dtype, DitSource, GenerationOutput, GenerationRequest,
};
use crate::generate::run::{timing_line, vram_use, write_clip, Session, StepClock};
use crate::generate::sampler::Solver;
use crate::prep::frames_to_video;
use framesmith_data::probe::load_rgb;
use framesmith_data::resize::resize_to_bucket;
use framesmith_models::hunyuan_video15::vae::{load_hv15_vae, Hv15Vae};
use framesmith_models::hunyuan_video15::weights::load_dit_streamed;
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;
use framesmith_models::siglip::{load_siglip, siglip_weights_file, SIGLIP_FILES};
use framesmith_nn::device::VramUse;
use framesmith_nn::offload::release_cached_memory;
use framesmith_nn::offload::OffloadOptions;

/// The flags given that a HunyuanVideo 1.5 clip does not take.
fn other_options(request: &GenerationRequest) -> Vec<&'static str> {
    let f = &request.files;
    [
        (request.dit_low_noise.is_some(), "--dit-low-noise"),
        (request.boundary.is_some(), "--boundary"),
        (!request.loras_low_noise.is_empty(), "--lora-low-noise"),
        (!request.controls.is_empty(), "--control"),
        (f.clip_l.is_some(), "--clip-l"),
        (f.t5.is_some(), "--t5"),
        (
            request.solver.is_some_and(|s| s != Solver::Euler),
            "--solver (HunyuanVideo 1.5 samples with euler)",
        ),
    ]
    .into_iter()
    .filter(|&(given, _)| given)
    .map(|(_, flag)| flag)
    .collect()
}

/// The request's checks before anything loads; returns the VAE and the text encoder's weights.
fn check_hv15_request<'a>(
    dit: &Path,
    request: &'a GenerationRequest,
) -> anyhow::Result<[&'a Path; 2]> {
    let checks = RequestChecks {
        family: "HunyuanVideo 1.5",
        foreign: other_options(request),
        refusal: (
            "HunyuanVideo 1.5",
            "it makes a clip from --prompt (and --negative) with --vae, --text-encoder and the byT5 glyph \
             encoder, and from a start image with --image and --clip",
        ),
        vae: "hunyuanvideo15_vae_fp16.safetensors",
        text_encoder: "qwen_2.5_vl_7b.safetensors",
        out: OutKind::Mp4,
    };
    check_request((dit, dit_config(dit)), request, &checks)
}

/// The start image of an image-to-video clip and the SigLIP weights file (`--image` with `--clip`), read and
/// found before anything loads; `None` for text-to-video.
fn start_image(
    dit: &Path,
    request: &GenerationRequest,
) -> anyhow::Result<Option<(RgbImage, PathBuf)>> {
    match (request.image.as_deref(), request.files.clip.as_deref()) {
        (None, None) => Ok(None),
        (Some(_), None) => anyhow::bail!(
            "--image: HunyuanVideo 1.5's image-to-video also takes the start image's SigLIP features: give the SigLIP \
             image encoder with --clip, {SIGLIP_FILES} ({})",
            dit.display()
        ),
        (None, Some(_)) => anyhow::bail!(
            "--clip is the SigLIP image encoder of image-to-video: give the start image with --image, or drop --clip \
             ({})",
            dit.display()
        ),
        (Some(path), Some(clip)) => {
            let image =
                load_rgb(path).map_err(|e| anyhow::anyhow!("--image: {}: {}", e.reason(), path.display()))?;
            let siglip = siglip_weights_file(clip).context("--clip: the SigLIP image encoder")?;
            Ok(Some((image, siglip)))
        }
    }
}

/// The clip's settings: the request's, the official defaults for the rest (for a start image `image` of
/// (width, height), the official 480p bucket of its aspect ratio when no size is given, and the I2V shift).
fn settings_of(request: &GenerationRequest, image: Option<(u32, u32)>) -> Hv15Settings {
    let (width, height) = match (request.width, request.height, image) {
        (None, None, Some((w, h))) => i2v_size(w, h),
        (w, h, _) => (w.unwrap_or(DEFAULT_WIDTH), h.unwrap_or(DEFAULT_HEIGHT)),
    };
    Hv15Settings {
        width,
        height,
        frames: request.frames.unwrap_or(DEFAULT_FRAMES),
        steps: request.steps.unwrap_or(DEFAULT_STEPS),
        guidance: request.guidance.unwrap_or(DEFAULT_GUIDANCE),
        shift: request
            .shift
            .unwrap_or_else(|| default_shift(width, height, image.is_some())),
        seed: request.seed.unwrap_or_else(rand::random),
    }
}

/// Start images as the DiT takes them, each resized and centre-cropped to its clip's size: their SigLIP features
/// (the tower loaded from `siglip` once and dropped; `siglip_key` names it in errors) and their latents × the
/// scaling factor through `vae`'s encoder, as musubi-tuner's and the official I2V sampling make them. Shared by
/// `framesmith generate --image` and the image-to-video samples during training ([`super::samples`]).
pub(super) fn encode_start_images(
    images: &[(&RgbImage, &Hv15Settings)],
    (siglip, siglip_key): (&Path, &str),
    vae: &Hv15Vae,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<Vec<Hv15Image>> {
    let frames: Vec<RgbImage> = images
        .iter()
        .map(|(image, s)| resize_to_bucket(image, (s.width as u32, s.height as u32)))
        .collect();
    let tower = load_siglip(siglip, dtype, device)
        .with_context(|| format!("{siglip_key} {}", siglip.display()))?;
    let features = frames
        .iter()
        .map(|frame| tower.encode_image(frame))
        .collect::<candle_core::Result<Vec<_>>>()?;
    drop(tower);
    let encoded = frames
        .iter()
        .zip(features)
        .map(|(frame, siglip)| -> anyhow::Result<Hv15Image> {
            let video = frames_to_video(std::slice::from_ref(frame), device)?.to_dtype(dtype)?;
            let latents = vae
                .encode(&video, None)?
                .affine(vae.config().scaling_factor, 0.0)?;
            Ok(Hv15Image { latents, siglip })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    release_cached_memory(device)?;
    Ok(encoded)
}

/// The prompt (and, when guidance runs it, the negative prompt) through Qwen2.5-VL from `load` and the glyph
/// encoder, both dropped before this returns.
fn encode_prompt(
    request: &GenerationRequest,
    (text_encoder, load): (&Path, LoadQwen<'_>),
    guided: bool,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<Hv15Prompt> {
    let mut texts = vec![request.prompt.as_str()];
    if guided {
        texts.push(request.negative.as_deref().unwrap_or(""));
    }
    let files = Hv15EncoderFiles {
        text_encoder,
        tokenizer: request.files.tokenizer.as_deref(),
        glyph: request.files.byt5.as_deref(),
    };
    let mut encoded = encode_texts(files, load, &texts, (dtype, device))?.into_iter();
    let text = encoded
        .next()
        .context("the text encoders returned no prompt")?;
    if text.glyph.is_some() {
        session.log("glyph text: the prompt's quoted text goes through byT5");
    }
    Ok(Hv15Prompt {
        text,
        negative: encoded.next(),
    })
}

/// [`encode_start_images`] of the request's start image (the VAE of `vae` loaded for it and dropped), logged.
fn start_conditioning(
    (image, siglip): (RgbImage, PathBuf),
    vae: &Path,
    settings: &Hv15Settings,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<Hv15Image> {
    let vae =
        load_hv15_vae(vae, dtype, device).with_context(|| format!("--vae {}", vae.display()))?;
    let encoded = encode_start_images(
        &[(&image, settings)],
        (&siglip, "--clip"),
        &vae,
        (dtype, device),
    )?
    .pop()
    .context("the start image was not encoded")?;
    drop(vae);
    release_cached_memory(device)?;
    session.log(format!(
        "start image: {}x{} to {}x{}, {} SigLIP tokens",
        image.width(),
        image.height(),
        settings.width,
        settings.height,
        encoded.siglip.dim(1)?
    ));
    Ok(encoded)
}

/// Loads the DiT (streaming `--blocks-to-swap` of its blocks, FP8 with `--fp8`) and applies the LoRAs.
pub(super) fn load_dit_with_loras(
    dit: &Path,
    request: &GenerationRequest,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<HunyuanVideo15Transformer> {
    let cfg = dit_config(dit)?;
    let streamed = spread_streamed_blocks(cfg.num_layers, request.blocks_to_swap);
    let mut model = load_dit_streamed(
        dit,
        (dtype, device),
        request.fp8,
        false,
        (&streamed, &OffloadOptions::default()),
    )?;
    session.log(format!(
        "DiT: HunyuanVideo 1.5 ({}), {} of {} blocks streamed",
        dit.display(),
        streamed.len(),
        cfg.num_layers
    ));
    apply_loras(
        &mut model,
        request,
        (dtype, device),
        session,
        "HunyuanVideo 1.5",
    )?;
    Ok(model)
}

/// Generates the clip `request` asks for with the HunyuanVideo 1.5 DiT it names.
pub fn generate(
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    generate_with(request, session, &load_qwen)
}

/// [`generate`] with Qwen2.5-VL from `load`.
pub(crate) fn generate_with(
    request: &GenerationRequest,
    session: &mut Session,
    load: LoadQwen<'_>,
) -> anyhow::Result<GenerationOutput> {
    let DitSource::File(dit) = &request.dit else {
        anyhow::bail!(
            "HunyuanVideo 1.5 generates from a DiT file: give --dit with its transformer"
        );
    };
    let [vae_path, text_encoder] = check_hv15_request(dit, request)?;
    let start = start_image(dit, request)?;
    let settings = settings_of(request, start.as_ref().map(|(image, _)| image.dimensions()));
    let latent = settings.latent_shape(["--width", "--height", "--frames", "--steps"])?;
    let device = open_device(one_device(&request.placement, "HunyuanVideo 1.5")?)?;
    let dtype = pick_dtype(request.dtype, &device)?;
    let held = hold_budget(request, &device)?;
    let guided = settings.guidance > 1.0;
    let prompt = encode_prompt(
        request,
        (text_encoder, load),
        guided,
        (dtype, &device),
        session,
    )?;
    let image = start
        .map(|start| start_conditioning(start, vae_path, &settings, (dtype, &device), session))
        .transpose()?;
    let model = load_dit_with_loras(dit, request, (dtype, &device), session)?;
    session.log(format!(
        "seed {}, {}x{}, {} frames, {} steps, shift {}{}",
        settings.seed,
        settings.width,
        settings.height,
        settings.frames,
        settings.steps,
        settings.shift,
        if guided {
            format!(", CFG {}", settings.guidance)
        } else {
            String::new()
        }
    ));
    let clock = StepClock::new(session, vec![device.clone()], settings.steps);
    let latents = clock.checked(denoise_clip(
        &model,
        (&prompt, image.as_ref()),
        &settings,
        (latent, dtype, &device),
        &|| clock.poll(),
    ))?;
    let starts = clock.finish()?;
    drop(model);
    release_cached_memory(&device)?;
    let card = request
        .vram_budget_bytes
        .unwrap_or_else(|| VramUse::measure(&device, 0).map_or(u64::MAX, |u| u.free + u.reserved));
    let decoder = Hv15Decoder::load(vae_path, (dtype, &device), card)
        .with_context(|| format!("--vae {}", vae_path.display()))?;
    let decode_start = Instant::now();
    let frames = decoder.decode(&latents)?;
    let decode_secs = decode_start.elapsed().as_secs_f64();
    let vram: Vec<_> = vram_use(&device, held.as_ref()).into_iter().collect();
    session.log(timing_line(&starts, decode_secs, &vram));
    let frames_dir = write_clip(&request.out, &frames, FPS)?;
    Ok(GenerationOutput {
        file: request.out.clone(),
        frames_dir: Some(frames_dir),
        frames: frames.len(),
        width: settings.width,
        height: settings.height,
        seed: settings.seed,
    })
}

#[cfg(test)]
mod tests;
