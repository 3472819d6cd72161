//! How the window drives the engine: the engine thread for the chosen GPUs (started, or replaced when the GPUs
//! change), commands sent without blocking, its events drained each frame, the spill guard, a run's end and the
//! next queued run, and starting and preparing runs.

use std::path::PathBuf;
use std::sync::mpsc::TrySendError;

use framesmith_config::protocol::{Command, Event, LogLevel, StartRun};
use framesmith_config::RunConfig;

use super::FramesmithApp;
use crate::jobs::JobResult;
use crate::queue::QueuedRun;
use crate::run_view::RunEnd;
use crate::spill_guard::pause_message;
use crate::train_panel::TrainRequest;

/// Events folded per frame at most, so a flood never stalls a frame (the rest wait for the next).
const EVENTS_PER_FRAME: usize = 4096;

impl FramesmithApp {
    /// The GPUs a run started now trains on: the picker's choice among the GPUs the telemetry sees.
    pub(super) fn chosen_gpus(&self) -> Vec<usize> {
        let (seen, _) = crate::gpu_panel::seen_gpus(self.telemetry.as_ref());
        crate::gpu_panel::gpus_for_run(&self.settings.gpus, &seen)
    }

    /// Sends a prepared run to an engine for its GPUs, replacing the idle engine when it was started for others.
    pub(crate) fn send_run(&mut self, start: Box<StartRun>) -> bool {
        if self.engine_gpus != self.run_gpus {
            // Dropping an idle engine's handle ends it.
            self.engine = None;
            self.engine_gpus = self.run_gpus.clone();
        }
        self.send(Command::StartRun(start))
    }

    /// Sends a command, starting the engine first if needed. Never blocks: a full queue is reported instead.
    pub(crate) fn send(&mut self, command: Command) -> bool {
        for _attempt in 0..2 {
            let engine = match self.engine.take() {
                Some(engine) => engine,
                None => match self.backend.spawn_engine(&self.engine_gpus) {
                    Ok(engine) => engine,
                    Err(err) => {
                        self.apply_event(Event::Failed {
                            message: format!("The training engine could not start: {err}"),
                        });
                        return false;
                    }
                },
            };
            match engine.commands.try_send(command.clone()) {
                Ok(()) => {
                    self.engine = Some(engine);
                    return true;
                }
                Err(TrySendError::Full(_)) => {
                    self.engine = Some(engine);
                    self.run
                        .note(LogLevel::Warn, "The engine is busy; try again in a moment");
                    return false;
                }
                // The engine thread ended; the next attempt starts a fresh one.
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
        self.apply_event(Event::Failed {
            message: "The training engine stopped and could not be restarted".into(),
        });
        false
    }

    pub(super) fn drain_engine(&mut self) {
        let Some(engine) = &self.engine else { return };
        let mut events = Vec::new();
        let mut lost = false;
        for _ in 0..EVENTS_PER_FRAME {
            match engine.events.try_recv() {
                Ok(event) => events.push(event),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    lost = true;
                    break;
                }
            }
        }
        for event in events {
            if let Event::SampleReady {
                frames, controls, ..
            } = &event
            {
                self.samples.sample_ready(&mut self.jobs, frames, controls);
            }
            self.apply_event(event);
        }
        if lost {
            self.engine = None;
            if let Some(end) = self.run.engine_lost() {
                self.run_ended(end);
            }
        }
    }

    /// Pauses the run the first time it spills, when its config asks for the guard.
    pub(super) fn guard_against_spilling(&mut self) {
        let Some(spill) = self.spill else { return };
        if self.spill_guard.should_pause(true, self.run.can_pause()) && self.send(Command::Pause) {
            self.run
                .note(LogLevel::Warn, pause_message(&spill.message()));
        }
    }

    pub(super) fn run_ended(&mut self, end: RunEnd) {
        self.preparing = false;
        self.output_folder.mark_stale();
        self.lora_tools.run_ended(end, &self.run.checkpoints);
        if let Some(next) = self.queue.next_after(end) {
            self.start_queued(next);
        }
    }

    /// Carries out what a Train tab button asked for.
    pub(crate) fn train_request(&mut self, request: TrainRequest) {
        match request {
            TrainRequest::Start => self.start(None),
            TrainRequest::StartQueue => {
                if let Some(next) = self.queue.take_next() {
                    self.start_queued(next);
                }
            }
            TrainRequest::Enqueue => self.enqueue(),
            TrainRequest::Send(command) => {
                self.send(command);
            }
        }
    }

    /// Starts the edited config (the Start button).
    pub(crate) fn start(&mut self, resume_from: Option<PathBuf>) {
        let problems = self.editor.blocking_problems();
        if !problems.is_empty() {
            self.run.begin_run();
            self.apply_event(Event::Failed {
                message: format!("Fix the config first: {}", problems.join("; ")),
            });
            return;
        }
        let run = QueuedRun {
            name: self.editor.config().output.output_name.clone(),
            config: self.editor.config().clone(),
            dataset_toml: self.dataset_toml_for(self.editor.config()),
            gpus: self.chosen_gpus(),
        };
        self.prepare(run, resume_from);
    }

    pub(crate) fn start_queued(&mut self, run: QueuedRun) {
        self.prepare(run, None);
    }

    pub(super) fn prepare(&mut self, run: QueuedRun, resume_from: Option<PathBuf>) {
        if !self.run.can_start() || self.preparing {
            return;
        }
        self.preparing = true;
        self.run.begin_run();
        self.run_name = Some(run.name.clone());
        self.run_gpus = run.gpus.clone();
        self.jobs.spawn("prepare run", move || {
            JobResult::RunPrepared(crate::handlers::prepare_run(run, resume_from))
        });
    }

    /// The dataset TOML to write for a run, when the run uses the dataset built in the Project tab.
    pub(crate) fn dataset_toml_for(&self, config: &RunConfig) -> Option<String> {
        let uses_project_dataset =
            !config.model.demo && config.dataset.config.as_os_str().is_empty();
        if uses_project_dataset && !self.dataset.is_empty() {
            self.dataset.to_toml().ok()
        } else {
            None
        }
    }

    pub(crate) fn enqueue(&mut self) {
        let config = self.editor.config().clone();
        self.queue.push(QueuedRun {
            name: format!(
                "{} ({} steps)",
                config.output.output_name, config.training.max_train_steps
            ),
            dataset_toml: self.dataset_toml_for(&config),
            gpus: self.chosen_gpus(),
            config,
        });
    }
}
