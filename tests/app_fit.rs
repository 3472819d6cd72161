//! The Train tab's "Will it fit?" section: the real planner through `src/gui.rs` shows a verdict, the blocks
//! it chose and the bars for a preset, follows config changes, and steps aside while a run is in progress.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

mod app_support;

use std::path::Path;
use std::sync::Arc;

use app_support::{harness, harness_with, png, settle, Dropped, FakeBackend};
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use framesmith::gui::EngineBackend;
use framesmith_app::{staged_events, AppOptions, FramesmithApp};
use framesmith_config::protocol::memory::Verdict;

/// The app with the real backend, opened on a run config naming the 14B model and a VRAM budget.
fn real_app_on(dir: &Path, budget_gb: f64) -> Harness<'static, FramesmithApp> {
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!("[model]\nvariant = \"t2v-14b\"\n[memory]\nvram_budget_gb = {budget_gb:.1}\n"),
    )
    .unwrap();
    let backend = EngineBackend::new().unwrap();
    let mut options = AppOptions::for_tests(Arc::new(backend));
    options.project = Some(config);
    let mut h = harness_with(options);
    settle(&mut h);
    h
}

fn apply_preset(h: &mut Harness<'static, FramesmithApp>, name: &str) {
    h.get_by_label("Config").click();
    settle(h);
    h.get_by_label(name).click();
    settle(h);
    h.get_by_label("Train").click();
    settle(h);
}

#[test]
fn shows_the_verdict_and_chosen_blocks_for_a_preset() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = real_app_on(dir.path(), 16.0);
    apply_preset(&mut h, "low-vram-windows");
    let plan = h.state().memory_plan().expect("a plan").clone();
    assert!(
        plan.workload.starts_with("832x480, 33 frames"),
        "{}",
        plan.workload
    );
    assert_eq!(plan.verdict, Verdict::Fits);
    assert!(plan.blocks_chosen && plan.blocks_to_swap > 0, "{plan:?}");
    h.get_by_label("Will it fit?");
    h.get_by_label_contains("Fits: peak VRAM");
    h.get_by_label(&format!(
        "Streams {} of 40 blocks (chosen by the planner)",
        plan.blocks_to_swap
    ));
    h.get_by_label_contains("t2v-14b (fp8 block64)");
    h.get_by_label("Breakdown").click();
    settle(&mut h);
    h.get_by_label_contains("pinned staging ring (4 × 8.0 MiB)");
    // The staging ring and the saved block inputs.
    assert_eq!(h.query_all_by_label_contains("(page-locked)").count(), 2);
}

#[test]
fn a_config_that_cannot_fit_says_what_would() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = real_app_on(dir.path(), 8.0);
    apply_preset(&mut h, "full-speed-80gb");
    let plan = h.state().memory_plan().expect("a plan").clone();
    assert_eq!(plan.verdict, Verdict::DoesNotFit);
    assert!(!plan.suggestions.is_empty());
    h.get_by_label_contains("Does not fit: peak VRAM");
    h.get_by_label_contains("Try: ");
}

#[test]
fn steps_aside_while_a_run_is_in_progress() {
    let mut h = harness(FakeBackend::new());
    h.get_by_label("Train").click();
    settle(&mut h);
    // A backend without a planner says so instead of a verdict.
    h.get_by_label("Will it fit?");
    h.get_by_label_contains("No memory plan: the memory planner is not connected");
    for event in staged_events() {
        h.state_mut().apply_event(event);
    }
    settle(&mut h);
    assert!(h.query_by_label("Will it fit?").is_none());
}

#[test]
fn plans_the_project_tabs_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = real_app_on(dir.path(), 24.0);
    h.get_by_label("Train").click();
    settle(&mut h);
    let before = h.state().memory_plan().expect("a plan").clone();
    assert!(
        before.notes.iter().any(|n| n.contains("assumed")),
        "{before:?}"
    );
    // Dropping an image folder makes the run's dataset: one frame at the Project tab's resolution.
    let images = dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    png(&images.join("a.png"), [200, 40, 40, 255]);
    h.input_mut().dropped_files.push(Arc::new(Dropped(images)));
    settle(&mut h);
    h.get_by_label("Train").click();
    settle(&mut h);
    let after = h.state().memory_plan().expect("a plan").clone();
    assert!(
        after.workload.contains(", 1 frames, batch 1"),
        "{}",
        after.workload
    );
    assert!(after.tokens < before.tokens);
    assert!(
        after.notes.iter().all(|n| !n.contains("assumed")),
        "{after:?}"
    );
}
