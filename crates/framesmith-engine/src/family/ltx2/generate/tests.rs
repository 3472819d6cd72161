//! `framesmith generate` for LTX-2 on the CPU with the tiny checkpoint (`testkit::tiny_checkpoint`: the
//! transformer, the text fixture's connector and the VAE fixture's timestep-conditioned video VAE in one file) and
//! the text fixture's Gemma 3: a clip is written with its frames, the seed fixes it, and what is wrong with a
//! request (sizes, files, flags) is refused before a device opens.

use std::path::Path;

use super::*;
use crate::family::ltx2::testkit::{text_case_dir, tiny_checkpoint, tiny_gemma};
use crate::generate::request::GenerationEvent;
use framesmith_config::run::DeviceSpec;

pub(crate) fn request(dir: &Path, prompt: &str) -> anyhow::Result<GenerationRequest> {
    let dit = tiny_checkpoint(&dir.join("ckpt"))?;
    let mut request =
        GenerationRequest::new(DitSource::File(dit), prompt, dir.join("out/clip.mp4"));
    request.files.text_encoder = Some(text_case_dir().join("gemma_3_12B_it.safetensors"));
    // The VAE fixture compresses 4× in space and time: 5 frames of 24×16 are latents [2, 4, 6].
    (request.width, request.height, request.frames) = (Some(24), Some(16), Some(5));
    (request.steps, request.seed) = (Some(2), Some(7));
    request.placement.device = DeviceSpec::Cpu;
    Ok(request)
}

/// Runs `request`, returning the output and the log lines and step events.
pub(crate) fn run(
    request: &GenerationRequest,
) -> anyhow::Result<(GenerationOutput, Vec<String>, usize)> {
    let mut lines = Vec::new();
    let mut steps = 0;
    let mut events = |e: GenerationEvent| match e {
        GenerationEvent::Log(line) => lines.push(line),
        GenerationEvent::StepStarted { .. } => steps += 1,
    };
    let mut session = Session::new(&mut events, &|| false);
    let out = generate_with(request, &mut session, &tiny_gemma)?;
    Ok((out, lines, steps))
}

/// The first frame of the clip `request` makes, as RGB bytes.
pub(crate) fn first_frame(request: &GenerationRequest) -> anyhow::Result<Vec<u8>> {
    let (out, _, _) = run(request)?;
    let first = out.frames_dir.context("frames")?.join("frame_0000.png");
    Ok(image::open(&first)
        .with_context(|| first.display().to_string())?
        .to_rgb8()
        .into_raw())
}

#[test]
fn a_clip_is_written_with_its_frames_guided_by_the_negative_prompt() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let request = request(dir.path(), "a red fox runs through deep snow")?;
    let (out, lines, steps) = run(&request)?;
    assert_eq!(
        (out.frames, out.width, out.height, out.seed),
        (5, 24, 16, 7)
    );
    assert!(out.file.is_file() && std::fs::metadata(&out.file)?.len() > 0);
    let frames_dir = out.frames_dir.context("a clip has its frames")?;
    let pngs = std::fs::read_dir(&frames_dir)?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png"))
        })
        .count();
    assert_eq!(pngs, 5);
    assert_eq!(steps, 2);
    let log = lines.join("\n");
    assert!(
        log.contains("2 steps (LTX2Scheduler), CFG 3 with rescale") && log.contains("Gemma 3"),
        "{log}"
    );
    Ok(())
}

#[test]
fn the_seed_and_the_prompt_fix_the_clip() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let frame = |prompt: &str, seed: u64, name: &str| -> anyhow::Result<Vec<u8>> {
        let mut r = request(dir.path(), prompt)?;
        r.out = dir.path().join(format!("{name}.mp4"));
        r.seed = Some(seed);
        first_frame(&r)
    };
    let a = frame("a red fox", 3, "a")?;
    assert_eq!(a, frame("a red fox", 3, "b")?);
    assert_ne!(a, frame("a red fox", 4, "c")?);
    assert_ne!(a, frame("neon city street at night", 3, "d")?);
    Ok(())
}

/// The error of `request`, which must fail.
fn error(request: &GenerationRequest) -> String {
    run(request)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default()
}

#[test]
fn bad_sizes_files_and_flags_are_refused_before_a_device_opens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut base = request(dir.path(), "a fox")?;
    // A CUDA device cannot open here: each refusal below comes before it is asked for.
    base.placement.device = DeviceSpec::Cuda(0);
    let mut r = base.clone();
    r.width = Some(26);
    let err = error(&r);
    assert!(
        err.contains("--width 26") && err.contains("multiples of 4") && err.contains("24 or 28"),
        "{err}"
    );
    let mut r = base.clone();
    r.frames = Some(6);
    let err = error(&r);
    assert!(
        err.contains("--frames 6") && err.contains("4k + 1"),
        "{err}"
    );
    let mut r = base.clone();
    r.files.text_encoder = None;
    assert!(
        error(&r).contains("--text-encoder gemma_3_12B_it"),
        "{}",
        error(&r)
    );
    let mut r = base.clone();
    r.files.t5 = Some("t5xxl.safetensors".into());
    r.shift = Some(5.0);
    let err = error(&r);
    assert!(err.contains("--t5") && err.contains("--shift"), "{err}");
    let mut r = base.clone();
    r.out = dir.path().join("clip.png");
    assert!(error(&r).contains(".mp4"), "{}", error(&r));
    // A transformer-only file: the VAE and the connector are asked for.
    let mut r = base;
    r.dit = DitSource::File(crate::family::ltx2::testkit::tiny_dit(
        &dir.path().join("bare"),
    )?);
    let err = error(&r);
    assert!(
        err.contains("--vae") && err.contains("no LTX-2 video VAE"),
        "{err}"
    );
    Ok(())
}

/// A start image written as a PNG in `dir`.
fn start_image(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join("start.png");
    let image = image::RgbImage::from_fn(40, 30, |x, y| {
        image::Rgb([(x * 6) as u8, (y * 8) as u8, 90])
    });
    image.save(&path)?;
    Ok(path)
}

#[test]
fn an_audio_video_checkpoint_makes_sound_by_default_and_an_image_starts_the_clip(
) -> anyhow::Result<()> {
    let tools = match crate::family::ltx2::sound::muxer() {
        Ok(tools) => tools,
        Err(e) => {
            eprintln!("skipped: sound by default needs ffmpeg to mux it ({e:#})");
            return Ok(());
        }
    };
    let dir = tempfile::tempdir()?;
    let mut r = request(dir.path(), "a dog barks in the rain")?;
    r.dit = DitSource::File(crate::family::ltx2::testkit::tiny_checkpoint_av(
        &dir.path().join("av"),
    )?);
    r.frames = Some(9);
    let (out, lines, _) = run(&r)?;
    let log = lines.join("\n");
    assert!(
        log.contains("video and audio streams")
            && log.contains("(audio 7) with rescale, with sound"),
        "{log}"
    );
    assert_eq!(tools.audio_channels(&out.file)?, Some(2));
    // --no-sound: video only.
    r.sound = Some(false);
    r.out = dir.path().join("silent.mp4");
    let (out, lines, _) = run(&r)?;
    assert!(
        lines.iter().any(|l| l.contains(", video stream,")),
        "{lines:?}"
    );
    assert_eq!(tools.audio_channels(&out.file)?, None);
    // --image: the clip starts from the image, so its first frame differs from the text-to-video clip's.
    let plain = first_frame(&r)?;
    r.image = Some(start_image(dir.path())?);
    r.out = dir.path().join("i2v.mp4");
    let (_, lines, _) = run(&r)?;
    assert!(
        lines.iter().any(|l| l.contains("start image encoded")),
        "{lines:?}"
    );
    assert_ne!(plain, first_frame(&r)?);
    Ok(())
}

#[test]
fn sound_and_images_that_cannot_be_had_are_refused_before_a_device_opens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut base = request(dir.path(), "a fox")?;
    base.placement.device = DeviceSpec::Cuda(0);
    // The video-only checkpoint has no audio connector: --sound is refused naming it; by default no sound.
    let mut r = base.clone();
    r.sound = Some(true);
    let err = error(&r);
    assert!(
        err.contains("--sound")
            && err.contains("audio text connector")
            && err.contains("ltx-2.3-tiny-dev"),
        "{err}"
    );
    let mut r = base;
    r.image = Some(dir.path().join("missing.png"));
    let err = error(&r);
    assert!(
        err.contains("--image") && err.contains("missing.png"),
        "{err}"
    );
    // An audio-video transformer file alone, with --vae the checkpoint holding the audio VAE, vocoder and
    // connectors: sound is found there, so the request gets as far as the device (or ffmpeg's check).
    let mut r = request(dir.path(), "a fox")?;
    r.placement.device = DeviceSpec::Cuda(0);
    r.sound = Some(true);
    let av = crate::family::ltx2::testkit::tiny_checkpoint_av(&dir.path().join("av"))?;
    let bare = crate::family::ltx2::testkit::tiny_dit_with(&dir.path().join("bare"), true)?;
    r.dit = DitSource::File(bare.clone());
    r.files.vae = Some(av);
    let err = error(&r);
    assert!(
        !err.is_empty()
            && !err.contains("audio text connector")
            && !err.contains("sound needs LTX-2's audio VAE"),
        "{err}"
    );
    Ok(())
}
