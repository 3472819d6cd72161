//! One stop is one save: a stop delivered twice at once (by a shell, by `timeout` to the process and then to its
//! group) saves like a single Ctrl-C, and a stop during a long sample is honoured within seconds, with the save.
#![cfg(unix)]
#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use framesmith_config::outputs::StateRecord;
use framesmith_config::RunConfig;

mod cli_support;
use cli_support::{read_until, spawn_with_stderr, StderrLines};

/// A stop must end the run well within this (a liveness bound for a test that would otherwise hang, not a speed
/// goal: the long sample below takes many minutes).
const STOP_LIMIT: Duration = Duration::from_secs(120);

fn framesmith() -> Command {
    Command::new(env!("CARGO_BIN_EXE_framesmith"))
}

/// The demo project in `dir` (its caches and sample prompts), and a run config over it that trains without end,
/// saving its state at every step; with `long_samples`, a sample after every step takes many minutes.
fn demo_run(dir: &Path, long_samples: bool) -> PathBuf {
    let demo = dir.join("demo");
    let made = framesmith()
        .args(["demo", "--steps", "1", "--out"])
        .arg(&demo)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mut config = RunConfig::load(&demo.join("output").join("run.toml")).unwrap();
    config.training.max_train_steps = 100_000;
    config.output.output_dir = dir.join("out");
    config.output.save_every_n_steps = Some(1);
    config.output.save_every_n_epochs = Some(0);
    config.output.save_state = true;
    config.sampling.sample_at_first = false;
    if long_samples {
        let prompts = demo.join("sample_prompts.txt");
        let text = std::fs::read_to_string(&prompts).unwrap();
        assert!(text.contains("--s 20"), "{text}");
        std::fs::write(&prompts, text.replace("--s 20", "--s 1000000")).unwrap();
        config.sampling.sample_every_n_steps = Some(1);
    } else {
        config.sampling = Default::default();
    }
    let path = dir.join("run.toml");
    config.save(&path).unwrap();
    path
}

/// Starts `command` and reads its stderr up to the first step's save.
fn start_until_saved(command: Command) -> (Child, StderrLines) {
    let (mut child, mut lines) = spawn_with_stderr(command);
    let seen = read_until(&mut lines, |l| {
        l.starts_with("step ") && l.contains("saved")
    });
    if seen.last().is_some_and(|l| l.contains("saved")) {
        return (child, lines);
    }
    child.kill().ok();
    child.wait().ok();
    panic!("the run ended before its first save:\n{}", seen.join("\n"));
}

fn train(config: &Path) -> Command {
    let mut command = framesmith();
    command.arg("train").arg("--config").arg(config);
    command
}

/// Sends `signal` to `pid` `times` times from one shell, microseconds apart.
fn signal(pid: u32, signal: &str, times: usize) {
    let kill = format!("kill -{signal} {pid}; ").repeat(times);
    assert!(Command::new("sh")
        .arg("-c")
        .arg(kill)
        .status()
        .unwrap()
        .success());
}

/// Waits for `child` to end within [`STOP_LIMIT`] (killing it otherwise) and returns its exit code and the rest
/// of its stderr.
fn end_of(mut child: Child, lines: StderrLines) -> (Option<i32>, String) {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > STOP_LIMIT {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the run did not stop within {STOP_LIMIT:?} of the signal");
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    let code = child.wait().unwrap().code();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    (code, rest.join("\n"))
}

/// The run saved its LoRA and state when stopped, and said how to go on from that state.
fn assert_saved_once(code: Option<i32>, text: &str) -> StateRecord {
    assert_eq!(code, Some(130), "{text}");
    assert!(text.contains("stopping: saving the LoRA"), "{text}");
    assert!(
        !text.contains("exiting now"),
        "a repeated stop was taken as a second press:\n{text}"
    );
    let hint = text
        .lines()
        .find(|l| l.starts_with("to go on later: framesmith train --config"))
        .unwrap_or_else(|| panic!("no resume command in\n{text}"));
    let state = PathBuf::from(hint.rsplit_once(" --resume ").unwrap().1);
    let record = StateRecord::read(&state).unwrap();
    assert!(record.step >= 1, "{record:?}");
    record
}

#[test]
fn two_interrupts_a_moment_apart_are_one_stop() {
    let dir = tempfile::tempdir().unwrap();
    let config = demo_run(dir.path(), false);
    let (child, lines) = start_until_saved(train(&config));
    signal(child.id(), "INT", 2);
    let (code, text) = end_of(child, lines);
    assert_saved_once(code, &text);
}

#[test]
fn an_interrupt_through_timeout_is_one_stop() {
    let dir = tempfile::tempdir().unwrap();
    let config = demo_run(dir.path(), false);
    // `timeout` passes a signal it receives to its child and then to its whole process group: the run gets it
    // twice, as when `timeout`'s own limit is reached.
    let mut command = Command::new("timeout");
    command
        .args(["-s", "INT", "600"])
        .arg(env!("CARGO_BIN_EXE_framesmith"))
        .arg("train")
        .arg("--config")
        .arg(&config);
    let (child, lines) = start_until_saved(command);
    signal(child.id(), "INT", 1);
    let (code, text) = end_of(child, lines);
    assert_saved_once(code, &text);
}

#[test]
fn a_terminate_during_a_long_sample_stops_and_saves() {
    let dir = tempfile::tempdir().unwrap();
    let config = demo_run(dir.path(), true);
    // The first step is saved, then its sample (a million denoising steps) begins.
    let (child, lines) = start_until_saved(train(&config));
    signal(child.id(), "TERM", 1);
    let (code, text) = end_of(child, lines);
    let record = assert_saved_once(code, &text);
    assert_eq!(record.step, 1, "{text}");
}
