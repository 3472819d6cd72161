//! LTX-2's part of the generation call: one clip from a prompt (and with `--image` its first frame) with the
//! transformer and its LoRAs, Gemma 3 with the checkpoint's feature extractor and connectors ([`super::encoder`]),
//! the video VAE ([`super::decode`]) and, for sound, the audio VAE's decoder and the vocoder ([`super::sound`]). The official checkpoint holds the transformer, the connector and the VAE: `--dit` alone
//! names them, `--vae` another file holding the VAE (and the connector, when the `--dit` file is the transformer
//! alone). Options of other families are refused by flag, and the files, sizes (multiples of the VAE's spatial
//! factor, 8k + 1 frames) and output checked, before a device opens; then the prompt (and the negative prompt,
//! ltx-pipelines' default unless `--negative` gives one, when the guidance of 3.0 runs it) is encoded and Gemma
//! dropped, the DiT loads (its blocks streamed with `--blocks-to-swap`) and samples ([`super::pipeline`]: 40 steps
//! for LTX-2, 30 for LTX-2.3, a distilled checkpoint's eight), is dropped, and the VAE decodes the clip; the MP4
//! and its frames are written. Sound, as ltx-pipelines makes it with every clip: by default when the files hold
//! what it needs (the audio connector, and the audio VAE's decoder and vocoder in `--vae` or `--dit`), required by
//! `--sound` (refused, naming the files, when they do not), left out by `--no-sound`; with sound the DiT's audio
//! stream loads too, both streams are denoised jointly ([`super::denoise`]) and the sound is muxed into the MP4.
//! `--image` (read before anything loads) is resized and centre-cropped to the clip, encoded by the video VAE as
//! the first latent frame and kept clean through denoising (image-to-video).

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};

use super::decode::{Ltx2Clip, Ltx2Decoder};
use super::denoise::{
    audio_latent_frames, denoise_clip, ClipLatents, ClipStart, Ltx2Context, Ltx2Prompt,
    AUDIO_GUIDANCE,
};
use super::encoder::{encode_texts_for, load_gemma, LoadGemma, Ltx2EncoderFiles};
use super::items::context_width;
use super::pipeline::{
    default_steps, Ltx2Settings, Schedule, DEFAULT_FRAMES, DEFAULT_GUIDANCE, DEFAULT_HEIGHT,
    DEFAULT_WIDTH, DISTILLED_SIGMAS, FPS, PIPELINE_NEGATIVE,
};
use super::samples::first_frame;
use super::sound::{muxer, sound_file, Ltx2SoundDecoder};
use super::train::dit_config;
use crate::family::image::generate::{check_out, hold_budget, one_device, refuse_foreign, OutKind};
use crate::family::image::plan::spread_streamed_blocks;
use crate::generate::request::{
    open_device, pick_dtype, DitSource, GenerationOutput, GenerationRequest,
};
use crate::generate::run::{loras_as_one, timing_line, vram_use, Session, StepClock};
use crate::generate::sampler::Solver;
use framesmith_data::probe::load_rgb;
use framesmith_models::ltx2::text::TextParts;
use framesmith_models::ltx2::vae::identify_vae;
use framesmith_models::ltx2::weights::load_streamed_av;
use framesmith_models::ltx2::{Ltx2Config, Ltx2Transformer};
use framesmith_nn::offload::{release_cached_memory, OffloadOptions};
use image::RgbImage;

/// The flags given that an LTX-2 clip does not take.
fn other_options(request: &GenerationRequest) -> Vec<&'static str> {
    let f = &request.files;
    [
        (request.dit_low_noise.is_some(), "--dit-low-noise"),
        (request.boundary.is_some(), "--boundary"),
        (!request.loras_low_noise.is_empty(), "--lora-low-noise"),
        (!request.controls.is_empty(), "--control"),
        (f.clip.is_some(), "--clip"),
        (f.clip_l.is_some(), "--clip-l"),
        (f.t5.is_some(), "--t5"),
        (f.byt5.is_some(), "--byt5"),
        (
            request.shift.is_some(),
            "--shift (LTX-2's scheduler shifts by itself)",
        ),
        (
            request.solver.is_some_and(|s| s != Solver::Euler),
            "--solver (LTX-2 samples with euler)",
        ),
    ]
    .into_iter()
    .filter(|&(given, _)| given)
    .map(|(_, flag)| flag)
    .collect()
}

/// What a request is checked into before anything loads.
struct Checked<'a> {
    cfg: Ltx2Config,
    text_encoder: &'a Path,
    /// The file of the VAE, and the one holding the connector.
    vae: &'a Path,
    connector: &'a Path,
    settings: Ltx2Settings,
    latent: [usize; 3],
    /// The `--image` start image, read.
    image: Option<RgbImage>,
    /// The file holding the audio VAE's decoder and the vocoder, for sound.
    sound: Option<&'a Path>,
}

/// The file holding the text connector: the DiT's, else `--vae`'s.
fn connector_file<'a>(
    dit: &'a Path,
    vae: Option<&'a Path>,
) -> anyhow::Result<(&'a Path, TextParts)> {
    match TextParts::open(dit) {
        Ok(parts) => Ok((dit, parts)),
        Err(on_dit) => match vae.map(|v| (v, TextParts::open(v))) {
            Some((v, Ok(parts))) => Ok((v, parts)),
            _ => Err(anyhow::anyhow!(
                "--dit: {on_dit} (or give it with --vae, a file holding the VAE and the connector)"
            )),
        },
    }
}

/// The request's checks before a device opens: the DiT readable, other families' flags refused, Gemma given, the
/// VAE and the connector found, `--out` an MP4 and the clip's size one the VAE makes.
fn check_ltx2_request<'a>(
    dit: &'a Path,
    request: &'a GenerationRequest,
) -> anyhow::Result<Checked<'a>> {
    let cfg = dit_config(dit).map_err(|e| {
        anyhow::anyhow!("--dit{}", format!("{e:#}").trim_start_matches("model.dit"))
    })?;
    let takes = "it makes a clip (with sound) from --prompt (and --negative, and --image for its first frame) with \
                 --text-encoder (Gemma 3) and the VAEs, vocoder and text connectors of its checkpoint (--vae for \
                 another file)";
    refuse_foreign(&other_options(request), ("LTX-2", takes), dit)?;
    let text_encoder = request.files.text_encoder.as_deref().with_context(|| {
        format!(
            "an LTX-2 DiT needs its text encoder, Gemma 3 12B: --text-encoder gemma_3_12B_it.safetensors (or \
             the google/gemma-3-12b-it folder) ({})",
            dit.display()
        )
    })?;
    let vae = request.files.vae.as_deref().unwrap_or(dit);
    let vae_file = identify_vae(vae).map_err(|e| {
        let hint = if request.files.vae.is_none() {
            " (the DiT file holds no VAE: give the official checkpoint with --vae)"
        } else {
            ""
        };
        anyhow::anyhow!("--vae: {e}{hint}")
    })?;
    let (connector, parts) = connector_file(dit, request.files.vae.as_deref())?;
    let width = parts.config.output_width();
    if width != context_width(&cfg) {
        anyhow::bail!(
            "the text connector of {} gives {width}-wide text, but this {} takes {} (a connector of the other \
             release?): give the checkpoint matching --dit",
            connector.display(),
            cfg.version().name(),
            context_width(&cfg)
        );
    }
    check_out(&request.out, "LTX-2", OutKind::Mp4)?;
    let image = request
        .image
        .as_deref()
        .map(|path| {
            load_rgb(path).map_err(|e| {
                anyhow::anyhow!(
                    "--image: {}: {}; give a PNG, JPEG, WebP or BMP image",
                    e.reason(),
                    path.display()
                )
            })
        })
        .transpose()?;
    let sound = sound_of(request, (dit, &cfg), &parts, connector)?;
    let settings = settings_of(
        request,
        &cfg,
        (Schedule::of_checkpoint(dit), sound.is_some()),
    );
    let latent = settings.latent_shape(
        vae_file.config.decoder_factors(),
        ["--width", "--height", "--frames", "--steps"],
    )?;
    Ok(Checked {
        cfg,
        text_encoder,
        vae,
        connector,
        settings,
        latent,
        image,
        sound,
    })
}

/// The file holding the audio VAE's decoder and the vocoder when the clip gets sound: `--no-sound` none,
/// `--sound` one or a refusal naming what is missing, by default one when the files hold everything sound needs and
/// ffmpeg is there to mux it.
fn sound_of<'a>(
    request: &'a GenerationRequest,
    (dit, cfg): (&'a Path, &Ltx2Config),
    parts: &TextParts,
    connector: &Path,
) -> anyhow::Result<Option<&'a Path>> {
    let candidates: Vec<&Path> = request
        .files
        .vae
        .as_deref()
        .into_iter()
        .chain([dit])
        .collect();
    let found = || sound_file(&candidates, cfg.audio_in_channels, "--dit (or --vae)");
    match request.sound {
        Some(false) => Ok(None),
        Some(true) if !parts.has_audio() => anyhow::bail!(
            "--sound: {} holds no audio text connector (`audio_embeddings_connector.*`); give the official \
             ltx-2-19b-* or ltx-2.3-22b-* checkpoint with --dit (or --vae), or drop --sound",
            connector.display()
        ),
        Some(true) => {
            let file = found()?;
            muxer().context("--sound")?;
            Ok(Some(file))
        }
        None if parts.has_audio() && muxer().is_ok() => Ok(found().ok()),
        None => Ok(None),
    }
}

/// The clip's settings: the request's, the official defaults for the rest.
fn settings_of(
    request: &GenerationRequest,
    cfg: &Ltx2Config,
    (schedule, sound): (Schedule, bool),
) -> Ltx2Settings {
    let steps = match schedule {
        Schedule::Scheduler => request
            .steps
            .unwrap_or_else(|| default_steps(cfg.version())),
        Schedule::Distilled => DISTILLED_SIGMAS.len() - 1,
    };
    Ltx2Settings {
        width: request.width.unwrap_or(DEFAULT_WIDTH),
        height: request.height.unwrap_or(DEFAULT_HEIGHT),
        frames: request.frames.unwrap_or(DEFAULT_FRAMES),
        steps,
        guidance: request.guidance.unwrap_or(DEFAULT_GUIDANCE),
        seed: request.seed.unwrap_or_else(rand::random),
        schedule,
        sound,
    }
}

/// The prompt (and, when guidance runs it, the negative prompt) through Gemma 3 from `load` and the connectors of
/// `connector` (the audio one too for sound), Gemma dropped before this returns.
fn encode_prompt(
    request: &GenerationRequest,
    (files, load): (Ltx2EncoderFiles<'_>, LoadGemma<'_>),
    settings: &Ltx2Settings,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<Ltx2Prompt> {
    let mut texts = vec![request.prompt.as_str()];
    if settings.guided() {
        texts.push(request.negative.as_deref().unwrap_or(PIPELINE_NEGATIVE));
    }
    let mut lines = Vec::new();
    let encoded = encode_texts_for(
        files,
        load,
        (&texts, settings.sound),
        (dtype, device),
        &mut |l: &str| lines.push(l.to_owned()),
    )?;
    for line in lines {
        session.log(line);
    }
    let mut encoded = encoded.into_iter().map(|t| Ltx2Context {
        video: t.embeds,
        audio: t.audio_embeds,
    });
    Ok(Ltx2Prompt {
        text: encoded.next().context("Gemma 3 returned no prompt")?,
        negative: encoded.next(),
    })
}

/// Loads the DiT's video stream, and its audio stream for `sound` (streaming `--blocks-to-swap` of its blocks, FP8
/// with `--fp8`), and applies the LoRAs.
fn load_dit_with_loras(
    dit: &Path,
    (cfg, request, sound): (&Ltx2Config, &GenerationRequest, bool),
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<Ltx2Transformer> {
    let streamed = spread_streamed_blocks(cfg.num_layers, request.blocks_to_swap);
    let (_, mut model) = load_streamed_av(
        dit,
        (dtype, device),
        (request.fp8, false),
        (&streamed, &OffloadOptions::default()),
        sound,
    )?;
    session.log(format!(
        "DiT: {} ({}), {}, {} of {} blocks streamed",
        cfg.version().name(),
        dit.display(),
        if sound {
            "video and audio streams"
        } else {
            "video stream"
        },
        streamed.len(),
        cfg.num_layers
    ));
    if let Some((lora, multiplier)) = loras_as_one(&request.loras, device, session)? {
        lora.apply(model.linears_mut(), multiplier, dtype)
            .context("the LoRA does not fit this LTX-2 DiT (a LoRA made for another model?)")?;
    }
    Ok(model)
}

/// Where the clip starts: its latent, the `--image` encoded by the VAE (loaded for it and dropped) as the first
/// latent frame, the audio frames for sound.
fn clip_start(
    c: &Checked<'_>,
    (dtype, device): (DType, &Device),
    session: &mut Session,
) -> anyhow::Result<ClipStart> {
    let settings = &c.settings;
    let first_frame = match &c.image {
        Some(image) => {
            let encoder = Ltx2Decoder::load(c.vae, (dtype, device))
                .with_context(|| format!("--vae {}", c.vae.display()))?;
            let latents = first_frame(&encoder, image, settings)?;
            drop(encoder);
            release_cached_memory(device)?;
            session.log("start image encoded as the first latent frame".to_string());
            Some(latents)
        }
        None => None,
    };
    Ok(ClipStart {
        latent: c.latent,
        first_frame,
        audio_frames: settings
            .sound
            .then(|| audio_latent_frames(settings.frames, FPS)),
    })
}

/// The log line of what is sampled.
fn settings_line(settings: &Ltx2Settings) -> String {
    format!(
        "seed {}, {}x{}, {} frames, {} steps ({}){}",
        settings.seed,
        settings.width,
        settings.height,
        settings.frames,
        settings.sigmas().len() - 1,
        match settings.schedule {
            Schedule::Scheduler => "LTX2Scheduler",
            Schedule::Distilled => "distilled sigmas",
        },
        match (settings.guided(), settings.sound) {
            (true, true) => format!(
                ", CFG {} (audio {AUDIO_GUIDANCE}) with rescale, with sound",
                settings.guidance
            ),
            (true, false) => format!(", CFG {} with rescale", settings.guidance),
            (false, true) => ", with sound".to_string(),
            (false, false) => String::new(),
        }
    )
}

/// The clip of `latents`: the video decoded by the VAE, then the sound by the audio VAE and vocoder (each loaded
/// for it and dropped).
fn decode_clip(
    c: &Checked<'_>,
    latents: &ClipLatents,
    (dtype, device): (DType, &Device),
) -> anyhow::Result<Ltx2Clip> {
    let decoder = Ltx2Decoder::load(c.vae, (dtype, device))
        .with_context(|| format!("--vae {}", c.vae.display()))?;
    let frames = decoder.decode(&latents.video, c.settings.seed)?;
    drop(decoder);
    let sound = match (c.sound, &latents.audio) {
        (Some(path), Some(tokens)) => {
            let sound = Ltx2SoundDecoder::load(path, dtype, device)
                .with_context(|| format!("the audio VAE and vocoder of {}", path.display()))?;
            Some(sound.decode_tokens(tokens)?)
        }
        _ => None,
    };
    Ok(Ltx2Clip {
        frames,
        fps: FPS,
        sound,
    })
}

/// Generates the clip `request` asks for with the LTX-2 DiT it names.
pub fn generate(
    request: &GenerationRequest,
    session: &mut Session,
) -> anyhow::Result<GenerationOutput> {
    generate_with(request, session, &load_gemma)
}

/// [`generate`] with Gemma 3 from `load`.
pub(crate) fn generate_with(
    request: &GenerationRequest,
    session: &mut Session,
    load: LoadGemma<'_>,
) -> anyhow::Result<GenerationOutput> {
    let DitSource::File(dit) = &request.dit else {
        anyhow::bail!("LTX-2 generates from a checkpoint file: give --dit");
    };
    let c = check_ltx2_request(dit, request)?;
    let settings = &c.settings;
    let device = open_device(one_device(&request.placement, "LTX-2")?)?;
    let dtype = pick_dtype(request.dtype, &device)?;
    let held = hold_budget(request, &device)?;
    let files = Ltx2EncoderFiles {
        text_encoder: c.text_encoder,
        tokenizer: request.files.tokenizer.as_deref(),
        dit: c.connector,
    };
    let prompt = encode_prompt(request, (files, load), settings, (dtype, &device), session)?;
    let start = clip_start(&c, (dtype, &device), session)?;
    let model = load_dit_with_loras(
        dit,
        (&c.cfg, request, settings.sound),
        (dtype, &device),
        session,
    )?;
    session.log(settings_line(settings));
    let clock = StepClock::new(session, vec![device.clone()], settings.sigmas().len() - 1);
    let latents = clock.checked(denoise_clip(
        &model,
        &prompt,
        settings,
        (&start, dtype, &device),
        &|| clock.poll(),
    ))?;
    let starts = clock.finish()?;
    drop(model);
    release_cached_memory(&device)?;
    let decode_start = Instant::now();
    let clip = decode_clip(&c, &latents, (dtype, &device))?;
    let decode_secs = decode_start.elapsed().as_secs_f64();
    let vram: Vec<_> = vram_use(&device, held.as_ref()).into_iter().collect();
    session.log(timing_line(&starts, decode_secs, &vram));
    let frames_dir = clip.write(&request.out)?;
    Ok(GenerationOutput {
        file: request.out.clone(),
        frames_dir: Some(frames_dir),
        frames: clip.frames.len(),
        width: settings.width,
        height: settings.height,
        seed: settings.seed,
    })
}

#[cfg(test)]
pub(crate) mod tests;
