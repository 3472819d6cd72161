//! The app wired to the real modules through `src/gui.rs` (the backend `main.rs` uses): the real presets,
//! the real validator, the real model inspector and dataset checker, and the real engine training the demo
//! project to the end with no downloads and no GPU.

mod app_support;
mod cli_support;

use std::sync::Arc;

use app_support::{harness_with, png, settle, Dropped};
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use framesmith::gui::EngineBackend;
use framesmith_app::{AppOptions, FramesmithApp};
use framesmith_config::protocol::RunState;
use framesmith_config::run::StreamingMode;

fn harness() -> Harness<'static, FramesmithApp> {
    let backend = EngineBackend::new()
        .unwrap_or_else(|err| panic!("the built-in presets do not load: {err:#}"));
    harness_with(AppOptions::for_tests(Arc::new(backend)))
}

#[test]
fn first_start_is_the_demo_project_and_the_real_presets_mark_fields() {
    let mut h = harness();
    assert!(h.state().config().model.demo);
    assert!(h.state().config().dataset.synthetic);
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label("low-vram-windows").click();
    settle(&mut h);
    assert_eq!(h.state().config().memory.streaming, StreamingMode::Staged);
    h.get_by_label_contains("Preset low-vram-windows changed");
    // Each changed field is listed once with the preset's reason, and marked beside the field.
    h.get_by_label_contains("Streaming = staged: ");
    assert!(h.query_all_by_label_contains("Preset: ").count() >= 2);
}

#[test]
fn the_real_validator_marks_the_field_in_place() {
    let mut h = harness();
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label("Rank").set_text_value_accesskit("0");
    settle(&mut h);
    h.get_by_label("must be at least 1; use a rank such as 16 or 32");
}

#[test]
fn the_real_inspector_explains_a_file_that_is_not_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("wan_t2v.safetensors");
    std::fs::write(&bogus, b"this is not a safetensors file").unwrap();
    let mut h = harness();
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(bogus.clone())));
    settle(&mut h);
    // The loader's error names the file; the path line above it is the file itself.
    let path = bogus.display().to_string();
    let mentions = h.query_all_by_label_contains(&path).count();
    assert!(
        mentions >= 2,
        "expected the path and an error naming it, found {mentions}"
    );
    assert_eq!(h.state().config().model.dit, bogus);
    assert!(
        h.query_by_label("Inspecting…").is_none(),
        "the inspection finished"
    );
}

#[test]
fn the_real_dataset_checker_counts_a_dropped_folder() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        png(&dir.path().join(format!("{name}.png")), [200, 40, 40, 255]);
        std::fs::write(dir.path().join(format!("{name}.txt")), "a red square").unwrap();
    }
    png(&dir.path().join("c.png"), [20, 40, 240, 255]);
    let mut h = harness();
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(dir.path().to_path_buf())));
    settle(&mut h);
    h.get_by_label("3 images");
    h.get_by_label("2 captions");
    h.get_by_label("1 item missing a caption");
}

#[test]
fn start_trains_the_demo_project_with_the_real_engine() {
    let mut h = harness();
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label("Max steps").set_text_value_accesskit("3");
    settle(&mut h);
    h.get_by_label("Warmup steps").set_text_value_accesskit("0");
    settle(&mut h);
    h.get_by_label("Save every n steps")
        .set_text_value_accesskit("");
    settle(&mut h);
    let out = tempfile::tempdir().unwrap();
    h.get_by_label("Output folder")
        .set_text_value_accesskit(&out.path().to_string_lossy());
    settle(&mut h);
    h.get_by_label("Train").click();
    settle(&mut h);
    h.get_by_label("Start").click();
    // The engine runs on its own thread; keep drawing frames until it reports the end (bounded, so a hang
    // fails instead of blocking CI).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !matches!(
        h.state().run_view().state,
        RunState::Finished | RunState::Failed
    ) && std::time::Instant::now() < deadline
    {
        h.step();
        std::thread::yield_now();
    }
    let view = h.state().run_view();
    assert_eq!(
        view.state,
        RunState::Finished,
        "failure: {:?}; log: {:?}",
        view.failure,
        view.log
    );
    let steps: Vec<usize> = view.points.iter().map(|p| p.step).collect();
    assert_eq!(steps, vec![1, 2, 3]);
    assert!(view.points.iter().all(|p| p.loss.is_finite()));
    // The demo project samples before the first step (and every 100 steps): its clips reach the Samples tab.
    assert!(
        view.samples
            .iter()
            .any(|s| s.step == 0 && s.frames.join("frame_0004.png").is_file()),
        "no sample from the demo project: {:?}",
        view.samples
    );
    // The finished run's LoRA is offered to the LoRA tools: Inspect shows its norms per block.
    h.get_by_label("Samples").click();
    settle(&mut h);
    h.get_by_label("Inspect").click();
    settle(&mut h);
    h.get_by_label_contains("Inspecting: done");
    h.get_by_label("Weight change norm");
}

#[test]
fn the_lora_tools_convert_a_real_adapter_and_never_write_over_a_file() {
    use framesmith_app::{Backend, LoraLayout, LoraTask};
    let dir = tempfile::tempdir().unwrap();
    let lora = dir.path().join("cat.safetensors");
    cli_support::write_lora(&lora);
    let backend = EngineBackend::new().unwrap();
    let output = dir.path().join("cat_comfyui.safetensors");
    let convert = LoraTask::Convert {
        input: lora.clone(),
        output: output.clone(),
        to: LoraLayout::ComfyUi,
    };
    let report = backend.lora_tool(&convert).unwrap();
    assert_eq!(report.written.as_ref(), Some(&output));
    assert!(
        report.lines[0].contains("from the musubi layout to comfyui"),
        "{:?}",
        report.lines
    );
    let written = std::fs::read(&output).unwrap();
    let err = backend.lora_tool(&convert).unwrap_err();
    assert!(
        err.contains("never write over") && err.ends_with("cat_comfyui.safetensors"),
        "{err}"
    );
    assert_eq!(std::fs::read(&output).unwrap(), written);
    let report = backend
        .lora_tool(&LoraTask::Inspect { file: output })
        .unwrap();
    assert_eq!(report.norms.len(), 1, "{:?}", report.norms);
    assert_eq!(report.norms[0].1.len(), 1);
    let missing = dir.path().join("missing.safetensors");
    let err = backend
        .lora_tool(&LoraTask::Inspect {
            file: missing.clone(),
        })
        .unwrap_err();
    assert!(err.contains("missing.safetensors"), "{err}");
}

#[test]
fn the_monitor_tab_shows_the_real_system_check() {
    let mut h = harness();
    h.get_by_label("Monitor").click();
    settle(&mut h);
    let report = h
        .state()
        .system_report()
        .expect("the system check ran")
        .clone();
    assert_eq!(report.facts.build.cuda, cfg!(feature = "cuda"));
    assert_eq!(
        report.facts.disk.folder,
        std::path::absolute(&h.state().config().output.output_dir).unwrap()
    );
    let header = format!("System check · {}", report.verdict_line());
    if !report.blocks_training() {
        // Closed unless something blocks training.
        h.get_by_label_contains(&header).click();
        settle(&mut h);
    }
    for finding in &report.findings {
        // ffmpeg and ffprobe missing share a fix.
        let fix = format!("Fix: {}", finding.fix);
        assert!(h.query_all_by_label(&fix).next().is_some(), "{fix}");
    }
    if !cfg!(feature = "cuda") {
        h.get_by_label("GPU support: no CUDA: this build trains on the CPU only");
        h.get_by_label("Attention: portable tiled kernel (this build has no CUDA)");
        h.get_by_label("None: this build has no CUDA");
    }
}
