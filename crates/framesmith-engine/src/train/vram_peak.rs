//! The run's VRAM peak across sampling rounds. The device pool's high-water mark is restarted before each round,
//! so that the round's line reports the samples' own peak (a higher peak at the start or in the steps would hide
//! it); the peak from before each restart is kept here, so that the steps' lines still report the run's peak.

use crate::train::trainer::Trainer;
use framesmith_nn::device::VramUse;

/// The run's peak from before the pool's last restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunPeak {
    before_restart: u64,
}

impl RunPeak {
    /// The pool's mark is about to restart; `peak` is what it held (the peak since the restart before).
    pub fn restart(&mut self, peak: u64) {
        self.before_restart = self.before_restart.max(peak);
    }

    /// The run's peak so far, from the mark's `peak` since the last restart.
    pub fn so_far(&self, peak: u64) -> u64 {
        self.before_restart.max(peak)
    }
}

impl Trainer {
    /// Restarts the device pool's high-water mark before a sampling round, keeping the run's peak so far, so that
    /// [`Trainer::sampling_vram_line`] reports the round's own peak. Nothing off CUDA; when the mark cannot be
    /// restarted it keeps counting from before, and the round's line reports the run's peak as it did before.
    pub fn restart_vram_peak(&mut self) {
        let held_back = self.vram_reservation.as_ref().map_or(0, |h| h.bytes);
        let Some(used) = VramUse::measure(self.device(), held_back) else {
            return;
        };
        if framesmith_nn::device::reset_peak_reserved(self.device()).is_ok() {
            self.vram_peak.restart(used.peak);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_round_reports_its_own_peak_and_the_run_keeps_its_own() {
        let mut run = RunPeak::default();
        // The model's build peaked at 20 GiB, the steps at 18: the mark holds 20 when the first round begins.
        assert_eq!(run.so_far(20 * GIB), 20 * GIB);
        run.restart(20 * GIB);
        // The round peaks at 15 GiB: the mark, restarted, says 15 (the round's line); the run's peak is still 20.
        let round = 15 * GIB;
        assert_eq!(run.so_far(round), 20 * GIB);
        // Steps after it peak at 17 (the mark since the restart); a second round peaks at 22, above everything.
        run.restart(17 * GIB);
        assert_eq!(run.so_far(22 * GIB), 22 * GIB);
        run.restart(22 * GIB);
        assert_eq!(
            run.so_far(GIB),
            22 * GIB,
            "the run's peak survives every restart"
        );
    }
}
