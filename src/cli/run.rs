//! Headless runs: drives the engine thread through the protocol, as the app does, and shows progress in the
//! terminal (a progress bar on a terminal, plain lines otherwise). One run (`framesmith demo`, `train` with one
//! config) or a queue of runs one after another on the same engine thread (`train` with several configs).

mod spill;
mod terminal;

use std::path::{Path, PathBuf};

use anyhow::Context;
use framesmith_config::protocol::{
    wire, Command, EngineHandle, Event, LogLevel, RunState, StartRun,
};
use framesmith_config::RunConfig;
use spill::{spill_telemetry, Spill, SpillWatch, Telemetry};
use terminal::Terminal;

/// What a finished headless run produced.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub last_lora: Option<PathBuf>,
    pub samples: Vec<PathBuf>,
    pub first_loss: Option<f64>,
    pub last_smoothed_loss: Option<f64>,
    /// The last training state saved, to `--resume` from.
    pub last_state: Option<PathBuf>,
    /// The shared-memory guard stopped the run because it was spilling.
    pub stopped_for_spilling: bool,
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
    /// The word of the queue's closing summary. A failure's message was printed when it happened
    /// (`error: <config>: <message>`), so the summary does not repeat it.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Finished(_) => "finished",
            Self::Stopped(_) => "stopped",
            Self::Failed(_) => "failed (the error is above)",
        }
    }
}

/// Where a run's events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    /// A progress bar or lines on stderr, for a person.
    #[default]
    Terminal,
    /// Every event as a JSON line on stdout (`--events-json`: the app's run over several GPUs); with `commands`
    /// (rank 0), commands are read from stdin the same way, and stdin closing stops the run as Ctrl-C does.
    EventsJson { commands: bool },
}

/// One config of a queue and how its run ended; `None` when it never started because an earlier run was
/// stopped (a stop holds the rest of the queue, as in the app).
pub type QueuedEnd = (PathBuf, Option<RunEnd>);

/// Runs `config` to completion on a new engine thread; errors carry the engine's message.
pub fn run_headless(config: RunConfig, resume_from: Option<PathBuf>) -> anyhow::Result<RunSummary> {
    let engine =
        framesmith_engine::train::engine::spawn().context("cannot start the engine thread")?;
    let telemetry = spill_telemetry();
    match drive(
        &engine,
        config,
        resume_from,
        telemetry.as_ref(),
        Output::Terminal,
    )? {
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
    ranks: framesmith_engine::train::ranks::Ranks,
    output: Output,
) -> anyhow::Result<Vec<QueuedEnd>> {
    let engine = framesmith_engine::train::engine::spawn_ranked(ranks)
        .context("cannot start the engine thread")?;
    if output == (Output::EventsJson { commands: true }) {
        commands_from_stdin(engine.commands.clone());
    }
    let terminal = output == Output::Terminal;
    let telemetry = spill_telemetry();
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
            Ok(config) => drive(
                &engine,
                config,
                resume_from.take(),
                telemetry.as_ref(),
                output,
            )?,
            Err(err) => RunEnd::Failed(format!("{err:#}")),
        };
        // With JSON events the failure and the saved state travel as events.
        if let (RunEnd::Failed(message), true) = (&end, terminal) {
            eprintln!("error: {}: {message}", path.display());
        }
        if let (
            RunEnd::Stopped(RunSummary {
                last_state: Some(state),
                stopped_for_spilling,
                ..
            }),
            true,
        ) = (&end, terminal)
        {
            let when = if *stopped_for_spilling {
                "once it fits"
            } else {
                "later"
            };
            let own: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            eprintln!("to go on {when}: {}", resume_command(&own, path, state));
        }
        held = matches!(end, RunEnd::Stopped(_));
        ends.push((path.clone(), Some(end)));
    }
    Ok(ends)
}

/// The command that continues a stopped run from `state`: `framesmith train` with `config` as its only config,
/// the options this process was given (`own`: its presets, VRAM budget, GPUs — the run's config is what they made
/// of it, and a resume must match it) and `--resume state`.
fn resume_command(own: &[String], config: &Path, state: &Path) -> String {
    let mut words = vec![
        "framesmith train --config".to_string(),
        config.display().to_string(),
    ];
    let mut args = own.iter().skip_while(|a| a.as_str() != "train").skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" | "--resume" => {
                args.next();
            }
            a if a.starts_with("--config=") || a.starts_with("--resume=") => {}
            _ => words.push(arg.clone()),
        }
    }
    words.push(format!("--resume {}", state.display()));
    words.join(" ")
}

/// Reads commands (JSON lines) from stdin for the engine, on a thread of its own; stdin closing (the app is gone)
/// stops the run and saves, as Ctrl-C does.
fn commands_from_stdin(commands: std::sync::mpsc::SyncSender<Command>) {
    use std::io::BufRead;
    let spawned = std::thread::Builder::new()
        .name("commands from stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                match wire::parse_command(&line) {
                    Ok(command) => {
                        if commands.send(command).is_err() {
                            return;
                        }
                    }
                    Err(err) => eprintln!("warning: {err}"),
                }
            }
            let _ = commands.try_send(Command::Stop);
        });
    if let Err(err) = spawned {
        eprintln!("warning: commands on stdin are not read ({err})");
    }
}

/// The closing summary of a queue: one line per config.
pub fn summary_lines(ends: &[QueuedEnd]) -> Vec<String> {
    ends.iter()
        .map(|(path, end)| {
            let label = end
                .as_ref()
                .map_or("not started (an earlier run was stopped)", RunEnd::label);
            format!("{}: {label}", path.display())
        })
        .collect()
}

/// Starts one run on `engine` and follows its events to the end, watching `telemetry` for spilling. Errors only
/// when the engine thread is gone.
fn drive(
    engine: &EngineHandle,
    config: RunConfig,
    resume_from: Option<PathBuf>,
    telemetry: Option<&Telemetry>,
    output: Output,
) -> anyhow::Result<RunEnd> {
    let watch = telemetry.map(|t| SpillWatch::new(t, config.memory.shared_memory_guard));
    engine
        .commands
        .send(Command::StartRun(Box::new(StartRun {
            config,
            resume_from,
        })))
        .context("the engine thread stopped")?;
    super::interrupt::watch(&engine.commands);
    let end = follow(engine, watch, output);
    super::interrupt::unwatch();
    end
}

/// Follows a started run's events to its end.
fn follow(
    engine: &EngineHandle,
    mut watch: Option<SpillWatch>,
    output: Output,
) -> anyhow::Result<RunEnd> {
    let mut term = Terminal::new(output);
    let mut summary = RunSummary::default();
    for event in engine.events.iter() {
        term.event(&event);
        match event {
            Event::Progress(p) => {
                summary.first_loss = summary.first_loss.or(Some(p.loss));
                summary.last_smoothed_loss = Some(p.smoothed_loss);
                term.progress(&p);
                match watch.as_mut().and_then(|w| w.after_step(p.step_secs)) {
                    Some(Spill::Warn(line)) => term.say(format!("warning: {line}")),
                    Some(Spill::Stop(line)) => {
                        term.say(format!("warning: {line}"));
                        engine
                            .commands
                            .send(Command::Stop)
                            .context("the engine thread stopped")?;
                        summary.stopped_for_spilling = true;
                    }
                    None => {}
                }
            }
            Event::Validated(v) => term.say(format!(
                "step {}: validation loss {:.4} ({} held-out item{} × {} timestep{})",
                v.step,
                v.loss,
                v.items,
                if v.items == 1 { "" } else { "s" },
                v.timesteps,
                if v.timesteps == 1 { "" } else { "s" }
            )),
            Event::Log { level, message } => term.say(match level {
                LogLevel::Info => message,
                LogLevel::Warn => format!("warning: {message}"),
                LogLevel::Error => format!("error: {message}"),
            }),
            Event::CheckpointSaved { step, lora, state } => {
                term.say(format!("step {step}: saved {}", lora.display()));
                super::interrupt::saved(&lora, state.as_deref());
                summary.last_lora = Some(lora);
                summary.last_state = state.or(summary.last_state.take());
            }
            Event::SampleReady { step, file, .. } => {
                term.say(format!("step {step}: sample {}", file.display()));
                summary.samples.push(file);
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
            Event::StateChanged(RunState::Idle) => {}
            Event::StateChanged(state) => {
                super::interrupt::preparing(state == RunState::Preparing);
            }
            // The launcher of a run over several GPUs tells the app its rank processes; nothing to show here.
            Event::ProcessesStarted { .. } => {}
            // The app charts a budgeted run as a card of the budget's size; the terminal prints the plan instead.
            Event::VramHeld(_) => {}
        }
    }
    anyhow::bail!("the engine thread ended without finishing the run")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the test failing
mod tests {
    use super::*;
    use framesmith_config::presets;
    use framesmith_config::protocol::Progress;

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
        let ends = run_queue(&names, load, None, Default::default(), Output::Terminal).unwrap();
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
        let failed = format!("{}: failed (the error is above)", names[0].display());
        assert_eq!(lines[0], failed);
        assert!(lines[2].ends_with("good.toml: finished"), "{}", lines[2]);
    }

    /// Step times that slow down threefold after four steps.
    #[cfg(feature = "telemetry")]
    const SLOWING: [f64; 8] = [1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0];

    /// VRAM 97% full and shared memory growing by 500 MiB (as the app's Monitor test).
    #[cfg(feature = "telemetry")]
    fn spilling() -> Telemetry {
        use framesmith_telemetry::{GpuSample, History, Sample, SharedMemorySample};
        let mut history = History::new(10);
        history.gpu_status = Ok(());
        history.shared_status = Ok(());
        for (i, shared_mib) in [100u64, 300, 600].into_iter().enumerate() {
            history.push(Sample {
                at_secs: i as f64,
                gpus: vec![GpuSample {
                    memory_used_bytes: 97,
                    memory_total_bytes: 100,
                    ..GpuSample::default()
                }],
                shared: Some(SharedMemorySample {
                    adapter_bytes: shared_mib << 20,
                    process_bytes: 0,
                }),
                ..Sample::default()
            });
        }
        Telemetry::fixed(history)
    }

    /// Drives a run on a stand-in engine whose steps slow down threefold on a spilling card, then end as `end`
    /// (after a save naming a training state). Returns how the run ended and the commands after `StartRun`.
    #[cfg(feature = "telemetry")]
    fn spilling_run(guard: bool, end: RunState) -> (RunEnd, Vec<Command>) {
        let (engine, end_of_engine) = framesmith_config::protocol::channel_pair();
        for (step, step_secs) in SLOWING.into_iter().enumerate() {
            let progress = Progress {
                step: step + 1,
                total_steps: 100,
                epoch: 1,
                loss: 0.1,
                smoothed_loss: 0.1,
                learning_rate: 1e-4,
                step_secs,
                eta_secs: 100.0,
            };
            end_of_engine
                .events
                .send(Event::Progress(progress))
                .unwrap();
        }
        let saved = Event::CheckpointSaved {
            step: 8,
            lora: PathBuf::from("out/lora.safetensors"),
            state: Some(PathBuf::from("out/state")),
        };
        end_of_engine.events.send(saved).unwrap();
        end_of_engine.events.send(Event::StateChanged(end)).unwrap();
        let mut config = tiny_demo(Path::new("out"), 100);
        config.memory.shared_memory_guard = guard;
        let telemetry = spilling();
        let run_end = drive(&engine, config, None, Some(&telemetry), Output::Terminal).unwrap();
        let commands: Vec<Command> = end_of_engine.commands.try_iter().collect();
        assert!(matches!(commands.first(), Some(Command::StartRun(_))));
        (run_end, commands.into_iter().skip(1).collect())
    }

    #[cfg(feature = "telemetry")]
    #[test]
    fn the_shared_memory_guard_stops_a_spilling_headless_run_once() {
        let (end, commands) = spilling_run(true, RunState::Stopped);
        assert!(
            matches!(commands.as_slice(), [Command::Stop]),
            "stopped once, not at every slow step: {commands:?}"
        );
        let RunEnd::Stopped(summary) = end else {
            panic!("{end:?}")
        };
        assert_eq!(
            summary.last_lora,
            Some(PathBuf::from("out/lora.safetensors"))
        );
        assert_eq!(summary.last_state, Some(PathBuf::from("out/state")));
        assert!(summary.stopped_for_spilling);

        let (end, commands) = spilling_run(false, RunState::Finished);
        assert!(
            commands.is_empty(),
            "without the guard only a warning: {commands:?}"
        );
        let RunEnd::Finished(summary) = end else {
            panic!("{end:?}")
        };
        assert!(!summary.stopped_for_spilling);
    }

    #[cfg(feature = "telemetry")]
    #[test]
    fn the_spill_watch_warns_once_and_says_what_to_change() {
        let telemetry = spilling();
        let said = |guard: bool| -> Vec<Spill> {
            let mut watch = SpillWatch::new(&telemetry, guard);
            SLOWING
                .into_iter()
                .filter_map(|secs| watch.after_step(secs))
                .collect()
        };
        let warned = said(false);
        let [Spill::Warn(line)] = warned.as_slice() else {
            panic!("one warning: {warned:?}")
        };
        assert!(line.starts_with("The driver is spilling VRAM into shared memory: VRAM 97% full"));
        assert!(line.contains("memory.shared_memory_guard = true"), "{line}");

        let stopped = said(true);
        let [Spill::Stop(line)] = stopped.as_slice() else {
            panic!("one stop: {stopped:?}")
        };
        assert!(
            line.contains("Stopping the run and saving its LoRA"),
            "{line}"
        );
        assert!(line.contains("memory.blocks_to_swap"), "{line}");

        // Steps at an even pace: no slowdown, no warning, whatever the memory counters say.
        let mut watch = SpillWatch::new(&telemetry, true);
        assert!((0..8).all(|_| watch.after_step(1.0).is_none()));
    }

    /// The advice after a stop repeats the run's presets and options: without them the resumed run's config
    /// would differ from the run's, and the resume would be refused.
    #[test]
    fn the_resume_command_keeps_the_runs_presets_and_options() {
        let own: Vec<String> = [
            "train",
            "--config",
            "a.toml",
            "--preset",
            "low-vram",
            "--config=b.toml",
            "--vram-budget-gb",
            "12",
            "--resume",
            "out",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            resume_command(
                &own,
                Path::new("b.toml"),
                Path::new("out/lora-state-000007")
            ),
            "framesmith train --config b.toml --preset low-vram --vram-budget-gb 12 --resume \
             out/lora-state-000007"
        );
    }

    #[test]
    fn a_failure_label_does_not_repeat_the_error() {
        let end = RunEnd::Failed(
            "the run config has 1 problem:\n  - `lora.rank`: must be at least 1\n".into(),
        );
        assert_eq!(end.label(), "failed (the error is above)");
        assert_eq!(RunEnd::Stopped(RunSummary::default()).label(), "stopped");
        let ends = vec![(PathBuf::from("b.toml"), None)];
        assert!(summary_lines(&ends)[0].starts_with("b.toml: not started"));
    }
}
