//! The shared-memory guard (`memory.shared_memory_guard`): the first time a run is seen spilling VRAM into
//! Windows shared memory (`framesmith_telemetry::detect_spill`), the app pauses it, so a run that would go on at a
//! fraction of its speed waits for the user instead. Resuming continues anyway: the guard pauses a run once.
//! Spilling is only seen where the shared-memory counters exist (Windows), so elsewhere the guard never acts.

/// Whether the guard may still pause the run in progress.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpillGuard {
    armed: bool,
}

impl SpillGuard {
    /// The guard of a run that starts now, from its `memory.shared_memory_guard`.
    pub fn for_run(enabled: bool) -> Self {
        Self { armed: enabled }
    }

    /// Whether to pause now: the guard is armed, spilling is seen, and the run can be paused (it is training or
    /// sampling). Pausing disarms the guard for the rest of the run.
    pub fn should_pause(&mut self, spilling: bool, can_pause: bool) -> bool {
        let pause = self.armed && spilling && can_pause;
        if pause {
            self.armed = false;
        }
        pause
    }
}

/// The log line of a pause by the guard; `evidence` is the spill warning's own line.
pub fn pause_message(evidence: &str) -> String {
    format!(
        "Paused by memory.shared_memory_guard. {evidence}. Resume continues anyway (the guard does not pause this \
         run again); or Stop, then stream more blocks (memory.blocks_to_swap = \"auto\" with a lower \
         memory.vram_budget_gb) or lower dataset.resolution."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_pauses_a_spilling_run_once() {
        let mut guard = SpillGuard::for_run(true);
        assert!(!guard.should_pause(false, true), "no spilling, no pause");
        assert!(
            !guard.should_pause(true, false),
            "a run that cannot be paused (preparing, saving) is left alone"
        );
        assert!(guard.should_pause(true, true));
        assert!(
            !guard.should_pause(true, true),
            "after the user resumes, the same run is not paused again"
        );
    }

    #[test]
    fn a_run_without_the_guard_is_never_paused() {
        let mut guard = SpillGuard::for_run(false);
        assert!(!guard.should_pause(true, true));
        assert!(!SpillGuard::default().should_pause(true, true));
    }

    #[test]
    fn the_pause_message_says_how_to_go_on() {
        let message = pause_message("The driver is spilling VRAM into shared memory");
        assert!(message.contains("The driver is spilling VRAM into shared memory."));
        assert!(message.contains("Resume continues anyway"));
        assert!(message.contains("memory.blocks_to_swap"));
        assert!(!message.contains("  "), "{message}");
    }
}
