//! The engine thread driven only through `protocol`, as the app drives it: start, pause, save now, resume, stop;
//! a failing run reports `Failed` and the engine takes the next run.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::sync::mpsc::Receiver;
use std::time::Duration;

use framesmith::config::{presets, RunConfig};
use framesmith::protocol::{Command, Event, RunState, StartRun};

/// Generous: only reached when the engine is stuck.
const EVENT_TIMEOUT: Duration = Duration::from_secs(120);

fn demo_config(dir: &std::path::Path, steps: usize) -> RunConfig {
    let mut config = presets::builtin("demo-cpu")
        .and_then(|p| p.apply(&RunConfig::default()))
        .expect("preset")
        .config;
    config.training.max_train_steps = steps;
    config.optimizer.lr_warmup_steps = 0;
    config.output.output_dir = dir.to_path_buf();
    config.output.save_every_n_steps = Some(0);
    config
}

fn start(config: RunConfig) -> Command {
    Command::StartRun(Box::new(StartRun {
        config,
        resume_from: None,
    }))
}

/// Receives events until one matches; returns it.
fn wait_for(events: &Receiver<Event>, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
    loop {
        let event = events
            .recv_timeout(EVENT_TIMEOUT)
            .unwrap_or_else(|_| panic!("no {what} event"));
        if pred(&event) {
            return event;
        }
    }
}

#[test]
fn pause_save_resume_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = framesmith::train::engine::spawn().expect("engine");
    engine
        .commands
        .send(start(demo_config(dir.path(), 100_000)))
        .unwrap();
    wait_for(
        &engine.events,
        "progress",
        |e| matches!(e, Event::Progress(p) if p.step >= 2),
    );
    engine.commands.send(Command::Pause).unwrap();
    wait_for(&engine.events, "paused", |e| {
        *e == Event::StateChanged(RunState::Paused)
    });
    engine.commands.send(Command::SaveNow).unwrap();
    let saved = wait_for(&engine.events, "checkpoint", |e| {
        matches!(e, Event::CheckpointSaved { .. })
    });
    let Event::CheckpointSaved { step, lora, state } = saved else {
        unreachable!()
    };
    assert!(step >= 2 && lora.exists() && state.is_some_and(|s| s.join("state.json").exists()));
    // Paused: no progress until resumed.
    assert!(engine
        .events
        .try_iter()
        .all(|e| !matches!(e, Event::Progress(_))));
    engine.commands.send(Command::Resume).unwrap();
    wait_for(&engine.events, "training", |e| {
        *e == Event::StateChanged(RunState::Training)
    });
    wait_for(
        &engine.events,
        "progress after resume",
        |e| matches!(e, Event::Progress(p) if p.step > step),
    );
    engine.commands.send(Command::Stop).unwrap();
    let last = wait_for(&engine.events, "final checkpoint", |e| {
        matches!(e, Event::CheckpointSaved { .. })
    });
    assert!(
        matches!(last, Event::CheckpointSaved { lora, .. } if lora.ends_with("demo-lora.safetensors"))
    );
    wait_for(&engine.events, "stopped", |e| {
        *e == Event::StateChanged(RunState::Stopped)
    });
}

#[test]
fn a_failed_run_reports_and_the_engine_takes_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = framesmith::train::engine::spawn().expect("engine");
    let mut bad = demo_config(dir.path(), 5);
    bad.lora.rank = 0;
    bad.optimizer.learning_rate = -1.0;
    engine.commands.send(start(bad)).unwrap();
    let failed = wait_for(&engine.events, "failed", |e| {
        matches!(e, Event::Failed { .. })
    });
    let Event::Failed { message } = failed else {
        unreachable!()
    };
    assert!(
        message.contains("lora.rank") && message.contains("optimizer.learning_rate"),
        "{message}"
    );
    wait_for(&engine.events, "idle", |e| {
        *e == Event::StateChanged(RunState::Idle)
    });

    engine
        .commands
        .send(start(demo_config(dir.path(), 3)))
        .unwrap();
    wait_for(&engine.events, "finished", |e| {
        *e == Event::StateChanged(RunState::Finished)
    });
}
