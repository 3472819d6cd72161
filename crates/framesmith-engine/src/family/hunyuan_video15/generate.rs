//! HunyuanVideo 1.5's part of the generation call: one text-to-video clip from a prompt with the transformer and its
//! LoRAs, Qwen2.5-VL and the byT5 glyph encoder ([`super::encoder`]) and the 3-D VAE ([`super::decode`]). Options
//! of other families are refused by flag and the output checked before anything loads; then the prompt (and the
//! negative prompt, "" unless `--negative` gives one, when the guidance of 6.0 runs it) is encoded and the encoders
//! dropped, the DiT loads (its blocks streamed with `--blocks-to-swap`) and samples ([`super::pipeline`]), is
//! dropped, and the VAE decodes the clip in the official pipeline's tiles; the MP4 and its frames are written.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};

use super::decode::Hv15Decoder;
use super::encoder::{encode_texts, load_qwen, Hv15EncoderFiles, LoadQwen};
use super::pipeline::{
    default_shift, denoise_clip, Hv15Prompt, Hv15Settings, DEFAULT_FRAMES, DEFAULT_GUIDANCE,
    DEFAULT_HEIGHT, DEFAULT_STEPS, DEFAULT_WIDTH, FPS,
};
use super::train::dit_config;
use crate::family::image::generate::{hold_budget, one_device, refuse_foreign};
use crate::family::image::plan::spread_streamed_blocks;
use crate::generate::request::{
    create_out_folder, open_device, pick_dtype, DitSource, GenerationOutput, GenerationRequest,
};
use crate::generate::run::{loras_as_one, timing_line, vram_use, write_clip, Session, StepClock};
use crate::generate::sampler::Solver;
use framesmith_models::hunyuan_video15::weights::load_dit_streamed;
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;
use framesmith_nn::device::VramUse;
use framesmith_nn::offload::OffloadOptions;

/// The flags given that a HunyuanVideo 1.5 text-to-video clip does not take.
fn other_options(request: &GenerationRequest) -> Vec<&'static str> {
    let f = &request.files;
    [
        (request.dit_low_noise.is_some(), "--dit-low-noise"),
        (request.boundary.is_some(), "--boundary"),
        (!request.loras_low_noise.is_empty(), "--lora-low-noise"),
        (
            request.image.is_some(),
            "--image (image-to-video is not wired yet)",
        ),
        (!request.controls.is_empty(), "--control"),
        (f.clip.is_some(), "--clip"),
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
fn check_request<'a>(dit: &Path, request: &'a GenerationRequest) -> anyhow::Result<[&'a Path; 2]> {
    dit_config(dit).map_err(|e| {
        anyhow::anyhow!("--dit{}", format!("{e:#}").trim_start_matches("model.dit"))
    })?;
    refuse_foreign(
        &other_options(request),
        (
            "HunyuanVideo 1.5",
            "it makes a clip from --prompt (and --negative) with --vae, --text-encoder and the byT5 glyph encoder",
        ),
        dit,
    )?;
    let f = &request.files;
    let Some(vae) = f.vae.as_deref() else {
        anyhow::bail!(
            "a HunyuanVideo 1.5 DiT needs its VAE: --vae hunyuanvideo15_vae_fp16.safetensors ({})",
            dit.display()
        );
    };
    let Some(text_encoder) = f.text_encoder.as_deref() else {
        anyhow::bail!(
            "a HunyuanVideo 1.5 DiT needs its text encoder: --text-encoder qwen_2.5_vl_7b.safetensors ({})",
            dit.display()
        );
    };
    let mp4 = request
        .out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("mp4"));
    if !mp4 {
        anyhow::bail!(
            "--out: HunyuanVideo 1.5 makes a clip, written as MP4: give a path ending in .mp4 ({})",
            request.out.display()
        );
    }
    create_out_folder(&request.out)?;
    Ok([vae, text_encoder])
}

/// The clip's settings: the request's, the official defaults for the rest.
fn settings_of(request: &GenerationRequest) -> Hv15Settings {
    let width = request.width.unwrap_or(DEFAULT_WIDTH);
    let height = request.height.unwrap_or(DEFAULT_HEIGHT);
    Hv15Settings {
        width,
        height,
        frames: request.frames.unwrap_or(DEFAULT_FRAMES),
        steps: request.steps.unwrap_or(DEFAULT_STEPS),
        guidance: request.guidance.unwrap_or(DEFAULT_GUIDANCE),
        shift: request
            .shift
            .unwrap_or_else(|| default_shift(width, height)),
        seed: request.seed.unwrap_or_else(rand::random),
    }
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
    if let Some((lora, multiplier)) = loras_as_one(&request.loras, device, session)? {
        lora.apply(model.linears_mut(), multiplier, dtype).context(
            "the LoRA does not fit this HunyuanVideo 1.5 DiT (a LoRA made for another model?)",
        )?;
    }
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
    let [vae_path, text_encoder] = check_request(dit, request)?;
    let settings = settings_of(request);
    let latent = settings.latent_shape(["--width", "--height", "--frames", "--steps"])?;
    let device = open_device(one_device(&request.placement, "HunyuanVideo 1.5")?)?;
    let dtype = pick_dtype(request.dtype, &device)?;
    let held = hold_budget(request, &device)?;
    let guided = settings.guidance > 1.0;
    let mut texts = vec![request.prompt.as_str()];
    if guided {
        texts.push(request.negative.as_deref().unwrap_or(""));
    }
    let files = Hv15EncoderFiles {
        text_encoder,
        tokenizer: request.files.tokenizer.as_deref(),
        glyph: request.files.byt5.as_deref(),
    };
    let mut encoded = encode_texts(files, load, &texts, (dtype, &device))?.into_iter();
    let text = encoded
        .next()
        .context("the text encoders returned no prompt")?;
    if text.glyph.is_some() {
        session.log("glyph text: the prompt's quoted text goes through byT5");
    }
    let prompt = Hv15Prompt {
        text,
        negative: encoded.next(),
    };
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
        &prompt,
        &settings,
        (latent, dtype, &device),
        &|| clock.poll(),
    ))?;
    let starts = clock.finish()?;
    drop(model);
    framesmith_nn::offload::release_cached_memory(&device)?;
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
