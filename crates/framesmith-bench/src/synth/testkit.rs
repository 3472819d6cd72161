//! Test helpers shared by the synthetic projects' tests: running a project's config through the engine.

use std::time::Duration;

use framesmith_config::protocol::{Command, Event, RunState, StartRun};
use framesmith_config::RunConfig;

/// How long a tiny CPU run may go without an event before the test fails.
const EVENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `config` through the engine to the end; the steps it reported and whether it saved a LoRA.
pub(crate) fn train(config: RunConfig) -> (usize, bool) {
    let engine = framesmith_engine::train::engine::spawn().unwrap();
    engine
        .commands
        .send(Command::StartRun(Box::new(StartRun {
            config,
            resume_from: None,
        })))
        .unwrap();
    let (mut steps, mut saved) = (0, false);
    loop {
        match engine
            .events
            .recv_timeout(EVENT_TIMEOUT)
            .expect("an engine event")
        {
            Event::Progress(p) => {
                assert!(p.loss.is_finite(), "loss {}", p.loss);
                steps = p.step;
            }
            Event::CheckpointSaved { lora, .. } => saved = lora.exists(),
            Event::Failed { message } => panic!("the run failed: {message}"),
            Event::StateChanged(RunState::Finished) => return (steps, saved),
            _ => {}
        }
    }
}
