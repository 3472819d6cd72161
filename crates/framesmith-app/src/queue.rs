//! The run queue: runs that start one after another. Pure logic.

use std::collections::VecDeque;

use framesmith_config::RunConfig;

use super::run_view::RunEnd;

/// A run waiting its turn, with the dataset TOML it will write (when built in the Project tab) and the GPUs it
/// trains on (empty: the config's `training.device`; several: one process per GPU).
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRun {
    pub name: String,
    pub config: RunConfig,
    pub dataset_toml: Option<String>,
    pub gpus: Vec<usize>,
}

/// Runs waiting to start, first in first out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunQueue {
    runs: VecDeque<QueuedRun>,
    /// Set when the user stopped a run: the queue waits for an explicit start.
    held: bool,
}

impl RunQueue {
    pub fn push(&mut self, run: QueuedRun) {
        self.runs.push_back(run);
    }

    pub fn remove(&mut self, index: usize) {
        self.runs.remove(index);
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn is_held(&self) -> bool {
        self.held
    }

    pub fn iter(&self) -> impl Iterator<Item = &QueuedRun> {
        self.runs.iter()
    }

    /// The next run, taken off the queue by an explicit start.
    pub fn take_next(&mut self) -> Option<QueuedRun> {
        self.held = false;
        self.runs.pop_front()
    }

    /// The run to start now that one ended. A finished or failed run moves the queue on (a failure should not
    /// waste the night); a stopped one holds it, since the user asked to stop.
    pub fn next_after(&mut self, end: RunEnd) -> Option<QueuedRun> {
        match end {
            RunEnd::Stopped => {
                self.held = true;
                None
            }
            RunEnd::Finished | RunEnd::Failed if !self.held => self.runs.pop_front(),
            RunEnd::Finished | RunEnd::Failed => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str) -> QueuedRun {
        QueuedRun {
            name: name.into(),
            config: RunConfig::default(),
            dataset_toml: None,
            gpus: Vec::new(),
        }
    }

    #[test]
    fn finished_and_failed_runs_start_the_next_in_order() {
        let mut queue = RunQueue::default();
        queue.push(run("a"));
        queue.push(run("b"));
        assert_eq!(queue.next_after(RunEnd::Finished).unwrap().name, "a");
        assert_eq!(queue.next_after(RunEnd::Failed).unwrap().name, "b");
        assert!(queue.next_after(RunEnd::Finished).is_none());
    }

    #[test]
    fn stop_holds_the_queue_until_an_explicit_start() {
        let mut queue = RunQueue::default();
        queue.push(run("a"));
        queue.push(run("b"));
        assert!(queue.next_after(RunEnd::Stopped).is_none());
        assert!(queue.is_held());
        assert!(queue.next_after(RunEnd::Finished).is_none());
        assert_eq!(queue.take_next().unwrap().name, "a");
        assert!(!queue.is_held());
        assert_eq!(queue.next_after(RunEnd::Finished).unwrap().name, "b");
    }
}
