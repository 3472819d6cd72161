//! The app's panels driven by label through egui_kittest: dropping, presets, validation, the run controls,
//! progress, failures, the queue, the sample player, closing the window during a run and what the output folder
//! holds. Jobs run inline, so every frame is deterministic.

mod app_support;

use std::path::PathBuf;
use std::sync::Arc;

use app_support::{
    frames_dir, harness, png, settle, Dropped, FakeBackend, PRESET, RANK_LIMIT_MESSAGE,
    RANK_REASON, STREAMING_REASON,
};
use egui_kittest::kittest::Queryable;
use framesmith_config::protocol::{Command, Event, Progress, RunState};
use framesmith_config::run::StreamingMode;

fn progress(step: usize, eta_secs: f64) -> Event {
    Event::Progress(Progress {
        step,
        total_steps: 100,
        epoch: 1,
        loss: 0.5 - step as f64 * 0.001,
        smoothed_loss: 0.45,
        learning_rate: 2e-4,
        step_secs: 2.0,
        eta_secs,
    })
}

fn start_run(
    backend: &FakeBackend,
    h: &mut egui_kittest::Harness<'_, framesmith_app::FramesmithApp>,
) -> framesmith_config::protocol::EngineEnd {
    h.get_by_label("Train").click();
    settle(h);
    h.get_by_label("Start").click();
    settle(h);
    backend.engine()
}

#[test]
fn dropping_a_folder_fills_the_dataset_panel_with_counts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for name in ["a", "b", "c"] {
        png(&root.join(format!("{name}.png")), [200, 40, 40, 255]);
    }
    png(&root.join("d.png"), [20, 40, 240, 255]);
    std::fs::write(root.join("a.txt"), "a red square").unwrap();
    std::fs::write(root.join("b.txt"), "a red square").unwrap();
    std::fs::write(root.join("c.txt"), "a red square").unwrap();
    std::fs::write(root.join("clip.mp4"), b"\0\0\0\x18ftypmp42").unwrap();
    std::fs::write(root.join("broken.jpg"), b"not a jpeg").unwrap();

    let mut h = harness(FakeBackend::new());
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(root.to_path_buf())));
    settle(&mut h);

    // The drop switched to the Project tab and the scan's counts are shown.
    h.get_by_label("1 video");
    h.get_by_label("5 images");
    h.get_by_label("3 captions");
    h.get_by_label("3 items missing captions");
    h.get_by_label("1 unreadable file");
    h.get_by_label("Resolution 8×6");
    h.get_by_label(&format!("Dataset 1: {}", root.display()));
    // The folder went into the dataset form as an image folder.
    assert_eq!(
        h.get_by_label("Image folder").value().as_deref(),
        Some(&*root.to_string_lossy())
    );
}

#[test]
fn dropped_model_file_is_inspected_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let dit = dir.path().join("wan2.1_t2v_1.3B_bf16.safetensors");
    let vae = dir.path().join("diffusers_vae.safetensors");
    std::fs::write(&dit, b"x").unwrap();
    std::fs::write(&vae, b"x").unwrap();
    let mut h = harness(FakeBackend::new());
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(dit.clone())));
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(vae.clone())));
    settle(&mut h);
    h.get_by_label("Wan2.1 T2V-1.3B · ComfyUI single file · bf16 · 2.6 GiB");
    h.get_by_label(&format!(
        "this is a diffusers folder, not a Wan checkpoint: {}",
        vae.display()
    ));
    assert_eq!(h.state().config().model.dit, dit);
    assert_eq!(h.state().config().model.vae, vae);

    // Anything else is named in the log with what can be dropped, and changes nothing.
    let notes = dir.path().join("notes.docx");
    std::fs::write(&notes, b"x").unwrap();
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(notes.clone())));
    settle(&mut h);
    h.get_by_label("Train").click();
    settle(&mut h);
    h.get_by_label(&format!(
        "[warn] Framesmith does not know what to do with {}: drop a dataset folder, a model file (.safetensors, \
         .pth) or a run config (.toml)",
        notes.display()
    ));
    assert_eq!(h.state().config().model.dit, dit);
}

#[test]
fn clicking_a_preset_changes_the_shown_fields_and_marks_them() {
    let mut h = harness(FakeBackend::new());
    h.get_by_label("Config").click();
    settle(&mut h);
    assert_eq!(h.get_by_label("Rank").value().as_deref(), Some("32"));
    assert!(h
        .query_by_label(&format!("Preset: {RANK_REASON}"))
        .is_none());

    h.get_by_label(PRESET).click();
    settle(&mut h);

    assert_eq!(h.get_by_label("Rank").value().as_deref(), Some("16"));
    h.get_by_label(&format!("Preset {PRESET} changed 3 fields"));
    h.get_by_label(&format!("Streaming = staged: {STREAMING_REASON}"));
    h.get_by_label(&format!("Rank = 16: {RANK_REASON}"));
    h.get_by_label(&format!("Shared-memory guard = true: set by {PRESET}"));
    // The marks sit beside the fields themselves.
    h.get_by_label(&format!("Preset: {RANK_REASON}"));
    h.get_by_label(&format!("Preset: {STREAMING_REASON}"));
    assert_eq!(h.state().config().memory.streaming, StreamingMode::Staged);
}

#[test]
fn invalid_values_are_marked_in_place_and_block_start() {
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    h.get_by_label("Config").click();
    settle(&mut h);

    h.get_by_label("Rank").set_text_value_accesskit("256");
    settle(&mut h);
    h.get_by_label(RANK_LIMIT_MESSAGE);

    h.get_by_label("Learning rate")
        .set_text_value_accesskit("fast");
    settle(&mut h);
    h.get_by_label("Enter a number like 2e-4 (not \"fast\")");

    h.get_by_label("Train").click();
    settle(&mut h);
    h.get_by_label("The config has 2 problem(s); see the Config tab");
    h.get_by_label("Start").click();
    settle(&mut h);
    assert_eq!(backend.engines_spawned(), 0, "no run reaches the engine");
    h.get_by_label("Run failed");
}

#[test]
fn start_sends_the_edited_config_as_start_run() {
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label(PRESET).click();
    settle(&mut h);
    let expected = h.state().config().clone();
    assert!(
        expected.model.demo,
        "the first start opens the demo project"
    );

    let engine = start_run(&backend, &mut h);
    match engine.commands.try_recv() {
        Ok(Command::StartRun(start)) => {
            assert_eq!(start.config, expected);
            assert_eq!(start.resume_from, None);
        }
        other => panic!("expected StartRun, got {other:?}"),
    }
    assert!(engine.commands.try_recv().is_err(), "exactly one command");
    h.get_by_label("State: preparing");
}

#[test]
fn progress_events_move_the_charts_and_eta() {
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    let engine = start_run(&backend, &mut h);
    assert!(matches!(
        engine.commands.try_recv(),
        Ok(Command::StartRun(_))
    ));
    h.get_by_label("ETA —");

    engine
        .events
        .send(Event::StateChanged(RunState::Training))
        .unwrap();
    engine.events.send(progress(10, 180.0)).unwrap();
    settle(&mut h);
    h.get_by_label("ETA 3 m 00 s");
    h.get_by_label("Step time 2.00 s");
    assert_eq!(h.state().run_view().points.len(), 1);

    engine.events.send(progress(20, 160.0)).unwrap();
    engine.events.send(progress(30, 140.0)).unwrap();
    settle(&mut h);
    h.get_by_label("ETA 2 m 20 s");
    h.get_by_label("Loss 0.4700 (smoothed 0.4500)");
    let steps: Vec<usize> = h.state().run_view().points.iter().map(|p| p.step).collect();
    assert_eq!(steps, vec![10, 20, 30]);

    // Pause is offered while training, and sends Pause.
    h.get_by_label("Pause").click();
    settle(&mut h);
    assert_eq!(engine.commands.try_recv(), Ok(Command::Pause));
}

#[test]
fn failed_event_shows_its_message_and_the_app_stays_usable() {
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    let engine = start_run(&backend, &mut h);
    assert!(matches!(
        engine.commands.try_recv(),
        Ok(Command::StartRun(_))
    ));
    let message = "CUDA out of memory at block 12: lower the resolution or stream more blocks";
    engine
        .events
        .send(Event::StateChanged(RunState::Training))
        .unwrap();
    engine
        .events
        .send(Event::Failed {
            message: message.into(),
        })
        .unwrap();
    settle(&mut h);

    h.get_by_label("Run failed");
    h.get_by_label(message);
    h.get_by_label("State: failed");

    // Other tabs still work, and a new run can start on the same engine.
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label("Rank");
    h.get_by_label("Train").click();
    settle(&mut h);
    h.get_by_label("Start").click();
    settle(&mut h);
    assert!(matches!(
        engine.commands.try_recv(),
        Ok(Command::StartRun(_))
    ));
    assert!(
        h.query_by_label(message).is_none(),
        "a new run clears the old failure"
    );
}

#[test]
fn engine_that_cannot_start_is_a_failure_not_a_crash() {
    let backend = FakeBackend::failing_engine("no CUDA device and the demo model is off");
    let mut h = harness(backend);
    h.get_by_label("Train").click();
    settle(&mut h);
    h.get_by_label("Start").click();
    settle(&mut h);
    h.get_by_label("The training engine could not start: no CUDA device and the demo model is off");
    assert!(h.state().run_view().can_start());
}

#[test]
fn queued_runs_start_one_after_another() {
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    h.get_by_label("Train").click();
    settle(&mut h);
    h.get_by_label("Add to queue").click();
    settle(&mut h);
    h.get_by_label("Add to queue").click();
    settle(&mut h);
    h.get_by_label("1. demo (100 steps)");
    h.get_by_label("2. demo (100 steps)");

    h.get_by_label("Start queue").click();
    settle(&mut h);
    let engine = backend.engine();
    assert!(matches!(
        engine.commands.try_recv(),
        Ok(Command::StartRun(_))
    ));
    assert!(h.query_by_label("2. demo (100 steps)").is_none());

    engine
        .events
        .send(Event::StateChanged(RunState::Training))
        .unwrap();
    engine
        .events
        .send(Event::StateChanged(RunState::Finished))
        .unwrap();
    // The engine reports Idle after every run; the next run, already begun, stays preparing.
    engine
        .events
        .send(Event::StateChanged(RunState::Idle))
        .unwrap();
    settle(&mut h);
    h.get_by_label("State: preparing");
    assert!(
        matches!(engine.commands.try_recv(), Ok(Command::StartRun(_))),
        "the next run started by itself"
    );
    assert!(h.query_by_label("1. demo (100 steps)").is_none());
}

#[test]
fn player_steps_frames_of_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let frames = frames_dir(dir.path(), 3, 8);
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    let engine = start_run(&backend, &mut h);
    engine
        .events
        .send(Event::SampleReady {
            step: 50,
            file: PathBuf::from("sample_000050.mp4"),
            frames,
            prompt: "a red fox in snow".into(),
            controls: Vec::new(),
        })
        .unwrap();
    settle(&mut h);
    h.get_by_label("Samples").click();
    settle(&mut h);
    h.get_by_label("Play step 50").click();
    settle(&mut h);

    h.get_by_label("Frame 1 / 3");
    h.get_by_label("8 fps");
    assert_eq!(h.state().shown_sample_frame(), Some(0));

    h.get_by_label("Next frame").click();
    settle(&mut h);
    h.get_by_label("Frame 2 / 3");
    assert_eq!(h.state().shown_sample_frame(), Some(1));

    h.get_by_label("Next frame").click();
    settle(&mut h);
    h.get_by_label("Next frame").click();
    settle(&mut h);
    h.get_by_label("Frame 3 / 3");
    assert_eq!(
        h.state().shown_sample_frame(),
        Some(2),
        "stepping stops at the last frame"
    );

    h.get_by_label("Previous frame").click();
    settle(&mut h);
    assert_eq!(h.state().shown_sample_frame(), Some(1));

    h.get_by_label("Play").click();
    settle(&mut h);
    h.get_by_label("Pause");
}

#[test]
fn an_image_sample_shows_still() {
    let dir = tempfile::tempdir().unwrap();
    // A FLUX.1 run's sample: one PNG, which is both the sample's file and what the player shows.
    let image = dir.path().join("000004-00.png");
    png(&image, [200, 40, 40, 255]);
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    let engine = start_run(&backend, &mut h);
    engine
        .events
        .send(Event::SampleReady {
            step: 4,
            file: image.clone(),
            frames: image,
            prompt: "a red fox in snow".into(),
            controls: Vec::new(),
        })
        .unwrap();
    settle(&mut h);
    h.get_by_label("Samples").click();
    settle(&mut h);
    assert!(h.query_by_label("Play step 4").is_none());
    h.get_by_label("Show step 4").click();
    settle(&mut h);

    assert_eq!(h.state().shown_sample_frame(), Some(0));
    h.get_by_label("Image, 8×6");
    for control in ["Play", "Next frame", "Previous frame", "Frame 1 / 1"] {
        assert!(h.query_by_label(control).is_none(), "{control}");
    }
    assert!(h.query_by_label("Result").is_none(), "not an edit sample");
}

#[test]
fn an_edit_sample_shows_its_source_beside_the_result() {
    let dir = tempfile::tempdir().unwrap();
    // A FLUX.1 Kontext run's sample of a prompt line with `--ci source.png`.
    let (image, source) = (
        dir.path().join("000004-00.png"),
        dir.path().join("source.png"),
    );
    png(&image, [200, 40, 40, 255]);
    png(&source, [40, 40, 200, 255]);
    let backend = FakeBackend::new();
    let mut h = harness(Arc::clone(&backend));
    let engine = start_run(&backend, &mut h);
    engine
        .events
        .send(Event::SampleReady {
            step: 4,
            file: image.clone(),
            frames: image,
            prompt: "make the fox red".into(),
            controls: vec![source],
        })
        .unwrap();
    settle(&mut h);
    h.get_by_label("Samples").click();
    settle(&mut h);
    assert!(
        h.query_by_label("Source: source.png").is_none(),
        "nothing open yet"
    );
    h.get_by_label("Show step 4").click();
    settle(&mut h);
    h.get_by_label("Source: source.png");
    h.get_by_label("Result");
    h.get_by_label("Image, 8×6");
}

// ---- closing the window during a run; the output folder ----

/// A run the fake engine reports training.
fn training(
    backend: &FakeBackend,
    h: &mut egui_kittest::Harness<'_, framesmith_app::FramesmithApp>,
) -> framesmith_config::protocol::EngineEnd {
    let engine = start_run(backend, h);
    assert!(matches!(
        engine.commands.try_recv(),
        Ok(Command::StartRun(_))
    ));
    assert!(engine
        .events
        .send(Event::StateChanged(RunState::Training))
        .is_ok());
    settle(h);
    engine
}

fn request_close(h: &mut egui_kittest::Harness<'_, framesmith_app::FramesmithApp>) {
    h.input_mut()
        .viewports
        .entry(egui::ViewportId::ROOT)
        .or_default()
        .events
        .push(egui::ViewportEvent::Close);
    settle(h);
}

/// Steps a few frames; whether any of them told the window to close.
fn closes(h: &mut egui_kittest::Harness<'_, framesmith_app::FramesmithApp>) -> bool {
    (0..4).any(|_| {
        h.step();
        h.output()
            .viewport_output
            .get(&egui::ViewportId::ROOT)
            .is_some_and(|v| v.commands.contains(&egui::ViewportCommand::Close))
    })
}

#[test]
fn closing_during_a_run_asks_then_saves_before_it_closes() {
    let backend = FakeBackend::new();
    let mut h = harness(backend.clone());
    let engine = training(&backend, &mut h);
    request_close(&mut h);
    h.get_by_label("A run is in progress");
    h.get_by_label("Stop, save and close").click();
    settle(&mut h);
    assert!(matches!(engine.commands.try_recv(), Ok(Command::Stop)));
    h.get_by_label("Saving…");
    assert!(!closes(&mut h), "closed before the run was saved");

    engine
        .events
        .send(Event::StateChanged(RunState::Saving))
        .unwrap();
    assert!(!closes(&mut h), "closed while saving");
    engine
        .events
        .send(Event::StateChanged(RunState::Stopped))
        .unwrap();
    assert!(
        closes(&mut h),
        "the window stayed open after the run was saved"
    );
}

#[test]
fn keep_training_leaves_the_run_alone() {
    let backend = FakeBackend::new();
    let mut h = harness(backend.clone());
    let engine = training(&backend, &mut h);
    request_close(&mut h);
    h.get_by_label("Keep training").click();
    settle(&mut h);
    assert!(engine.commands.try_recv().is_err(), "a command was sent");
    assert!(h.query_by_label("A run is in progress").is_none());
    assert!(!closes(&mut h));
    assert_eq!(h.state().run_view().state, RunState::Training);
}

#[test]
fn closing_without_a_run_is_not_held() {
    let mut h = harness(FakeBackend::new());
    request_close(&mut h);
    assert!(h.query_by_label("A run is in progress").is_none());
}

#[test]
fn the_train_tab_says_what_the_output_folder_holds() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("demo-state-000040")).unwrap();
    std::fs::write(
        out.join("demo-state-000040/state.json"),
        r#"{"format":1,"step":40,"seed":42,"accumulation":1,"total_steps":100,"lora_modules":20}"#,
    )
    .unwrap();
    std::fs::write(out.join("metrics.jsonl"), "").unwrap();
    let mut h = harness(FakeBackend::new());
    h.get_by_label("Config").click();
    settle(&mut h);
    h.get_by_label("Output folder")
        .set_text_value_accesskit(&out.to_string_lossy());
    settle(&mut h);
    h.get_by_label("Train").click();
    settle(&mut h);
    let run_2 = out.join("run-2");
    h.get_by_label_contains("saved at step 40");
    h.get_by_label_contains(&format!("Start begins a new run in {}", run_2.display()));
}

/// `framesmith --open RUN_TOML` opens that config, and Ctrl+Enter starts it from any tab, as Start does.
#[test]
fn the_start_shortcut_starts_the_opened_project_from_any_tab() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("run.toml");
    let mut config = framesmith_config::RunConfig::default();
    config.model.demo = true;
    config.lora.rank = 7;
    config.output.output_dir = dir.path().join("out");
    std::fs::write(&project, config.to_toml_string().unwrap()).unwrap();

    let backend = FakeBackend::new();
    let mut options = framesmith_app::AppOptions::for_tests(Arc::clone(&backend) as _);
    options.project = Some(project);
    let mut h = app_support::harness_with(options);
    settle(&mut h);
    assert_eq!(h.state().config().lora.rank, 7, "the opened project");
    h.get_by_label("Config").click();
    settle(&mut h);
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::Enter);
    settle(&mut h);
    let engine = backend.engine();
    match engine.commands.try_recv() {
        Ok(Command::StartRun(start)) => assert_eq!(start.config.lora.rank, 7),
        other => panic!("expected StartRun, got {other:?}"),
    }
    // A second press while the run is active starts nothing.
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::Enter);
    settle(&mut h);
    assert_eq!(backend.engines_spawned(), 0, "no second engine");
    assert!(engine.commands.try_recv().is_err(), "exactly one command");
}
