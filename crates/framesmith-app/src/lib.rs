//! The desktop app (egui/eframe on wgpu): panels, widgets, theme and the sample player. It never touches
//! candle or tensors: it reaches the engine only through `framesmith_config::protocol`, and the rest of Framesmith only
//! through the `Backend` trait that `main.rs` implements.

mod backend;
mod charts;
mod close_guard;
mod config_editor;
mod config_panel;
mod dataset_config;
mod dataset_panel;
mod dialogs;
mod fields;
mod fit_panel;
mod form;
mod generate_panel;
mod gpu_panel;
mod handlers;
mod jobs;
mod lora_panel;
mod lora_tools;
mod monitor_panel;
mod output_folder;
mod platform;
mod player;
mod project_panel;
mod queue;
mod replay;
mod run_view;
mod samples_panel;
mod screenshot;
mod settings;
mod spill_guard;
mod standalone;
mod system_check_panel;
mod tabs;
mod theme;
mod train_panel;
mod window;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail};
use framesmith_config::RunConfig;

pub use backend::{
    default_generate_settings, Backend, DatasetSummary, FieldIssue, GenerateSettings,
    GenerateUpdate, GeneratedClip, LoraLayout, LoraReport, LoraTask, ModelRole, PresetView,
    Severity, Thumbnail,
};
pub use jobs::JobMode;
pub use platform::display_missing;
pub use player::{PlayerClock, DEFAULT_FPS};
pub use run_view::{format_duration, LogLine, RunEnd, RunView, SampleClip, StepPoint};
pub use screenshot::{staged_events, GENERATE_LIMIT};
pub use standalone::{format_bytes, scan_folders, thumbnails, StandaloneBackend, THUMBNAILS};
pub use window::FramesmithApp;

use screenshot::{GenerateFirst, ScreenshotRequest};
use tabs::tabs_ui;

/// Where telemetry comes from.
pub enum TelemetrySource {
    Off,
    /// The sampling thread (NVML, sysinfo, PDH).
    Live,
    /// A fixed history (tests).
    Fixed(framesmith_telemetry::History),
}

/// How the app starts.
pub struct AppOptions {
    /// The rest of Framesmith (model inspector, dataset scanner, presets, validation, engine).
    pub backend: Arc<dyn Backend>,
    /// A run config TOML to open instead of the last session's project.
    pub project: Option<PathBuf>,
    /// `Background` in the app; `Inline` makes jobs finish within the frame that starts them (tests).
    pub jobs: JobMode,
    /// Where the Monitor tab's numbers come from.
    pub telemetry: TelemetrySource,
    /// Read and write settings through eframe storage.
    pub persistence: bool,
    screenshot: Option<ScreenshotRequest>,
}

impl AppOptions {
    /// The app as a user runs it: background jobs, telemetry and persistence on.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            project: None,
            jobs: JobMode::Background,
            telemetry: TelemetrySource::Live,
            persistence: true,
            screenshot: None,
        }
    }

    /// For tests: jobs inline, no telemetry thread, no stored settings.
    pub fn for_tests(backend: Arc<dyn Backend>) -> Self {
        Self {
            jobs: JobMode::Inline,
            telemetry: TelemetrySource::Off,
            persistence: false,
            ..Self::new(backend)
        }
    }
}

/// Opens the app window and runs until it is closed.
pub fn run_app(options: AppOptions) -> anyhow::Result<()> {
    let request = options.screenshot.clone();
    let native = native_options(request.is_some());
    // The windowing libraries panic when a system library they load at run time is missing (winit and
    // `libxkbcommon-x11.so`): that becomes the same kind of error as a window that failed to open.
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eframe::run_native(
            "Framesmith",
            native,
            Box::new(move |cc| Ok(Box::new(FramesmithApp::new(cc, options)))),
        )
    }))
    .map_err(|payload| anyhow!(platform::window_failed(&platform::panic_text(&*payload))))?;
    opened.map_err(|err| anyhow!(platform::window_failed(&err.to_string())))?;
    let Some(request) = request else {
        return Ok(());
    };
    match request.take_outcome() {
        Some(Ok(())) => Ok(()),
        Some(Err(err)) => bail!("{err}"),
        None => bail!("the window closed before the screenshot was taken"),
    }
}

/// Renders the app (demo project, a run part-way through) in a real window, saves a PNG and exits.
pub fn screenshot(path: &Path) -> anyhow::Result<()> {
    screenshot_with(AppOptions::new(Arc::new(StandaloneBackend)), path)
}

/// `screenshot` with a given backend (so the capture shows the real presets).
pub fn screenshot_with(options: AppOptions, path: &Path) -> anyhow::Result<()> {
    capture(options, ScreenshotRequest::new(path))
}

/// `screenshot_with` showing the finished run whose outputs are in `run_dir` (its `run.toml`, `metrics.jsonl`
/// and `samples/`) on the Samples tab.
pub fn screenshot_of_run(options: AppOptions, path: &Path, run_dir: &Path) -> anyhow::Result<()> {
    let mut request = ScreenshotRequest::new(path);
    request.run_events = Some(replay::run_events(run_dir).map_err(|err| anyhow!("{err}"))?);
    capture(options, request)
}

/// `screenshot_of_run` after generating `prompt` with the run's models and LoRA in the Samples tab's "Try the
/// LoRA" panel (through the backend, as a click on Generate does): the capture waits for the generation (at most
/// [`GENERATE_LIMIT`]) and shows the clip it made in the player. Fails when the generation fails.
pub fn screenshot_of_generation(
    options: AppOptions,
    path: &Path,
    run_dir: &Path,
    prompt: &str,
) -> anyhow::Result<()> {
    let config_path = run_dir.join("run.toml");
    let config = RunConfig::load(&config_path).map_err(|err| anyhow!("{err:#}"))?;
    let mut request = ScreenshotRequest::new(path);
    request.run_events = Some(replay::run_events(run_dir).map_err(|err| anyhow!("{err}"))?);
    request.generate = Some(GenerateFirst {
        config: Box::new(config),
        prompt: prompt.to_owned(),
    });
    capture(options, request)
}

fn capture(mut options: AppOptions, request: ScreenshotRequest) -> anyhow::Result<()> {
    options.persistence = false;
    options.project = None;
    options.screenshot = Some(request);
    run_app(options)
}

fn native_options(screenshot: bool) -> eframe::NativeOptions {
    let viewport = egui::ViewportBuilder::default()
        .with_title("Framesmith")
        .with_app_id("framesmith")
        .with_inner_size([1280.0, 860.0])
        .with_min_inner_size([720.0, 480.0])
        .with_drag_and_drop(true);
    eframe::NativeOptions {
        viewport,
        renderer: eframe::Renderer::Wgpu,
        // The capture must not depend on (or change) the user's saved window.
        persist_window: !screenshot,
        ..eframe::NativeOptions::default()
    }
}
