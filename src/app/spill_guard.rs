//! The app's side of the shared-memory guard (`memory.shared_memory_guard`, [`crate::telemetry::SpillGuard`]):
//! the first time a run is seen spilling VRAM into Windows shared memory, the app pauses it, so a run that would
//! go on at a fraction of its speed waits for the user instead. Resuming continues anyway: the guard pauses a
//! run once.

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
    fn the_pause_message_says_how_to_go_on() {
        let message = pause_message("The driver is spilling VRAM into shared memory");
        assert!(message.contains("The driver is spilling VRAM into shared memory."));
        assert!(message.contains("Resume continues anyway"));
        assert!(message.contains("memory.blocks_to_swap"));
        assert!(!message.contains("  "), "{message}");
    }
}
