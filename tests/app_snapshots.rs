//! Snapshot images of the real panels, compared under the one shared tolerance (`app_support::snapshot_options`).
//! They need a wgpu adapter (a software one such as mesa lavapipe is enough) and skip, saying why, without one.
//! Update with `UPDATE_SNAPSHOTS=1 cargo test --test app_snapshots`.

mod app_support;

use app_support::{can_render, check_snapshot, harness, settle, FakeBackend, PRESET};
use egui_kittest::kittest::Queryable;
use framesmith_app::staged_events;

#[test]
fn train_tab_with_a_run_in_progress() {
    if !can_render() {
        return;
    }
    let mut h = harness(FakeBackend::new());
    h.get_by_label("Train").click();
    settle(&mut h);
    for event in staged_events() {
        h.state_mut().apply_event(event);
    }
    settle(&mut h);
    check_snapshot(&mut h, "train_tab");
}

#[test]
fn config_tab_after_a_preset() {
    if !can_render() {
        return;
    }
    let mut h = harness(FakeBackend::new());
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label(PRESET).click();
    settle(&mut h);
    check_snapshot(&mut h, "config_tab_preset");
}
