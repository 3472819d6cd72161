//! Headless runs: drives the engine thread through the protocol, as the app does, and shows progress in the
//! terminal (a progress bar on a terminal, plain lines otherwise). One run (`framesmith demo`, `train` with one
//! config) or a queue of runs one after another on the same engine thread (`train` with several configs).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use framesmith::config::RunConfig;
use framesmith::protocol::{Command, EngineHandle, Event, LogLevel, Progress, RunState, StartRun};
use indicatif::{ProgressBar, ProgressStyle};

/// What a finished headless run produced.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub last_lora: Option<PathBuf>,
    pub samples: Vec<PathBuf>,
    pub first_loss: Option<f64>,
    pub last_smoothed_loss: Option<f64>,
}

/// How one run ended.
#[derive(Debug)]
pub enum RunEnd {
    Finished(RunSummary),
    Stopped(RunSummary),
    /// The run could not start or failed on the way: its config could not be loaded, or the engine reported
    /// `Failed` with this message.
    Failed(String),
}

impl RunEnd {
    /// The word of the queue's closing summary; for a failure, the first line of its message (and the line
    /// after it when the first only announces a list, as validation's "the run config has 1 problem:").
    pub fn label(&self) -> String {
        match self {
            Self::Finished(_) => "finished".into(),
            Self::Stopped(_) => "stopped".into(),
            Self::Failed(message) => {
                let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
                let first = lines.next().unwrap_or_default();
                match lines.next() {
                    Some(next) if first.ends_with(':') => format!("failed: {first} {next}"),
                    _ => format!("failed: {first}"),
                }
            }
        }
    }
}

/// One config of a queue and how its run ended; `None` when it never started because an earlier run was
/// stopped (a stop holds the rest of the queue, as in the app).
pub type QueuedEnd = (PathBuf, Option<RunEnd>);

/// Runs `config` to completion on a new engine thread; errors carry the engine's message.
pub fn run_headless(config: RunConfig, resume_from: Option<PathBuf>) -> anyhow::Result<RunSummary> {
    let engine = framesmith::train::engine::spawn().context("cannot start the engine thread")?;
    match drive(&engine, config, resume_from)? {
        RunEnd::Finished(summary) | RunEnd::Stopped(summary) => Ok(summary),
        RunEnd::Failed(message) => anyhow::bail!("{message}"),
    }
}

/// Runs the configs one after another on one engine thread, as the app's run queue does: `load` reads each
/// config when its turn comes; a config that cannot be loaded, or a run that fails, is reported
/// (`error: <config>: <message>`) and the next one starts. `resume_from` applies to the first run. Errors only
/// when the engine thread cannot be started or goes away.
pub fn run_queue(
    configs: &[PathBuf],
    mut load: impl FnMut(&Path) -> anyhow::Result<RunConfig>,
    mut resume_from: Option<PathBuf>,
) -> anyhow::Result<Vec<QueuedEnd>> {
    let engine = framesmith::train::engine::spawn().context("cannot start the engine thread")?;
    let mut ends: Vec<QueuedEnd> = Vec::with_capacity(configs.len());
    let mut held = false;
    for path in configs {
        if held {
            ends.push((path.clone(), None));
            continue;
        }
        if configs.len() > 1 {
            eprintln!(
                "run {}/{}: {}",
                ends.len() + 1,
                configs.len(),
                path.display()
            );
        }
        let end = match load(path) {
            Ok(config) => drive(&engine, config, resume_from.take())?,
            Err(err) => RunEnd::Failed(format!("{err:#}")),
        };
        if let RunEnd::Failed(message) = &end {
            eprintln!("error: {}: {message}", path.display());
        }
        held = matches!(end, RunEnd::Stopped(_));
        ends.push((path.clone(), Some(end)));
    }
    Ok(ends)
}

/// The closing summary of a queue: one line per config.
pub fn summary_lines(ends: &[QueuedEnd]) -> Vec<String> {
    ends.iter()
        .map(|(path, end)| {
            let label = end.as_ref().map_or(
                "not started (an earlier run was stopped)".into(),
                RunEnd::label,
            );
            format!("{}: {label}", path.display())
        })
        .collect()
}

/// Starts one run on `engine` and follows its events to the end. Errors only when the engine thread is gone.
fn drive(
    engine: &EngineHandle,
    config: RunConfig,
    resume_from: Option<PathBuf>,
) -> anyhow::Result<RunEnd> {
    engine
        .commands
        .send(Command::StartRun(Box::new(StartRun {
            config,
            resume_from,
        })))
        .context("the engine thread stopped")?;
    let mut term = Terminal::new();
    let mut summary = RunSummary::default();
    for event in engine.events.iter() {
        match event {
            Event::Progress(p) => {
                summary.first_loss = summary.first_loss.or(Some(p.loss));
                summary.last_smoothed_loss = Some(p.smoothed_loss);
                term.progress(&p);
            }
            Event::Log { level, message } => term.say(match level {
                LogLevel::Info => message,
                LogLevel::Warn => format!("warning: {message}"),
                LogLevel::Error => format!("error: {message}"),
            }),
            Event::CheckpointSaved { step, lora, .. } => {
                term.say(format!("step {step}: saved {}", lora.display()));
                summary.last_lora = Some(lora);
            }
            Event::SampleReady { step, video, .. } => {
                term.say(format!("step {step}: sample {}", video.display()));
                summary.samples.push(video);
            }
            Event::Failed { message } => {
                term.abandon();
                return Ok(RunEnd::Failed(message));
            }
            Event::StateChanged(RunState::Finished) => {
                term.finish();
                return Ok(RunEnd::Finished(summary));
            }
            Event::StateChanged(RunState::Stopped) => {
                term.finish();
                return Ok(RunEnd::Stopped(summary));
            }
            // The previous run's closing `Idle` arrives here too; only this run's end matters.
            Event::StateChanged(_) => {}
        }
    }
    anyhow::bail!("the engine thread ended without finishing the run")
}

/// Where a run's progress goes: a progress bar on a terminal, a line every 5% otherwise.
struct Terminal {
    bar: Option<ProgressBar>,
    last_printed: usize,
}

impl Terminal {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta_precise}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        Self {
            bar,
            last_printed: 0,
        }
    }

    fn say(&self, line: String) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn progress(&mut self, p: &Progress) {
        let msg = format!(
            "loss {:.4} (avg {:.4})  lr {:.2e}  {:.2}s/step",
            p.loss, p.smoothed_loss, p.learning_rate, p.step_secs
        );
        match &self.bar {
            Some(b) => {
                b.set_length(p.total_steps as u64);
                b.set_position(p.step as u64);
                b.set_message(msg);
            }
            None if p.step == p.total_steps
                || p.step >= self.last_printed + p.total_steps.div_ceil(20) =>
            {
                self.last_printed = p.step;
                eprintln!(
                    "step {}/{}  {msg}  eta {:.0}s",
                    p.step, p.total_steps, p.eta_secs
                );
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }

    fn abandon(&self) {
        if let Some(b) = &self.bar {
            b.abandon();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing
mod tests {
    use super::*;
    use framesmith::config::presets;

    /// The demo model on generated data, a few steps on the CPU, the LoRA saved only at the end.
    fn tiny_demo(output: &Path, steps: usize) -> RunConfig {
        let mut config = presets::builtin("demo-cpu")
            .and_then(|p| p.apply(&RunConfig::default()))
            .expect("demo-cpu preset")
            .config;
        config.dataset.synthetic = true;
        config.training.max_train_steps = steps;
        config.optimizer.lr_warmup_steps = 0;
        config.output.output_dir = output.to_path_buf();
        config.output.save_every_n_steps = Some(0);
        config.output.save_every_n_epochs = Some(0);
        config.output.save_state = false;
        config.sampling = Default::default();
        config
    }

    #[test]
    fn a_failed_run_is_reported_and_the_queue_goes_on_on_the_same_engine() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<PathBuf> = ["bad.toml", "missing.toml", "good.toml"]
            .iter()
            .map(|n| dir.path().join(n))
            .collect();
        let load = |path: &Path| -> anyhow::Result<RunConfig> {
            match path.file_name().and_then(|n| n.to_str()) {
                Some("bad.toml") => {
                    // Fails inside the engine, after StartRun: the validator rejects rank 0.
                    let mut config = tiny_demo(&dir.path().join("bad"), 2);
                    config.lora.rank = 0;
                    Ok(config)
                }
                Some("good.toml") => Ok(tiny_demo(&dir.path().join("good"), 2)),
                _ => RunConfig::load(path).map_err(Into::into),
            }
        };
        let ends = run_queue(&names, load, None).unwrap();
        assert_eq!(ends.len(), 3);
        let Some(RunEnd::Failed(message)) = &ends[0].1 else {
            panic!("the rank-0 run did not fail: {:?}", ends[0].1)
        };
        assert!(message.contains("lora.rank"), "{message}");
        let Some(RunEnd::Failed(message)) = &ends[1].1 else {
            panic!("the missing config did not fail: {:?}", ends[1].1)
        };
        assert!(message.contains("missing.toml"), "{message}");
        let Some(RunEnd::Finished(summary)) = &ends[2].1 else {
            panic!("the good run did not finish: {:?}", ends[2].1)
        };
        let lora = summary.last_lora.as_ref().expect("a LoRA was saved");
        assert!(lora.starts_with(dir.path().join("good")) && lora.exists());
        assert!(!dir.path().join("bad").exists());
        let lines = summary_lines(&ends);
        let failed = format!("{}: failed: ", names[0].display());
        assert!(lines[0].starts_with(&failed), "{}", lines[0]);
        assert!(lines[2].ends_with("good.toml: finished"), "{}", lines[2]);
    }

    #[test]
    fn a_failure_label_keeps_the_first_line_and_the_first_item_of_a_list() {
        let end = RunEnd::Failed("out of memory\nstream 10 blocks".into());
        assert_eq!(end.label(), "failed: out of memory");
        let end = RunEnd::Failed(
            "the run config has 1 problem:\n  - `lora.rank`: must be at least 1\n".into(),
        );
        assert_eq!(
            end.label(),
            "failed: the run config has 1 problem: - `lora.rank`: must be at least 1"
        );
        assert_eq!(RunEnd::Stopped(RunSummary::default()).label(), "stopped");
        let ends = vec![(PathBuf::from("b.toml"), None)];
        assert!(summary_lines(&ends)[0].starts_with("b.toml: not started"));
    }
}
