//! The engine thread driven only through `protocol`, as the app drives it: start, pause, save now, resume, stop;
//! a failing run reports `Failed` and the engine takes the next run. Runs own their outputs: a second run into
//! the same output folder never deletes or replaces the first's files, `--resume` continues the run whose config
//! matches (and refuses a finished run or a changed setting before writing anything), and `metrics.jsonl` has one
//! row per step of a run, also across a resume.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, SystemTime};

use framesmith_config::protocol::{Command, Event, RunState, StartRun};
use framesmith_config::{presets, RunConfig};

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
    let engine = framesmith_engine::train::engine::spawn().expect("engine");
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
fn a_stop_while_the_run_is_prepared_ends_it_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = framesmith_engine::train::engine::spawn().expect("engine");
    // The Stop follows the start at once; the preparation (model, data, samples) reads many tensors, at each of
    // which a stop ends it. A try counts only when the Stop arrived before the preparation ended (the test thread
    // may be descheduled for that long on a busy machine); the old engine trained first and stopped after.
    let prepared_stops = (0..5).find_map(|_| {
        engine
            .commands
            .send(start(demo_config(dir.path(), 100_000)))
            .unwrap();
        engine.commands.send(Command::Stop).unwrap();
        let (mut trained, mut logs) = (false, Vec::new());
        loop {
            match engine.events.recv_timeout(EVENT_TIMEOUT).expect("an event") {
                Event::StateChanged(RunState::Training) => trained = true,
                Event::Log { message, .. } => logs.push(message),
                Event::StateChanged(RunState::Stopped) => break,
                _ => {}
            }
        }
        wait_for(&engine.events, "idle", |e| {
            *e == Event::StateChanged(RunState::Idle)
        });
        (!trained).then_some(logs)
    });
    let logs = prepared_stops
        .expect("a stop during preparation stopped it before training, in one of 5 tries");
    assert!(
        logs.iter()
            .any(|l| l.contains("stopped while the run was being prepared")),
        "{logs:?}"
    );
    let written: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(
        written.is_empty(),
        "a stopped preparation writes nothing: {written:?}"
    );
    // The Stop was this run's: the next run trains to its end.
    engine
        .commands
        .send(start(demo_config(dir.path(), 2)))
        .unwrap();
    wait_for(&engine.events, "finished", |e| {
        *e == Event::StateChanged(RunState::Finished)
    });
}

#[test]
fn a_failed_run_reports_and_the_engine_takes_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = framesmith_engine::train::engine::spawn().expect("engine");
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

// ---- runs own their outputs ----

/// The demo on generated data, saving a LoRA and a state every `save_every` steps, named `reuse`.
fn reuse_config(out: &Path, steps: usize, save_every: usize) -> RunConfig {
    let mut config = presets::builtin("demo-cpu")
        .and_then(|p| p.apply(&RunConfig::default()))
        .expect("preset")
        .config;
    config.dataset.synthetic = true;
    config.training.max_train_steps = steps;
    config.optimizer.lr_warmup_steps = 0;
    config.output.output_dir = out.to_path_buf();
    config.output.output_name = "reuse".into();
    config.output.save_every_n_steps = Some(save_every);
    config.output.save_every_n_epochs = Some(0);
    config.output.save_state = true;
    config.sampling = Default::default();
    config
}

/// Runs one config on `engine` to its end: the final state and, for a failure, its message.
fn run(
    engine: &framesmith_config::protocol::EngineHandle,
    config: RunConfig,
    resume_from: Option<PathBuf>,
) -> (RunState, String) {
    engine
        .commands
        .send(Command::StartRun(Box::new(StartRun {
            config,
            resume_from,
        })))
        .unwrap();
    let mut failure = String::new();
    loop {
        match engine.events.recv_timeout(EVENT_TIMEOUT).expect("an event") {
            Event::Failed { message } => failure = message,
            Event::StateChanged(RunState::Idle) => {
                let state = if failure.is_empty() {
                    RunState::Finished
                } else {
                    RunState::Failed
                };
                return (state, failure);
            }
            _ => {}
        }
    }
}

/// Every file under `dir` (not descending into `skip`) with its modification time and length.
fn files(dir: &Path, skip: &Path) -> BTreeMap<PathBuf, (SystemTime, u64)> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path == skip {
            continue;
        }
        if path.is_dir() {
            found.extend(files(&path, skip));
        } else {
            let meta = entry.metadata().unwrap();
            found.insert(path, (meta.modified().unwrap(), meta.len()));
        }
    }
    found
}

fn metric_steps(metrics: &Path) -> Vec<u64> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

fn state_steps(dir: &Path) -> Vec<usize> {
    framesmith_config::outputs::states_in(dir, Some("reuse"))
        .into_iter()
        .map(|s| s.step)
        .collect()
}

fn lora_steps(path: &Path) -> String {
    let lora = framesmith_nn::lora_file::LoraFile::load(path, &candle_core::Device::Cpu).unwrap();
    lora.metadata["ss_steps"].clone()
}

#[test]
fn a_second_run_into_the_same_folder_keeps_the_first_and_its_own_states() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let engine = framesmith_engine::train::engine::spawn().unwrap();

    let first = reuse_config(&out, 8, 2);
    assert_eq!(run(&engine, first.clone(), None).0, RunState::Finished);
    assert_eq!(state_steps(&out), [6, 8]);
    let second_dir = out.join("run-2");
    let before = files(&out, &second_dir);

    // The same config with fewer steps and another save interval: a new run, in its own folder.
    let second = reuse_config(&out, 4, 4);
    assert_eq!(run(&engine, second.clone(), None).0, RunState::Finished);
    assert_eq!(
        files(&out, &second_dir),
        before,
        "the first run's files were touched"
    );
    assert_eq!(
        state_steps(&second_dir),
        [4],
        "the second run's own state was pruned"
    );
    assert_eq!(lora_steps(&second_dir.join("reuse.safetensors")), "4");
    assert_eq!(
        metric_steps(&second_dir.join("metrics.jsonl")),
        [1, 2, 3, 4]
    );

    // `--resume <folder>` takes the newest run whose config matches: the finished second run. Refused, and
    // nothing is written.
    let (state, message) = run(&engine, second, Some(out.clone()));
    assert_eq!(state, RunState::Failed);
    assert!(message.contains("already reached step 4"), "{message}");
    assert_eq!(lora_steps(&second_dir.join("reuse.safetensors")), "4");
    assert_eq!(files(&out, &second_dir), before);

    // A changed LoRA rank is a config mismatch, named as such.
    let mut other_rank = reuse_config(&out, 12, 2);
    other_rank.lora.rank += 4;
    let (state, message) = run(&engine, other_rank, Some(out.join("reuse-state-000008")));
    assert_eq!(state, RunState::Failed);
    assert!(
        message.contains("lora.rank") && !message.contains("damaged"),
        "{message}"
    );

    // The first run's state with more steps continues the first run, in its folder, one metrics row a step.
    let longer = reuse_config(&out, 12, 2);
    let state_8 = out.join("reuse-state-000008");
    assert_eq!(run(&engine, longer, Some(state_8)).0, RunState::Finished);
    assert_eq!(state_steps(&out), [10, 12]);
    assert_eq!(lora_steps(&out.join("reuse.safetensors")), "12");
    assert_eq!(
        metric_steps(&out.join("metrics.jsonl")),
        (1..=12).collect::<Vec<_>>()
    );
    assert_eq!(
        state_steps(&second_dir),
        [4],
        "resuming the first run left the second alone"
    );
}

#[test]
fn a_resume_after_a_stop_rewrites_the_steps_after_the_state_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let engine = framesmith_engine::train::engine::spawn().unwrap();
    assert_eq!(
        run(&engine, reuse_config(&out, 6, 3), None).0,
        RunState::Finished
    );
    // Steps 4..6 are trained again from the state at step 3; their rows appear once.
    std::fs::remove_dir_all(out.join("reuse-state-000006")).unwrap();
    let more = reuse_config(&out, 7, 3);
    assert_eq!(
        run(&engine, more, Some(out.join("reuse-state-000003"))).0,
        RunState::Finished
    );
    assert_eq!(
        metric_steps(&out.join("metrics.jsonl")),
        (1..=7).collect::<Vec<_>>()
    );
}
