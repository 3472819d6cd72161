//! The UI reducer: engine `Event`s folded into the view state the train, samples and monitor panels draw.
//! Pure data and logic, unit-tested without egui.

use std::collections::VecDeque;
use std::path::PathBuf;

use framesmith_config::protocol::memory::VramHold;
use framesmith_config::protocol::{Event, LogLevel, Progress, RunState, ValidationLoss};

/// Log lines kept; older ones scroll away.
pub const LOG_CAPACITY: usize = 2000;

/// One optimizer step as charted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPoint {
    pub step: usize,
    pub loss: f64,
    pub smoothed_loss: f64,
    pub learning_rate: f64,
    pub step_secs: f64,
}

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
}

/// A sample the engine wrote: a clip, or an image (an image model's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleClip {
    pub step: usize,
    /// The MP4 clip or the PNG image.
    pub file: PathBuf,
    /// What the player shows: the clip's folder of PNG frames, or the PNG image itself.
    pub frames: PathBuf,
    pub prompt: String,
    /// The images an edit model's sample edits, shown beside it (empty for other samples).
    pub controls: Vec<PathBuf>,
}

impl SampleClip {
    /// Whether the sample is an image (its frames are one PNG) rather than a clip.
    pub fn is_image(&self) -> bool {
        self.frames
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("png"))
    }
}

/// A checkpoint the engine wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub step: usize,
    pub lora: PathBuf,
    pub state: Option<PathBuf>,
}

/// How a run ended, as the queue sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Finished,
    Stopped,
    Failed,
}

/// Everything the UI shows about the current run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    pub state: RunState,
    pub progress: Option<Progress>,
    pub points: Vec<StepPoint>,
    /// Validation losses by step (`[validation]`), charted beside the training loss.
    pub validation: Vec<ValidationLoss>,
    pub log: VecDeque<LogLine>,
    pub samples: Vec<SampleClip>,
    pub checkpoints: Vec<Checkpoint>,
    /// The last failure's message, until the next run starts or the user dismisses it.
    pub failure: Option<String>,
    /// The run's processes besides the app (a run over several GPUs: one per GPU), whose memory is the run's.
    pub processes: Vec<u32>,
    /// What the run holds back on its GPUs to keep within its VRAM budget (while it runs).
    pub vram_holds: Vec<VramHold>,
}

impl Default for RunView {
    fn default() -> Self {
        Self {
            state: RunState::Idle,
            progress: None,
            points: Vec::new(),
            validation: Vec::new(),
            log: VecDeque::new(),
            samples: Vec::new(),
            checkpoints: Vec::new(),
            failure: None,
            processes: Vec::new(),
            vram_holds: Vec::new(),
        }
    }
}

impl RunView {
    /// Clears the previous run's progress and charts (samples and log stay, for comparison).
    pub fn begin_run(&mut self) {
        self.state = RunState::Preparing;
        self.progress = None;
        self.points.clear();
        self.validation.clear();
        self.failure = None;
        self.processes.clear();
        self.vram_holds.clear();
    }

    /// Folds one event in. Returns how the run ended when this event ended it.
    pub fn apply(&mut self, event: Event) -> Option<RunEnd> {
        match event {
            Event::StateChanged(state) => return self.set_state(state),
            Event::Progress(progress) => self.push_progress(progress),
            Event::Validated(loss) => {
                // A resumed run evaluates a step again: keep the newest value per step, in step order.
                self.validation.retain(|v| v.step < loss.step);
                self.validation.push(loss);
            }
            Event::Log { level, message } => self.push_log(level, message),
            Event::CheckpointSaved { step, lora, state } => {
                self.push_log(
                    LogLevel::Info,
                    format!("Saved step {step}: {}", lora.display()),
                );
                self.checkpoints.push(Checkpoint { step, lora, state });
            }
            Event::SampleReady {
                step,
                file,
                frames,
                prompt,
                controls,
            } => {
                self.samples.push(SampleClip {
                    step,
                    file,
                    frames,
                    prompt,
                    controls,
                });
                self.samples.sort_by_key(|s| s.step);
            }
            Event::Failed { message } => {
                self.push_log(LogLevel::Error, message.clone());
                self.failure = Some(message);
                return self.set_state(RunState::Failed);
            }
            Event::ProcessesStarted { pids } => self.processes = pids,
            Event::VramHeld(hold) => {
                self.vram_holds.retain(|h| h.gpu != hold.gpu);
                self.vram_holds.push(hold);
            }
        }
        None
    }

    fn set_state(&mut self, state: RunState) -> Option<RunEnd> {
        // The engine goes Idle after every run: the view keeps showing how that run ended, and a run the UI has
        // just begun (queued behind it) stays Preparing.
        let ended_or_next = matches!(
            self.state,
            RunState::Finished | RunState::Stopped | RunState::Failed | RunState::Preparing
        );
        if state == RunState::Idle && ended_or_next {
            return None;
        }
        let was_active = self.is_active();
        self.state = state;
        if !self.is_active() {
            // The run's hold ends with it (the engine reports the end once the run's memory is freed).
            self.vram_holds.clear();
        }
        if !was_active {
            return None;
        }
        match state {
            RunState::Finished => Some(RunEnd::Finished),
            RunState::Stopped => Some(RunEnd::Stopped),
            RunState::Failed => Some(RunEnd::Failed),
            _ => None,
        }
    }

    fn push_progress(&mut self, progress: Progress) {
        // A resumed run can repeat a step; the chart keeps the newest value per step.
        if let Some(last) = self.points.last() {
            if progress.step <= last.step {
                self.points.retain(|p| p.step < progress.step);
            }
        }
        self.points.push(StepPoint {
            step: progress.step,
            loss: progress.loss,
            smoothed_loss: progress.smoothed_loss,
            learning_rate: progress.learning_rate,
            step_secs: progress.step_secs,
        });
        self.progress = Some(progress);
    }

    fn push_log(&mut self, level: LogLevel, message: String) {
        if self.log.len() == LOG_CAPACITY {
            self.log.pop_front();
        }
        self.log.push_back(LogLine { level, message });
    }

    /// Adds a line from the UI itself (e.g. "the engine could not start").
    pub fn note(&mut self, level: LogLevel, message: impl Into<String>) {
        self.push_log(level, message.into());
    }

    /// The engine went away while a run was active: show it as a failure.
    pub fn engine_lost(&mut self) -> Option<RunEnd> {
        if !self.is_active() {
            return None;
        }
        self.apply(Event::Failed {
            message: "The training engine stopped without saying why; the log above may tell more"
                .into(),
        })
    }

    /// A run is under way (it may be paused).
    /// The run's holds as the telemetry marks its samples with them.
    pub fn budget_holds(&self) -> Vec<framesmith_telemetry::BudgetHold> {
        self.vram_holds
            .iter()
            .map(|h| framesmith_telemetry::BudgetHold {
                gpu: h.gpu,
                held_bytes: h.held_bytes,
                budget_bytes: h.budget_bytes,
            })
            .collect()
    }

    pub fn is_active(&self) -> bool {
        matches!(
            self.state,
            RunState::Preparing
                | RunState::Training
                | RunState::Paused
                | RunState::Sampling
                | RunState::Saving
        )
    }

    pub fn can_start(&self) -> bool {
        !self.is_active()
    }

    pub fn can_pause(&self) -> bool {
        matches!(self.state, RunState::Training | RunState::Sampling)
    }

    pub fn can_resume(&self) -> bool {
        self.state == RunState::Paused
    }

    /// Save now and Sample now act between steps of a run that has started training.
    pub fn can_save_or_sample(&self) -> bool {
        matches!(self.state, RunState::Training | RunState::Paused)
    }

    /// Step times, oldest first (for the spill detector).
    pub fn step_secs(&self) -> Vec<f64> {
        self.points.iter().map(|p| p.step_secs).collect()
    }

    /// "Step 120 / 1600 · epoch 2", or `None` before the first step.
    pub fn step_text(&self) -> Option<String> {
        let p = self.progress.as_ref()?;
        Some(format!(
            "Step {} / {} · epoch {}",
            p.step, p.total_steps, p.epoch
        ))
    }

    /// "ETA 1 h 02 m" while a run is active; "ETA —" before the first estimate.
    pub fn eta_text(&self) -> String {
        match &self.progress {
            Some(p) if self.is_active() && p.eta_secs.is_finite() => {
                format!("ETA {}", format_duration(p.eta_secs))
            }
            _ => "ETA —".into(),
        }
    }

    /// Fraction done in 0..=1.
    pub fn fraction_done(&self) -> f32 {
        match &self.progress {
            Some(p) if p.total_steps > 0 => (p.step as f32 / p.total_steps as f32).clamp(0.0, 1.0),
            _ => 0.0,
        }
    }
}

/// "45 s", "3 m 05 s", "2 h 07 m".
pub fn format_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "—".into();
    }
    let total = secs.round() as u64;
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    if h > 0 {
        format!("{h} h {m:02} m")
    } else if m > 0 {
        format!("{m} m {s:02} s")
    } else {
        format!("{s} s")
    }
}

/// Lower-case name of a run state for labels.
pub fn state_name(state: RunState) -> &'static str {
    match state {
        RunState::Idle => "idle",
        RunState::Preparing => "preparing",
        RunState::Training => "training",
        RunState::Paused => "paused",
        RunState::Sampling => "sampling",
        RunState::Saving => "saving",
        RunState::Finished => "finished",
        RunState::Stopped => "stopped",
        RunState::Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(step: usize, loss: f64) -> Event {
        Event::Progress(Progress {
            step,
            total_steps: 100,
            epoch: 1,
            loss,
            smoothed_loss: loss * 0.9,
            learning_rate: 1e-4,
            step_secs: 2.0,
            eta_secs: (100 - step) as f64 * 2.0,
        })
    }

    #[test]
    fn progress_moves_points_step_and_eta() {
        let mut view = RunView::default();
        view.begin_run();
        view.apply(Event::StateChanged(RunState::Training));
        assert_eq!(view.eta_text(), "ETA —");
        view.apply(progress(1, 0.5));
        view.apply(progress(2, 0.4));
        assert_eq!(view.points.len(), 2);
        assert_eq!(view.step_text().unwrap(), "Step 2 / 100 · epoch 1");
        assert_eq!(view.eta_text(), "ETA 3 m 16 s");
        assert!((view.fraction_done() - 0.02).abs() < 1e-6);
    }

    #[test]
    fn a_budget_hold_lasts_while_its_run_does() {
        let hold = |gpu, held_bytes| {
            Event::VramHeld(VramHold {
                gpu,
                held_bytes,
                budget_bytes: 24 << 30,
            })
        };
        let mut view = RunView::default();
        view.begin_run();
        view.apply(hold(1, 100));
        view.apply(hold(1, 116));
        view.apply(Event::StateChanged(RunState::Training));
        let holds = view.budget_holds();
        assert_eq!(holds.len(), 1);
        assert_eq!((holds[0].gpu, holds[0].held_bytes), (1, 116));
        view.apply(Event::StateChanged(RunState::Saving));
        assert_eq!(view.budget_holds().len(), 1);
        view.apply(Event::StateChanged(RunState::Finished));
        assert!(view.budget_holds().is_empty());
        view.begin_run();
        view.apply(hold(0, 5));
        view.begin_run();
        assert!(view.budget_holds().is_empty());
    }

    #[test]
    fn repeated_step_replaces_the_tail() {
        let mut view = RunView::default();
        for (step, loss) in [(1, 0.5), (2, 0.4), (3, 0.3), (2, 0.6)] {
            view.apply(progress(step, loss));
        }
        let steps: Vec<usize> = view.points.iter().map(|p| p.step).collect();
        assert_eq!(steps, vec![1, 2]);
        assert_eq!(view.points[1].loss, 0.6);
    }

    #[test]
    fn failure_ends_the_run_and_allows_a_new_start() {
        let mut view = RunView::default();
        view.begin_run();
        assert!(!view.can_start());
        let end = view.apply(Event::Failed {
            message: "out of memory".into(),
        });
        assert_eq!(end, Some(RunEnd::Failed));
        assert_eq!(view.failure.as_deref(), Some("out of memory"));
        assert!(view.can_start());
        assert_eq!(view.log.back().unwrap().level, LogLevel::Error);
        view.begin_run();
        assert!(view.failure.is_none());
    }

    #[test]
    fn end_is_reported_once_and_only_for_an_active_run() {
        let mut view = RunView::default();
        assert_eq!(view.apply(Event::StateChanged(RunState::Finished)), None);
        view.begin_run();
        view.apply(Event::StateChanged(RunState::Training));
        view.apply(Event::StateChanged(RunState::Paused));
        assert!(view.can_resume() && view.can_save_or_sample() && !view.can_pause());
        assert_eq!(
            view.apply(Event::StateChanged(RunState::Stopped)),
            Some(RunEnd::Stopped)
        );
        assert_eq!(view.apply(Event::StateChanged(RunState::Stopped)), None);
        assert_eq!(view.engine_lost(), None);
    }

    #[test]
    fn engine_going_idle_after_a_run_keeps_the_ending_shown() {
        let mut view = RunView::default();
        view.begin_run();
        view.apply(Event::StateChanged(RunState::Training));
        assert_eq!(
            view.apply(Event::StateChanged(RunState::Finished)),
            Some(RunEnd::Finished)
        );
        assert_eq!(view.apply(Event::StateChanged(RunState::Idle)), None);
        assert_eq!(view.state, RunState::Finished);
        assert!(view.can_start());
        // The next queued run began before the engine's Idle for the last one arrived.
        view.begin_run();
        view.apply(Event::StateChanged(RunState::Idle));
        assert_eq!(view.state, RunState::Preparing);
    }

    #[test]
    fn engine_lost_mid_run_is_a_failure() {
        let mut view = RunView::default();
        view.begin_run();
        assert_eq!(view.engine_lost(), Some(RunEnd::Failed));
        assert!(view.failure.is_some());
    }

    #[test]
    fn samples_sort_by_step_and_log_is_bounded() {
        let mut view = RunView::default();
        for step in [20, 10] {
            view.apply(Event::SampleReady {
                step,
                file: PathBuf::from(format!("{step}.mp4")),
                frames: PathBuf::from(format!("{step}")),
                prompt: "a cat".into(),
                controls: vec![PathBuf::from(format!("{step}-source.png"))],
            });
        }
        assert_eq!(view.samples[0].step, 10);
        assert_eq!(view.samples[0].controls, [PathBuf::from("10-source.png")]);
        for i in 0..LOG_CAPACITY + 5 {
            view.note(LogLevel::Info, format!("line {i}"));
        }
        assert_eq!(view.log.len(), LOG_CAPACITY);
        assert_eq!(view.log.front().unwrap().message, "line 5");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(format_duration(45.2), "45 s");
        assert_eq!(format_duration(185.0), "3 m 05 s");
        assert_eq!(format_duration(7620.0), "2 h 07 m");
        assert_eq!(format_duration(f64::NAN), "—");
    }
}
