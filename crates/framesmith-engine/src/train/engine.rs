//! The engine thread: owns a run, speaks only through `protocol` (commands in, events out), and checks for
//! commands between steps and, through the step's interrupt hook, between blocks. A failure ends the run with a
//! `Failed` event; the engine itself stays up for the next run.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::mpsc::{SyncSender, TryRecvError, TrySendError};
use std::time::Instant;

use std::cell::Cell;

use crate::train::ranks::Ranks;
use crate::train::step::StepError;
use crate::train::trainer::Trainer;
use framesmith_config::protocol::{
    channel_pair, Command, EngineEnd, EngineHandle, Event, LogLevel, Progress, RunState, StartRun,
};

/// Starts the engine thread and returns the UI's end of its channels.
pub fn spawn() -> std::io::Result<EngineHandle> {
    spawn_ranked(Ranks::One)
}

/// [`spawn`] for one rank of a run over several GPUs: every run it starts trains with `ranks`.
pub fn spawn_ranked(ranks: Ranks) -> std::io::Result<EngineHandle> {
    let (handle, end) = channel_pair();
    std::thread::Builder::new()
        .name("framesmith-engine".into())
        .spawn(move || engine_main(end, &ranks))?;
    Ok(handle)
}

fn engine_main(end: EngineEnd, ranks: &Ranks) {
    let events = Events(end.events.clone());
    let inbox = Rc::new(Inbox::new(end));
    while let Some(command) = inbox.wait() {
        match command {
            Command::StartRun(request) => run(&request, ranks, &inbox, &events),
            other => events.log(
                LogLevel::Warn,
                format!("no run in progress: {other:?} ignored"),
            ),
        }
        events.state(RunState::Idle);
    }
}

/// Commands received from the UI; polled between steps and between blocks, kept in order.
struct Inbox {
    end: EngineEnd,
    queue: RefCell<VecDeque<Command>>,
    disconnected: RefCell<bool>,
}

impl Inbox {
    fn new(end: EngineEnd) -> Self {
        Self {
            end,
            queue: RefCell::new(VecDeque::new()),
            disconnected: RefCell::new(false),
        }
    }

    /// Moves whatever arrived into the queue without blocking.
    fn poll(&self) {
        loop {
            match self.end.commands.try_recv() {
                Ok(c) => self.queue.borrow_mut().push_back(c),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    *self.disconnected.borrow_mut() = true;
                    return;
                }
            }
        }
    }

    /// Whether the run must stop now (a queued Stop, or the UI went away).
    fn stop_requested(&self) -> bool {
        self.poll();
        *self.disconnected.borrow()
            || self
                .queue
                .borrow()
                .iter()
                .any(|c| matches!(c, Command::Stop))
    }

    /// Removes the queued Stop (the one a stopped preparation answered).
    fn take_stop(&self) {
        let mut queue = self.queue.borrow_mut();
        if let Some(i) = queue.iter().position(|c| matches!(c, Command::Stop)) {
            queue.remove(i);
        }
    }

    fn next(&self) -> Option<Command> {
        self.poll();
        self.queue.borrow_mut().pop_front()
    }

    /// Blocks for the next command; `None` when the UI side is gone.
    fn wait(&self) -> Option<Command> {
        if let Some(c) = self.next() {
            return Some(c);
        }
        if *self.disconnected.borrow() {
            return None;
        }
        self.end.commands.recv().ok()
    }
}

/// The event sender. Progress is dropped when the UI is behind (the next one supersedes it); everything else
/// waits for room, so no log line, checkpoint or failure is ever lost.
struct Events(SyncSender<Event>);

impl Events {
    fn send(&self, event: Event) {
        match self.0.try_send(event) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(Event::Progress(_))) => {}
            Err(TrySendError::Full(event)) => {
                let _ = self.0.send(event);
            }
        }
    }

    fn state(&self, state: RunState) {
        self.send(Event::StateChanged(state));
    }

    fn log(&self, level: LogLevel, message: String) {
        self.send(Event::Log { level, message });
    }
}

/// How a run ended.
enum Outcome {
    Finished,
    Stopped,
}

/// Ends what a run switched on for its devices (FP8 attention), however the run ends.
struct RunScope;

impl Drop for RunScope {
    fn drop(&mut self) {
        framesmith_nn::device::clear_fp8_attention();
    }
}

fn run(request: &StartRun, ranks: &Ranks, inbox: &Rc<Inbox>, events: &Events) {
    let _scope = RunScope;
    events.state(RunState::Preparing);
    let mut log = |level, message| events.log(level, message);
    // A stop while the run is prepared ends the preparation at the next tensor loaded or item read.
    let poll = inbox.clone();
    let (started, stopped) =
        framesmith_nn::cancel::while_polling(Rc::new(move || poll.stop_requested()), || {
            Trainer::start_ranked(request, ranks, &mut log)
        });
    if stopped {
        // The Stop asked for here is this one; it is not left queued for the next run.
        inbox.take_stop();
        events.log(
            LogLevel::Info,
            "stopped while the run was being prepared: nothing trained, nothing to save"
                .to_string(),
        );
        events.state(RunState::Stopped);
        return;
    }
    let result = started.and_then(|mut trainer| {
        if let Some(hold) = trainer.vram_hold() {
            events.send(Event::VramHeld(hold));
        }
        events.state(RunState::Training);
        let first_step = trainer.step();
        let outcome = train_loop(&mut trainer, inbox, events);
        finish(&mut trainer, first_step, outcome, events)
        // The trainer ends here, its collective (a rank's NCCL communicator) with it, before the run's end is
        // reported: a rank process exits on that report, and must not exit while NCCL is still being torn down.
    });
    // Host activations keep their page-locked buffers from step to step, not from run to run.
    framesmith_nn::offload::release_host_activation_buffers();
    match result {
        Ok(ended) => events.state(ended),
        Err(err) => {
            events.state(RunState::Failed);
            events.send(Event::Failed {
                message: format!("{err:#}"),
            });
        }
    }
}

/// Saves what the run learned and says how it ended (the state to report once the trainer is gone). A run
/// stopped before it completed a step has nothing new to save, and writes nothing (no untrained LoRA under the
/// run's name).
fn finish(
    trainer: &mut Trainer,
    first_step: usize,
    outcome: anyhow::Result<Outcome>,
    events: &Events,
) -> anyhow::Result<RunState> {
    let outcome = match outcome {
        Ok(o) => o,
        Err(err) => {
            // Keep what was learned: the last good LoRA is saved before the failure is reported.
            if trainer.step() > 0 {
                if let Ok(saved) = trainer.save(false) {
                    saved.events().into_iter().for_each(|e| events.send(e));
                }
            } else {
                trainer.abandon_unused_outputs();
            }
            return Err(err);
        }
    };
    if matches!(outcome, Outcome::Stopped) && trainer.step() == first_step {
        trainer.abandon_unused_outputs();
        events.log(
            LogLevel::Info,
            format!(
                "stopped before step {} was completed: nothing new to save",
                first_step + 1
            ),
        );
        return Ok(RunState::Stopped);
    }
    events.state(RunState::Saving);
    let saved = trainer.save(true)?;
    saved.events().into_iter().for_each(|e| events.send(e));
    Ok(match outcome {
        Outcome::Finished => RunState::Finished,
        Outcome::Stopped => RunState::Stopped,
    })
}

/// Carries out the commands that arrived since the last step; `false` when one stopped the run. With `several`
/// ranks a stop only sets `stop_wanted` (the ranks agree on it at the end of a step) and a pause is refused.
fn take_commands(
    trainer: &mut Trainer,
    (inbox, events): (&Inbox, &Events),
    several: bool,
    stop_wanted: &Cell<bool>,
    alone_stop: &dyn Fn() -> bool,
) -> anyhow::Result<bool> {
    while let Some(command) = inbox.next() {
        match command {
            Command::Stop if several => stop_wanted.set(true),
            Command::Stop => return Ok(false),
            Command::Pause if several => events.log(
                LogLevel::Warn,
                "a run over several GPUs cannot pause (the other GPUs would wait on this one): stop it and \
                 resume it later instead"
                    .into(),
            ),
            Command::Pause => {
                events.state(RunState::Paused);
                if !wait_for_resume(trainer, inbox, events)? {
                    return Ok(false);
                }
                events.state(RunState::Training);
            }
            Command::SaveNow => trainer
                .save(false)?
                .events()
                .into_iter()
                .for_each(|e| events.send(e)),
            Command::SampleNow => {
                if !sample(trainer, events, alone_stop)? {
                    return Ok(false);
                }
            }
            Command::Resume => {}
            Command::StartRun(_) => events.log(
                LogLevel::Warn,
                "a run is already in progress; queue the next one".into(),
            ),
        }
    }
    Ok(true)
}

fn train_loop(trainer: &mut Trainer, inbox: &Inbox, events: &Events) -> anyhow::Result<Outcome> {
    // With several ranks a stop is agreed at the end of a step (each rank's `train_step` reports any rank's).
    let several = trainer.world() > 1;
    let stop_wanted = Cell::new(false);
    let stop_requested = || stop_wanted.get() || inbox.stop_requested();
    // Rank 0 samples and validates alone: with several ranks it finishes (the others wait in the next step for it).
    let never = || false;
    let alone_stop: &dyn Fn() -> bool = if several { &never } else { &stop_requested };
    if trainer.sample_at_start() && !sample(trainer, events, alone_stop)? {
        return Ok(Outcome::Stopped);
    }
    trainer.startup.mark("samples before training");
    if let Some((level, line)) = trainer.install_activation_buffers() {
        events.log(level, line);
    }
    trainer.startup.mark("waiting for the activation buffers");
    trainer.startup.step_begins();
    let started = Instant::now();
    let first_step = trainer.step();
    let mut smoothed: Option<f64> = None;
    while trainer.step() < trainer.total_steps() {
        if !take_commands(trainer, (inbox, events), several, &stop_wanted, alone_stop)? {
            return Ok(Outcome::Stopped);
        }
        let report = match trainer.train_step(&stop_requested) {
            Ok(r) => r,
            Err(err) if StepError::is_interrupted(&err) => return Ok(Outcome::Stopped),
            Err(err) => return Err(err),
        };
        if let Some(line) = trainer.startup.first_step_line(report.step_secs) {
            events.log(LogLevel::Info, line);
        }
        if let Some(message) = report.warning.clone() {
            events.log(LogLevel::Warn, message);
        }
        if let Some(loss) = report.loss {
            smoothed = Some(smoothed.map_or(loss, |s| 0.95 * s + 0.05 * loss));
        }
        let done = trainer.step() - first_step;
        let per_step = started.elapsed().as_secs_f64() / done.max(1) as f64;
        events.send(Event::Progress(Progress {
            step: trainer.step(),
            total_steps: trainer.total_steps(),
            epoch: report.epoch,
            loss: report.loss.unwrap_or(f64::NAN),
            smoothed_loss: smoothed.unwrap_or(f64::NAN),
            learning_rate: report.learning_rate,
            step_secs: report.step_secs,
            eta_secs: per_step * (trainer.total_steps() - trainer.step()) as f64,
        }));
        if done <= 4 || done.is_power_of_two() || trainer.save_due() {
            if let Some(line) = trainer.vram_line() {
                events.log(LogLevel::Info, line);
            }
        }
        if trainer.validation_due() {
            match trainer.validate(alone_stop) {
                Ok(Some(loss)) => events.send(Event::Validated(loss)),
                Ok(None) => {}
                Err(err) if StepError::is_interrupted(&err) => return Ok(Outcome::Stopped),
                Err(err) => return Err(err),
            }
        }
        if trainer.save_due() {
            events.state(RunState::Saving);
            trainer
                .save(false)?
                .events()
                .into_iter()
                .for_each(|e| events.send(e));
            events.state(RunState::Training);
        }
        if trainer.sample_due() && !sample(trainer, events, alone_stop)? {
            return Ok(Outcome::Stopped);
        }
        if report.stop_requested {
            return Ok(Outcome::Stopped);
        }
    }
    Ok(Outcome::Finished)
}

/// Waits while paused; `Ok(false)` when a Stop arrives (or the UI goes away).
fn wait_for_resume(trainer: &mut Trainer, inbox: &Inbox, events: &Events) -> anyhow::Result<bool> {
    loop {
        match inbox.wait() {
            None | Some(Command::Stop) => return Ok(false),
            Some(Command::Resume) => return Ok(true),
            Some(Command::SaveNow) => trainer
                .save(false)?
                .events()
                .into_iter()
                .for_each(|e| events.send(e)),
            Some(Command::SampleNow) => {
                if !sample(trainer, events, &|| inbox.stop_requested())? {
                    return Ok(false);
                }
            }
            Some(_) => {}
        }
    }
}

/// Samples with the current LoRA; `Ok(false)` when a stop arrived while sampling (the files of the samples
/// finished before it stay on disk; the rest are not made).
fn sample(
    trainer: &mut Trainer,
    events: &Events,
    stop_requested: &dyn Fn() -> bool,
) -> anyhow::Result<bool> {
    events.state(RunState::Sampling);
    trainer.restart_vram_peak();
    match trainer.sample(stop_requested) {
        Ok(ready) => {
            ready.into_iter().for_each(|e| events.send(e));
            if let Some(line) = trainer.sampling_vram_line() {
                events.log(LogLevel::Info, line);
            }
        }
        Err(err) if StepError::is_interrupted(&err) => return Ok(false),
        Err(err) => return Err(err),
    }
    events.state(RunState::Training);
    Ok(true)
}
