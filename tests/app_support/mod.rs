//! Shared pieces of the app tests: a fake backend with a real channel pair, dropped folders, a harness builder
//! and the one snapshot tolerance helper.
// Each test file uses a different part of this module, and a failed setup step should stop the test where it
// happened.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use framesmith_app::{
    scan_folders, AppOptions, Backend, DatasetSummary, FieldIssue, FramesmithApp, ModelRole,
    PresetView, Severity,
};
use framesmith_config::protocol::doctor::SystemReport;
use framesmith_config::protocol::{channel_pair, EngineEnd, EngineHandle};
use framesmith_config::run::StreamingMode;
use framesmith_config::RunConfig;

pub const PRESET: &str = "low-vram-windows";
pub const STREAMING_REASON: &str = "stream weights through a small pinned ring";
pub const RANK_REASON: &str = "rank 16 fits 16 GB cards";
pub const RANK_LIMIT_MESSAGE: &str = "Rank must be at most 128";

/// A backend whose engine is a channel pair the test holds the other end of.
#[derive(Default)]
pub struct FakeBackend {
    engine_ends: Mutex<Vec<EngineEnd>>,
    pub engine_error: Option<String>,
    /// What `system_check` answers (`None`: the default "not connected").
    pub system_report: Option<SystemReport>,
    /// How many system checks were asked for, and the output folder of the last.
    system_checks: AtomicUsize,
    pub checked_folder: Mutex<Option<PathBuf>>,
    /// The GPUs of each `spawn_engine`, in order.
    engine_gpus: Mutex<Vec<Vec<usize>>>,
}

impl FakeBackend {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A backend whose engine cannot start.
    pub fn failing_engine(message: &str) -> Arc<Self> {
        Arc::new(Self {
            engine_error: Some(message.into()),
            ..Self::default()
        })
    }

    /// The engine end of the most recent `spawn_engine`.
    pub fn engine(&self) -> EngineEnd {
        self.engine_ends
            .lock()
            .unwrap()
            .pop()
            .expect("the app never started the engine")
    }

    /// The GPUs each engine was started for, in order.
    pub fn engine_gpus(&self) -> Vec<Vec<usize>> {
        self.engine_gpus.lock().unwrap().clone()
    }

    pub fn engines_spawned(&self) -> usize {
        self.engine_ends.lock().unwrap().len()
    }

    /// A backend whose system check answers `report`.
    pub fn with_system_report(report: SystemReport) -> Arc<Self> {
        Arc::new(Self {
            system_report: Some(report),
            ..Self::default()
        })
    }

    pub fn system_checks(&self) -> usize {
        self.system_checks.load(Ordering::SeqCst)
    }
}

impl Backend for FakeBackend {
    fn inspect_model(&self, _role: ModelRole, path: &Path) -> Result<String, String> {
        if path.to_string_lossy().contains("diffusers") {
            Err(format!(
                "this is a diffusers folder, not a Wan checkpoint: {}",
                path.display()
            ))
        } else {
            Ok("Wan2.1 T2V-1.3B · ComfyUI single file · bf16 · 2.6 GiB".into())
        }
    }

    fn scan_dataset(&self, folders: &[PathBuf]) -> Result<DatasetSummary, String> {
        scan_folders(folders)
    }

    fn presets(&self) -> Vec<PresetView> {
        vec![
            PresetView {
                name: PRESET.into(),
                summary: "16 GB cards on Windows".into(),
                reasons: BTreeMap::from([
                    ("memory.streaming".into(), STREAMING_REASON.into()),
                    ("lora.rank".into(), RANK_REASON.into()),
                ]),
            },
            PresetView {
                name: "full-speed-80gb+".into(),
                summary: "No streaming".into(),
                reasons: BTreeMap::new(),
            },
        ]
    }

    fn apply_preset(&self, name: &str, config: &RunConfig) -> Result<RunConfig, String> {
        let mut config = config.clone();
        match name {
            PRESET => {
                config.memory.streaming = StreamingMode::Staged;
                config.lora.rank = 16;
                config.memory.shared_memory_guard = true;
            }
            _ => config.memory.streaming = StreamingMode::Off,
        }
        Ok(config)
    }

    fn validate(&self, config: &RunConfig) -> Vec<FieldIssue> {
        let mut issues = Vec::new();
        if config.lora.rank > 128 {
            issues.push(FieldIssue {
                key: "lora.rank".into(),
                message: RANK_LIMIT_MESSAGE.into(),
                severity: Severity::Error,
            });
        }
        issues
    }

    fn system_check(&self, output_dir: &Path) -> Result<SystemReport, String> {
        self.system_checks.fetch_add(1, Ordering::SeqCst);
        *self.checked_folder.lock().unwrap() = Some(output_dir.to_path_buf());
        match &self.system_report {
            Some(report) => Ok(report.clone()),
            None => Err("the system check is not connected".into()),
        }
    }

    fn demo_project(&self) -> RunConfig {
        let mut config = RunConfig::default();
        config.model.demo = true;
        config.training.max_train_steps = 100;
        config.output.output_name = "demo".into();
        config
    }

    fn spawn_engine(&self, gpus: &[usize]) -> Result<EngineHandle, String> {
        self.engine_gpus.lock().unwrap().push(gpus.to_vec());
        if let Some(err) = &self.engine_error {
            return Err(err.clone());
        }
        let (handle, end) = channel_pair();
        self.engine_ends.lock().unwrap().push(end);
        Ok(handle)
    }
}

/// A file or folder dropped onto the window.
#[derive(Debug)]
pub struct Dropped(pub PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

/// The real app, jobs inline, no telemetry, no stored settings.
pub fn harness(backend: Arc<FakeBackend>) -> Harness<'static, FramesmithApp> {
    harness_with(AppOptions::for_tests(backend))
}

/// The real app with the given options.
pub fn harness_with(options: AppOptions) -> Harness<'static, FramesmithApp> {
    let mut harness = Harness::builder()
        .with_size(egui::vec2(1280.0, 1000.0))
        .build_eframe(move |cc| FramesmithApp::new(cc, options));
    harness.step();
    harness
}

/// Clicks Start on the Train tab and returns the engine the run went to, its `StartRun` taken.
pub fn start_run(harness: &mut Harness<'_, FramesmithApp>, backend: &FakeBackend) -> EngineEnd {
    harness.get_by_label("Start").click();
    settle(harness);
    let engine = backend.engine();
    assert!(matches!(
        engine.commands.try_recv(),
        Ok(framesmith_config::protocol::Command::StartRun(_))
    ));
    engine
}

/// Runs a few frames: one to handle input, one for jobs and events, one to draw their results.
pub fn settle(harness: &mut Harness<'_, FramesmithApp>) {
    harness.run_steps(3);
}

/// A tiny PNG of one colour.
pub fn png(path: &Path, rgba: [u8; 4]) {
    image::RgbaImage::from_pixel(8, 6, image::Rgba(rgba))
        .save(path)
        .unwrap();
}

/// A sample's frames: `count` PNGs of different colours and a frames.json with `fps`.
pub fn frames_dir(root: &Path, count: usize, fps: u32) -> PathBuf {
    let dir = root.join("sample_000050");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..count {
        png(
            &dir.join(format!("{i:04}.png")),
            [40 * i as u8, 100, 200, 255],
        );
    }
    std::fs::write(dir.join("frames.json"), format!("{{\"fps\": {fps}}}")).unwrap();
    dir
}

/// The one tolerance every snapshot uses: the default per-pixel threshold, and a few pixels of slack for
/// anti-aliasing differences between software and hardware rasterizers.
pub fn snapshot_options() -> egui_kittest::SnapshotOptions {
    egui_kittest::SnapshotOptions::new()
        .threshold(0.6)
        .max_failed_pixels(8)
}

/// Whether a wgpu adapter exists to render snapshots; prints why not when it does not.
pub fn can_render() -> bool {
    let result = std::panic::catch_unwind(egui_kittest::wgpu::WgpuTestRenderer::new);
    match result {
        Ok(_) => true,
        Err(_) => {
            eprintln!("skipping snapshot: no wgpu adapter here (install a software Vulkan such as mesa lavapipe)");
            false
        }
    }
}

/// Renders the harness and compares it with `tests/snapshots/{name}.png` under the shared tolerance.
pub fn check_snapshot(harness: &mut Harness<'_, FramesmithApp>, name: &str) {
    harness.snapshot_options(name, &snapshot_options());
}
