//! The Samples tab's "Try the LoRA" panel, driven by label: it starts from the backend's defaults for the
//! project, sends what the form holds to `Backend::generate`, and plays the clip it wrote in the sample player.
//! Jobs run inline, so every frame is deterministic.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing

mod app_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use app_support::{frames_dir, harness_with, settle};
use egui_kittest::kittest::Queryable;
use framesmith_app::{
    default_generate_settings, AppOptions, Backend, DatasetSummary, FieldIssue, GenerateSettings,
    GenerateUpdate, GeneratedClip, ModelRole, PresetView,
};
use framesmith_config::protocol::EngineHandle;
use framesmith_config::RunConfig;

/// A backend that "generates" by writing frames into `root`, and keeps what it was asked.
struct GenerateBackend {
    root: PathBuf,
    asked: Mutex<Vec<GenerateSettings>>,
    fail: Option<String>,
}

impl Backend for GenerateBackend {
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

    fn demo_project(&self) -> RunConfig {
        let mut config = RunConfig::default();
        config.model.demo = true;
        config.output.output_dir = self.root.join("output");
        config.output.output_name = "demo".into();
        config
    }

    fn generate_defaults(&self, config: &RunConfig) -> GenerateSettings {
        GenerateSettings {
            prompt: "a red circle moving right".into(),
            image: Some(self.root.join("start.png")),
            seed: 7,
            steps: 4,
            ..default_generate_settings(config)
        }
    }

    fn generate(
        &self,
        _config: &RunConfig,
        settings: &GenerateSettings,
        updates: &mut dyn FnMut(GenerateUpdate),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<GeneratedClip, String> {
        self.asked.lock().unwrap().push(settings.clone());
        for step in 0..settings.steps {
            if cancelled() {
                return Err("generation cancelled".into());
            }
            updates(GenerateUpdate::Step {
                step,
                steps: settings.steps,
            });
        }
        updates(GenerateUpdate::Log("denoised in 0.1 s".into()));
        if let Some(err) = &self.fail {
            return Err(err.clone());
        }
        Ok(GeneratedClip {
            file: settings.out.with_extension("mp4"),
            frames: frames_dir(&self.root, 5, 8),
        })
    }

    fn spawn_engine(&self, _gpus: &[usize]) -> Result<EngineHandle, String> {
        Err("no engine in this test".into())
    }
}

fn backend(root: &Path, fail: Option<&str>) -> Arc<GenerateBackend> {
    Arc::new(GenerateBackend {
        root: root.to_path_buf(),
        asked: Mutex::new(Vec::new()),
        fail: fail.map(str::to_owned),
    })
}

#[test]
fn the_generate_panel_sends_the_form_and_plays_the_clip() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), None);
    let mut h = harness_with(AppOptions::for_tests(backend.clone()));
    h.get_by_label("Samples").click();
    settle(&mut h);
    assert!(h.query_by_label("Try the LoRA").is_some());
    assert_eq!(h.state().shown_sample_frame(), None);
    h.get_by_label("Generate").click();
    settle(&mut h);
    let asked = backend.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "one generation");
    let settings = &asked[0];
    assert_eq!(settings.prompt, "a red circle moving right");
    assert_eq!(
        settings.lora,
        dir.path().join("output").join("demo.safetensors"),
        "the run's LoRA in its output folder"
    );
    assert_eq!(settings.image, Some(dir.path().join("start.png")));
    assert_eq!(
        (settings.seed, settings.steps, settings.strength),
        (7, 4, 1.0)
    );
    assert_eq!(
        settings.out,
        dir.path()
            .join("output")
            .join("generated")
            .join("try-seed7")
    );
    settle(&mut h);
    assert_eq!(
        h.state().shown_sample_frame(),
        Some(0),
        "the clip is in the player"
    );
    assert!(h.query_by_label_contains("Wrote ").is_some());
    assert!(h.query_by_label("denoised in 0.1 s").is_some());
}

#[test]
fn a_failed_generation_says_why_and_can_be_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), Some("the LoRA does not fit the demo model"));
    let mut h = harness_with(AppOptions::for_tests(backend.clone()));
    h.get_by_label("Samples").click();
    settle(&mut h);
    h.get_by_label("Generate").click();
    settle(&mut h);
    assert!(h
        .query_by_label("the LoRA does not fit the demo model")
        .is_some());
    assert_eq!(h.state().shown_sample_frame(), None);
    h.get_by_label("Generate").click();
    settle(&mut h);
    assert_eq!(backend.asked.lock().unwrap().len(), 2);
}
