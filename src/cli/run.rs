//! Headless runs: drives the engine thread through the protocol, as the app does, and shows progress in the
//! terminal (a progress bar on a terminal, plain lines otherwise).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use framesmith::config::RunConfig;
use framesmith::protocol::{Command, Event, LogLevel, RunState, StartRun};
use indicatif::{ProgressBar, ProgressStyle};

/// What a finished headless run produced.
#[derive(Default)]
pub struct RunSummary {
    pub last_lora: Option<PathBuf>,
    pub samples: Vec<PathBuf>,
    pub first_loss: Option<f64>,
    pub last_smoothed_loss: Option<f64>,
}

/// Runs `config` to completion on the engine thread; errors carry the engine's message.
pub fn run_headless(config: RunConfig, resume_from: Option<PathBuf>) -> anyhow::Result<RunSummary> {
    let engine = framesmith::train::engine::spawn().context("cannot start the engine thread")?;
    engine
        .commands
        .send(Command::StartRun(Box::new(StartRun {
            config,
            resume_from,
        })))
        .context("the engine thread stopped")?;
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta_precise}]",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(bar)
    } else {
        None
    };
    let say = |line: String| match &bar {
        Some(b) => b.println(line),
        None => eprintln!("{line}"),
    };
    let mut summary = RunSummary::default();
    let mut last_printed = 0usize;
    for event in engine.events.iter() {
        match event {
            Event::Progress(p) => {
                summary.first_loss = summary.first_loss.or(Some(p.loss));
                summary.last_smoothed_loss = Some(p.smoothed_loss);
                let msg = format!(
                    "loss {:.4} (avg {:.4})  lr {:.2e}  {:.2}s/step",
                    p.loss, p.smoothed_loss, p.learning_rate, p.step_secs
                );
                match &bar {
                    Some(b) => {
                        b.set_length(p.total_steps as u64);
                        b.set_position(p.step as u64);
                        b.set_message(msg);
                    }
                    None if p.step == p.total_steps
                        || p.step >= last_printed + p.total_steps.div_ceil(20) =>
                    {
                        last_printed = p.step;
                        eprintln!(
                            "step {}/{}  {msg}  eta {:.0}s",
                            p.step, p.total_steps, p.eta_secs
                        );
                    }
                    None => {}
                }
            }
            Event::Log { level, message } => say(match level {
                LogLevel::Info => message,
                LogLevel::Warn => format!("warning: {message}"),
                LogLevel::Error => format!("error: {message}"),
            }),
            Event::CheckpointSaved { step, lora, .. } => {
                say(format!("step {step}: saved {}", lora.display()));
                summary.last_lora = Some(lora);
            }
            Event::SampleReady { step, video, .. } => {
                say(format!("step {step}: sample {}", video.display()));
                summary.samples.push(video);
            }
            Event::Failed { message } => {
                if let Some(b) = &bar {
                    b.abandon();
                }
                anyhow::bail!("{message}");
            }
            Event::StateChanged(RunState::Finished | RunState::Stopped) => {
                if let Some(b) = &bar {
                    b.finish();
                }
                return Ok(summary);
            }
            Event::StateChanged(_) => {}
        }
    }
    anyhow::bail!("the engine thread ended without finishing the run")
}
