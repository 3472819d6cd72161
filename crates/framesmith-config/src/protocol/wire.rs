//! Events and commands as JSON lines, for a run in another process: the app's run over several GPUs starts
//! `framesmith train --gpus … --events-json`, whose rank 0 writes its events on stdout and reads commands on
//! stdin, one JSON object a line.

use super::{Command, Event};

/// `event` as one line of JSON (no newline).
pub fn event_line(event: &Event) -> Result<String, String> {
    serde_json::to_string(event).map_err(|err| format!("cannot write the event {event:?}: {err}"))
}

/// The event a line of [`event_line`] holds.
pub fn parse_event(line: &str) -> Result<Event, String> {
    serde_json::from_str(line.trim()).map_err(|err| format!("not an engine event ({err}): {line}"))
}

/// `command` as one line of JSON (no newline); `StartRun` is not carried (the other process reads its config
/// from a file).
pub fn command_line(command: &Command) -> Result<String, String> {
    serde_json::to_string(command)
        .map_err(|err| format!("cannot send {command:?} to another process: {err}"))
}

/// The command a line of [`command_line`] holds.
pub fn parse_command(line: &str) -> Result<Command, String> {
    serde_json::from_str(line.trim())
        .map_err(|err| format!("not an engine command ({err}): {line}"))
}

/// A number that may not be finite: written as `null` (JSON has no NaN), read back as NaN.
pub(super) mod number {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        if value.is_finite() {
            serializer.serialize_f64(*value)
        } else {
            serializer.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::protocol::{LogLevel, Progress, RunState, StartRun, ValidationLoss};

    #[test]
    fn every_event_survives_a_line() {
        let events = [
            Event::StateChanged(RunState::Training),
            Event::Progress(Progress {
                step: 3,
                total_steps: 10,
                epoch: 1,
                loss: 0.25,
                smoothed_loss: 0.5,
                learning_rate: 1e-4,
                step_secs: 1.5,
                eta_secs: 10.5,
            }),
            Event::Validated(ValidationLoss {
                step: 3,
                loss: 0.125,
                items: 2,
                timesteps: 4,
            }),
            Event::Log {
                level: LogLevel::Warn,
                message: "line one\nline \"two\"".into(),
            },
            Event::CheckpointSaved {
                step: 4,
                lora: PathBuf::from("/out/cat.safetensors"),
                state: None,
            },
            Event::SampleReady {
                step: 4,
                file: PathBuf::from("/out/s.mp4"),
                frames: PathBuf::from("/out/s"),
                prompt: "a cat".into(),
                controls: Vec::new(),
            },
            Event::SampleReady {
                step: 4,
                file: PathBuf::from("/out/s.png"),
                frames: PathBuf::from("/out/s.png"),
                prompt: "make it red".into(),
                controls: vec![PathBuf::from("/in/a.png"), PathBuf::from("/in/b.png")],
            },
            Event::Failed {
                message: "out of memory".into(),
            },
            Event::ProcessesStarted {
                pids: vec![101, 102],
            },
            Event::VramHeld(crate::protocol::memory::VramHold {
                gpu: 1,
                held_bytes: 116 << 30,
                budget_bytes: 24 << 30,
            }),
        ];
        for event in events {
            let line = event_line(&event).unwrap();
            assert!(!line.contains('\n'), "{line}");
            assert_eq!(parse_event(&line).unwrap(), event, "{line}");
        }
    }

    #[test]
    fn a_loss_that_is_not_a_number_comes_back_as_nan() {
        let progress = Progress {
            step: 1,
            total_steps: 2,
            epoch: 1,
            loss: f64::NAN,
            smoothed_loss: f64::NAN,
            learning_rate: 1e-4,
            step_secs: 0.5,
            eta_secs: 0.5,
        };
        let line = event_line(&Event::Progress(progress)).unwrap();
        let Event::Progress(back) = parse_event(&line).unwrap() else {
            panic!("{line}")
        };
        assert!(back.loss.is_nan() && back.smoothed_loss.is_nan());
        assert_eq!(back.learning_rate, 1e-4);
    }

    #[test]
    fn commands_but_start_travel_and_junk_is_refused() {
        for command in [
            Command::Stop,
            Command::SaveNow,
            Command::SampleNow,
            Command::Pause,
            Command::Resume,
        ] {
            let line = command_line(&command).unwrap();
            assert_eq!(parse_command(&line).unwrap(), command);
        }
        let start = Command::StartRun(Box::new(StartRun {
            config: crate::RunConfig::default(),
            resume_from: None,
        }));
        assert!(command_line(&start).is_err());
        assert!(parse_command("stop please")
            .unwrap_err()
            .contains("stop please"));
        assert!(parse_event("{\"progress\":1}").is_err());
    }
}
