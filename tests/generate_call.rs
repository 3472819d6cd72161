//! `framesmith generate` and the engine's generation call (`framesmith_engine::generate::run`, what the app
//! generates through) on the same request write the same bytes: a Wan clip with a LoRA from the tiny fixture DiT,
//! umT5 and VAE, and a FLUX.1 image from the tiny FLUX.1 fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing

mod cli_support;
use std::path::{Path, PathBuf};

use cli_support::{fixture, framesmith, s, write_lora};
use framesmith_config::run::DeviceSpec;
use framesmith_engine::generate::request::{
    CompanionFiles, DitSource, GenerationEvent, GenerationOutput, GenerationRequest, LoraChoice,
};

/// The engine's call on `request`, with the events it reported.
fn engine(request: &GenerationRequest) -> (GenerationOutput, Vec<GenerationEvent>) {
    let mut events = Vec::new();
    let output = framesmith_engine::generate::run(request, &mut |e| events.push(e), &|| false)
        .unwrap_or_else(|e| panic!("{e:#}"));
    (output, events)
}

/// Every file of a clip (the MP4 and its frames) or the image, by name relative to `out`'s folder.
fn written(out: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![(String::new(), std::fs::read(out).expect("output written"))];
    let stem = out.file_stem().and_then(|n| n.to_str()).unwrap_or_default();
    let frames = out.with_file_name(format!("{stem}_frames"));
    if let Ok(dir) = std::fs::read_dir(&frames) {
        let mut names: Vec<PathBuf> = dir.map(|e| e.unwrap().path()).collect();
        names.sort();
        for path in names {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            files.push((name, std::fs::read(&path).unwrap()));
        }
    }
    files
}

#[test]
fn the_cli_and_the_engine_call_write_the_same_wan_clip() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = dir.path().join("tokenizer.json");
    cli_support::write_tokenizer(&tokenizer, &["a", "red", "cat", "dog"]);
    let lora = dir.path().join("lora.safetensors");
    write_lora(&lora);
    let (dit, te, vae) = (
        fixture("wan21_t2v_tiny"),
        fixture("umt5_tiny"),
        fixture("wan21_vae_tiny"),
    );
    let cli_out = dir.path().join("cli").join("clip.mp4");
    let lora_arg = format!("{}:0.5", lora.display());
    let (ok, stdout, stderr) = framesmith(&[
        "generate",
        "--dit",
        &dit,
        "--text-encoder",
        &te,
        "--tokenizer",
        s(&tokenizer),
        "--vae",
        &vae,
        "--lora",
        &lora_arg,
        "--prompt",
        "a red cat",
        "--negative",
        "a dog",
        "--width",
        "32",
        "--height",
        "48",
        "--frames",
        "5",
        "--steps",
        "3",
        "--seed",
        "11",
        "--device",
        "cpu",
        "--out",
        s(&cli_out),
    ]);
    assert!(ok, "{stderr}");
    let engine_out = dir.path().join("engine").join("clip.mp4");
    let mut request = GenerationRequest::new(DitSource::File(dit.into()), "a red cat", &engine_out);
    request.negative = Some("a dog".into());
    request.loras = vec![LoraChoice {
        path: lora,
        strength: 0.5,
    }];
    request.files = CompanionFiles {
        vae: Some(vae.into()),
        text_encoder: Some(te.into()),
        tokenizer: Some(tokenizer),
        ..CompanionFiles::default()
    };
    (request.width, request.height, request.frames) = (Some(32), Some(48), Some(5));
    (request.steps, request.seed) = (Some(3), Some(11));
    request.placement.device = DeviceSpec::Cpu;
    let (output, events) = engine(&request);
    assert_eq!((output.frames, output.seed), (5, 11));
    assert!(stdout.contains("(5 frames)"), "{stdout}");
    let steps = events
        .iter()
        .filter(|e| matches!(e, GenerationEvent::StepStarted { steps: 3, .. }))
        .count();
    assert_eq!(steps, 3);
    let (cli, ours) = (written(&cli_out), written(&engine_out));
    assert_eq!(cli.len(), 7, "the MP4, 5 frames and frames.json");
    assert_eq!(
        cli, ours,
        "the command line and the engine call wrote different files"
    );
}

#[test]
fn the_cli_and_the_engine_call_write_the_same_flux_image() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = |case: &str| {
        framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors")
    };
    let (clip_l, t5) =
        framesmith_models::fixtures::flux_text_encoders(dir.path(), &["a", "red", "fox"]).unwrap();
    let dit = dir.path().join("flux1-dev.safetensors");
    std::fs::copy(fixture("flux_dit"), &dit).unwrap();
    let ae = dir.path().join("ae.safetensors");
    std::fs::copy(fixture("flux_ae"), &ae).unwrap();
    let cli_out = dir.path().join("cli.png");
    let (ok, stdout, stderr) = framesmith(&[
        "generate",
        "--dit",
        s(&dit),
        "--vae",
        s(&ae),
        "--clip-l",
        s(&clip_l),
        "--t5",
        s(&t5),
        "--prompt",
        "a red fox",
        "--steps",
        "2",
        "--seed",
        "5",
        "--width",
        "24",
        "--height",
        "16",
        "--device",
        "cpu",
        "--out",
        s(&cli_out),
    ]);
    assert!(ok && stdout.contains("(24x16)"), "{stdout}\n{stderr}");
    let engine_out = dir.path().join("engine.png");
    let mut request = GenerationRequest::new(DitSource::File(dit), "a red fox", &engine_out);
    request.files = CompanionFiles {
        vae: Some(ae),
        clip_l: Some(clip_l),
        t5: Some(t5),
        ..CompanionFiles::default()
    };
    (request.width, request.height) = (Some(24), Some(16));
    (request.steps, request.seed) = (Some(2), Some(5));
    request.placement.device = DeviceSpec::Cpu;
    let (output, _) = engine(&request);
    assert_eq!(
        (output.width, output.height, output.frames_dir),
        (24, 16, None)
    );
    assert_eq!(written(&cli_out), written(&engine_out));
}
