//! The UI ↔ engine protocol: plain data only (numbers, strings, paths), never tensors. The app sends `Command`s
//! and drains `Event`s; the engine thread does the reverse. Both sides use bounded channels.

pub mod doctor;
pub mod memory;
pub mod wire;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::RunConfig;

/// What the UI (or the command line) asks the engine to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Start a run (optionally resuming from a training-state folder). Not carried by [`wire`]: a run in another
    /// process gets its config as a file.
    #[serde(skip)]
    StartRun(Box<StartRun>),
    Pause,
    Resume,
    /// Stop after the current block, saving the LoRA and training state.
    Stop,
    SaveNow,
    SampleNow,
}

/// Everything a run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRun {
    pub config: RunConfig,
    pub resume_from: Option<PathBuf>,
}

/// The engine's state, as shown by the UI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Idle,
    Preparing,
    Training,
    Paused,
    Sampling,
    Saving,
    Finished,
    Stopped,
    Failed,
}

/// Progress after an optimizer step. A loss that is not a number (a skipped step) travels through [`wire`] as
/// `null` and comes back as NaN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub step: usize,
    pub total_steps: usize,
    pub epoch: usize,
    #[serde(with = "wire::number")]
    pub loss: f64,
    #[serde(with = "wire::number")]
    pub smoothed_loss: f64,
    #[serde(with = "wire::number")]
    pub learning_rate: f64,
    #[serde(with = "wire::number")]
    pub step_secs: f64,
    #[serde(with = "wire::number")]
    pub eta_secs: f64,
}

/// A validation loss: the mean loss over the held-out items at the fixed timesteps and noise, after `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationLoss {
    pub step: usize,
    #[serde(with = "wire::number")]
    pub loss: f64,
    /// Held-out items evaluated.
    pub items: usize,
    /// Timesteps each item was evaluated at.
    pub timesteps: usize,
}

/// Log severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Info,
    Warn,
    Error,
}

/// What happened in the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    StateChanged(RunState),
    Progress(Progress),
    /// A validation loss was evaluated (never dropped, unlike `Progress`).
    Validated(ValidationLoss),
    Log {
        level: LogLevel,
        message: String,
    },
    CheckpointSaved {
        step: usize,
        lora: PathBuf,
        state: Option<PathBuf>,
    },
    /// A sample made with the LoRA after `step`: a clip (Wan) or an image (FLUX.1).
    SampleReady {
        step: usize,
        /// The sample's file: an H.264 MP4 clip, or a PNG image.
        file: PathBuf,
        /// What the player shows: the clip's folder of PNG frames, or the PNG image itself.
        frames: PathBuf,
        prompt: String,
        /// The images an edit model's sample edits (its prompt's `--ci`), shown beside it; empty otherwise.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        controls: Vec<PathBuf>,
    },
    /// The run stopped with an error; the message says what and how to fix it.
    Failed {
        message: String,
    },
    /// The run trains in these processes too (the rank processes of a run over several GPUs, one per GPU): their
    /// memory is the run's.
    ProcessesStarted {
        pids: Vec<u32>,
    },
    /// The run holds back the card's memory beyond its VRAM budget (`memory.vram_budget_gb`) from now until it
    /// ends: that hold is not the run's memory, and a chart of the card shows a card of the budget's size.
    VramHeld(memory::VramHold),
}

/// The UI's end of the engine: send commands, drain events. Dropping it tells the engine to stop.
pub struct EngineHandle {
    pub commands: std::sync::mpsc::SyncSender<Command>,
    pub events: std::sync::mpsc::Receiver<Event>,
}

/// The engine thread's end of the same channels.
pub struct EngineEnd {
    pub commands: std::sync::mpsc::Receiver<Command>,
    pub events: std::sync::mpsc::SyncSender<Event>,
}

/// Commands are few; events are drained once per UI frame, so a few hundred cover any frame hitch.
pub const COMMAND_CAPACITY: usize = 16;
pub const EVENT_CAPACITY: usize = 1024;

/// A connected pair of bounded channels.
pub fn channel_pair() -> (EngineHandle, EngineEnd) {
    let (command_tx, command_rx) = std::sync::mpsc::sync_channel(COMMAND_CAPACITY);
    let (event_tx, event_rx) = std::sync::mpsc::sync_channel(EVENT_CAPACITY);
    (
        EngineHandle {
            commands: command_tx,
            events: event_rx,
        },
        EngineEnd {
            commands: command_rx,
            events: event_tx,
        },
    )
}
