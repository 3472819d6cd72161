//! `framesmith generate` for HunyuanVideo 1.5 on the CPU with tiny models: a tiny DiT whose text and image widths
//! are the fixtures' encoders' (the tiny Qwen2.5-VL of `hunyuan_video15_text`, the tiny glyph encoder of
//! `hunyuan_video15_byt5`, the tiny SigLIP of `siglip`) and the 4-channel VAE of `hunyuan_video15_vae/video`.

use std::path::Path;

use super::*;
use crate::family::hunyuan_video15::encoder::testkit::{dit, encoder_files, fixture, tiny_qwen};
use crate::generate::request::GenerationEvent;
use framesmith_config::run::DeviceSpec;

fn request(dir: &Path, prompt: &str) -> anyhow::Result<GenerationRequest> {
    let mut request =
        GenerationRequest::new(DitSource::File(dit(dir)?), prompt, dir.join("out/clip.mp4"));
    let [text_encoder, tokenizer, glyph] = encoder_files();
    request.files.vae = Some(fixture("hunyuan_video15_vae/video/weights.safetensors"));
    request.files.text_encoder = Some(text_encoder);
    request.files.tokenizer = Some(tokenizer);
    request.files.byt5 = Some(glyph);
    (request.width, request.height, request.frames) = (Some(32), Some(48), Some(5));
    (request.steps, request.seed) = (Some(2), Some(7));
    request.placement.device = DeviceSpec::Cpu;
    Ok(request)
}

/// Runs `request`, returning the output and the log lines and step events.
fn run(request: &GenerationRequest) -> anyhow::Result<(GenerationOutput, Vec<String>, usize)> {
    let mut lines = Vec::new();
    let mut steps = 0;
    let mut events = |e: GenerationEvent| match e {
        GenerationEvent::Log(line) => lines.push(line),
        GenerationEvent::StepStarted { .. } => steps += 1,
    };
    let mut session = Session::new(&mut events, &|| false);
    let out = generate_with(request, &mut session, &tiny_qwen)?;
    Ok((out, lines, steps))
}

#[test]
fn a_clip_is_written_with_its_frames_and_the_glyph_text_encoded() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let request = request(dir.path(), "a neon sign reading \"OPEN\" at night")?;
    let (out, lines, steps) = run(&request)?;
    assert_eq!(
        (out.frames, out.width, out.height, out.seed),
        (5, 32, 48, 7)
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
    // Two denoising steps polled, and the end.
    assert_eq!(steps, 2);
    let log = lines.join("\n");
    assert!(log.contains("glyph text") && log.contains("CFG 6"), "{log}");
    Ok(())
}

#[test]
fn the_seed_fixes_the_clip_and_the_glyph_text_changes_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let frame = |prompt: &str, name: &str| -> anyhow::Result<Vec<u8>> {
        let mut r = request(dir.path(), prompt)?;
        r.out = dir.path().join(format!("{name}.mp4"));
        r.guidance = Some(1.0);
        first_frame(&r)
    };
    let a = frame("a sign reading \"OPEN\"", "a")?;
    assert_eq!(a, frame("a sign reading \"OPEN\"", "b")?);
    assert_ne!(a, frame("a sign reading \"SHUT\"", "c")?);
    Ok(())
}

#[test]
fn missing_files_and_foreign_flags_are_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut r = request(dir.path(), "a sign reading \"OPEN\"")?;
    r.files.byt5 = None;
    let err = run(&r).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(
        err.contains("byt5_small_glyphxl_fp16") && err.contains("--byt5"),
        "{err}"
    );
    let mut r = request(dir.path(), "a fox")?;
    r.files.t5 = Some("t5xxl.safetensors".into());
    r.out = dir.path().join("clip.png");
    let err = run(&r).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("--t5"), "{err}");
    r.files.t5 = None;
    let err = run(&r).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains(".mp4"), "{err}");
    Ok(())
}

/// The first frame of the clip `request` makes (guidance off), as RGB bytes.
fn first_frame(request: &GenerationRequest) -> anyhow::Result<Vec<u8>> {
    let (out, _, _) = run(request)?;
    let first = out.frames_dir.context("frames")?.join("frame_0000.png");
    Ok(image::open(&first)
        .with_context(|| first.display().to_string())?
        .to_rgb8()
        .into_raw())
}

#[test]
fn a_start_image_with_siglip_makes_an_image_to_video_clip() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let png = dir.path().join("start.png");
    image::RgbImage::from_fn(40, 24, |x, y| {
        image::Rgb([(x * 6) as u8, (y * 10) as u8, 90])
    })
    .save(&png)?;
    let mut t2v = request(dir.path(), "a fox")?;
    t2v.guidance = Some(1.0);
    let mut i2v = t2v.clone();
    i2v.out = dir.path().join("i2v.mp4");
    i2v.image = Some(png.clone());
    i2v.files.clip = Some(fixture("siglip"));
    let (out, lines, _) = run(&i2v)?;
    assert_eq!((out.frames, out.width, out.height), (5, 32, 48));
    let log = lines.join("\n");
    assert!(
        log.contains("start image: 40x24 to 32x48, 16 SigLIP tokens"),
        "{log}"
    );
    // The start image conditions the clip: the same seed and prompt without it give another clip.
    assert_ne!(first_frame(&i2v)?, first_frame(&t2v)?);

    let mut lone = i2v.clone();
    lone.files.clip = None;
    let err = run(&lone)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("--image") && err.contains("--clip") && err.contains("sigclip_vision"),
        "{err}"
    );
    let mut lone = i2v;
    lone.image = None;
    let err = run(&lone)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("give the start image with --image"), "{err}");
    Ok(())
}
