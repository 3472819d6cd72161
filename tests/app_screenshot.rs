//! `framesmith --screenshot`'s code path in a real window: needs a display (CI runs it under `xvfb-run`) and
//! skips, saying why, without one. Runs on the main thread (`harness = false`), as winit requires. The second
//! capture is `--run DIR --generate PROMPT`'s: the prompt goes to the backend's generation and the clip it made is
//! in the player when the window is captured.

// A test with its own `main`: clippy does not see it as a test, and panicking is how it fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use framesmith_app::{
    AppOptions, Backend, DatasetSummary, FieldIssue, GenerateSettings, GenerateUpdate,
    GeneratedClip, ModelRole, PresetView,
};
use framesmith_config::protocol::EngineHandle;
use framesmith_config::RunConfig;

/// The colour of every frame the test backend generates: the capture must show it, in the player.
const CLIP_COLOUR: [u8; 4] = [255, 0, 255, 255];
/// The generated frames' side in pixels.
const CLIP_SIDE: u32 = 64;
/// How long the test backend's generation takes.
const GENERATION_TIME: std::time::Duration = std::time::Duration::from_secs(2);

fn main() {
    let has_display =
        std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    if !has_display {
        println!("app_screenshot: skipped, no display (run under xvfb-run)");
        return;
    }
    // CI can keep the image as an artifact by naming where it goes.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = std::env::var_os("APP_SCREENSHOT_PATH")
        .map_or_else(|| dir.path().join("framesmith.png"), Into::into);
    if let Err(err) = framesmith_app::screenshot(&path) {
        panic!("screenshot failed: {err:#}");
    }
    check_not_blank(&path);
    capture_a_generated_clip(dir.path());
    println!("app_screenshot: ok");
}

/// A backend that generates three frames of [`CLIP_COLOUR`] and keeps the prompts it was asked for.
#[derive(Default)]
struct GeneratingBackend {
    prompts: Mutex<Vec<String>>,
}

impl Backend for GeneratingBackend {
    fn inspect_model(&self, _role: ModelRole, path: &Path) -> Result<String, String> {
        Ok(path.display().to_string())
    }

    fn scan_dataset(&self, _folders: &[PathBuf]) -> Result<DatasetSummary, String> {
        Ok(DatasetSummary::default())
    }

    fn presets(&self) -> Vec<PresetView> {
        Vec::new()
    }

    fn apply_preset(&self, name: &str, _config: &RunConfig) -> Result<RunConfig, String> {
        Err(format!("no preset named {name}"))
    }

    fn validate(&self, _config: &RunConfig) -> Vec<FieldIssue> {
        Vec::new()
    }

    fn generate(
        &self,
        _config: &RunConfig,
        settings: &GenerateSettings,
        updates: &mut dyn FnMut(GenerateUpdate),
        _cancelled: &dyn Fn() -> bool,
    ) -> Result<GeneratedClip, String> {
        self.prompts.lock().unwrap().push(settings.prompt.clone());
        updates(GenerateUpdate::Step { step: 0, steps: 1 });
        // A generation takes longer than the capture's warm-up frames: a capture that did not wait for it would
        // show no clip. (Not a synchronisation: the capture passes however long this takes.)
        std::thread::sleep(GENERATION_TIME);
        let frames = settings.out.with_file_name("generated_frames");
        std::fs::create_dir_all(&frames).map_err(|e| e.to_string())?;
        for i in 0..3 {
            image::RgbaImage::from_pixel(CLIP_SIDE, CLIP_SIDE, image::Rgba(CLIP_COLOUR))
                .save(frames.join(format!("frame_{i:04}.png")))
                .map_err(|e| e.to_string())?;
        }
        std::fs::write(frames.join("frames.json"), "{\"fps\": 8}").map_err(|e| e.to_string())?;
        Ok(GeneratedClip {
            file: settings.out.with_extension("mp4"),
            frames,
        })
    }

    fn demo_project(&self) -> RunConfig {
        RunConfig::default()
    }

    fn spawn_engine(&self, _gpus: &[usize]) -> Result<EngineHandle, String> {
        Err("no engine in this test".into())
    }
}

/// `--screenshot PATH --run DIR --generate PROMPT` on a finished run's folder: the prompt is generated once, and
/// the capture shows the clip in the player.
fn capture_a_generated_clip(root: &Path) {
    let run = root.join("run");
    std::fs::create_dir_all(run.join("samples")).unwrap();
    let mut config = RunConfig::default();
    config.output.output_dir = run.clone();
    config.save(&run.join("run.toml")).unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"step\":1,\"epoch\":1,\"loss\":0.5,\"lr\":0.0001,\"step_secs\":0.5}\n",
    )
    .unwrap();
    let backend = Arc::new(GeneratingBackend::default());
    let path = root.join("generated.png");
    let options = AppOptions::new(backend.clone());
    if let Err(err) =
        framesmith_app::screenshot_of_generation(options, &path, &run, "a magenta square")
    {
        panic!("screenshot of a generated clip failed: {err:#}");
    }
    assert_eq!(*backend.prompts.lock().unwrap(), ["a magenta square"]);
    check_not_blank(&path);
    let image = image::open(&path).expect("a PNG").to_rgba8();
    let clip_pixels = image.pixels().filter(|p| p.0 == CLIP_COLOUR).count();
    assert!(
        clip_pixels >= (CLIP_SIDE * CLIP_SIDE) as usize,
        "the generated clip is not in the player: {clip_pixels} pixels of its colour"
    );
}

/// A real frame of the app has its size, many colours (text, charts) and no single colour covering almost all of it.
fn check_not_blank(path: &Path) {
    let image = image::open(path)
        .expect("the screenshot is a PNG")
        .to_rgba8();
    assert!(
        image.width() >= 640 && image.height() >= 400,
        "tiny screenshot {}x{}",
        image.width(),
        image.height()
    );
    let mut counts = std::collections::HashMap::new();
    for pixel in image.pixels() {
        *counts.entry(pixel.0).or_insert(0usize) += 1;
    }
    let total = (image.width() * image.height()) as usize;
    let most = counts.values().copied().max().unwrap_or(0);
    assert!(
        counts.len() >= 16,
        "only {} colours: the window looks blank",
        counts.len()
    );
    assert!(
        most * 100 < total * 98,
        "one colour covers {most} of {total} pixels: the window looks blank"
    );
}
