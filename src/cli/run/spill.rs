//! The spill watch of headless runs: the driver spilling VRAM into shared GPU memory (Windows), seen with the
//! Monitor's detector on the run's telemetry and step times; a warning, or a stop with the shared-memory guard.

#[cfg(feature = "telemetry")]
use framesmith_telemetry::detect_spill;
#[cfg(feature = "telemetry")]
pub(super) use framesmith_telemetry::Telemetry;
#[cfg(feature = "telemetry")]
use framesmith_telemetry::TelemetryOptions;

/// The telemetry `framesmith train` watches for spilling: only where the driver can spill into shared GPU memory
/// and its counters exist (Windows). `None` elsewhere, or when the sampling thread cannot start.
#[cfg(feature = "telemetry")]
pub(super) fn spill_telemetry() -> Option<Telemetry> {
    cfg!(windows)
        .then(|| Telemetry::spawn(TelemetryOptions::default()).ok())
        .flatten()
}

/// What the spill watch has to say after a step.
#[derive(Debug, PartialEq)]
#[cfg_attr(not(feature = "telemetry"), allow(dead_code))] // a headless build watches nothing
pub(super) enum Spill {
    /// The run spills: say so (once per run).
    Warn(String),
    /// The run spills and `memory.shared_memory_guard` is on: say so and stop the run (once per run). Nobody is
    /// there to resume a paused run, so the command line stops it; Stop saves the LoRA (and the training state,
    /// with `output.save_state`, to resume from).
    Stop(String),
}

/// Watches a headless run for the driver spilling VRAM into shared memory, with the Monitor's detector on the
/// same telemetry and the run's step times.
#[cfg(feature = "telemetry")]
pub(super) struct SpillWatch<'a> {
    telemetry: &'a Telemetry,
    step_secs: Vec<f64>,
    /// `memory.shared_memory_guard`.
    guard: bool,
    /// The watch has spoken for this run (it acts once).
    said: bool,
}

#[cfg(feature = "telemetry")]
impl<'a> SpillWatch<'a> {
    pub(super) fn new(telemetry: &'a Telemetry, guard: bool) -> Self {
        Self {
            telemetry,
            step_secs: Vec::new(),
            guard,
            said: false,
        }
    }

    /// Records a step's time and checks for spilling, until the run is first seen spilling.
    pub(super) fn after_step(&mut self, step_secs: f64) -> Option<Spill> {
        self.step_secs.push(step_secs);
        if self.said {
            return None;
        }
        let steps = &self.step_secs;
        let evidence = self
            .telemetry
            .read(|history| detect_spill(history, steps))?
            .message();
        self.said = true;
        Some(if self.guard {
            Spill::Stop(format!(
                "{evidence}. Stopping the run and saving its LoRA (memory.shared_memory_guard is on). Before \
                 running it again, stream more blocks (memory.blocks_to_swap = \"auto\" with a lower \
                 memory.vram_budget_gb) or lower dataset.resolution."
            ))
        } else {
            Spill::Warn(format!(
                "{evidence}. With memory.shared_memory_guard = true the run would be stopped and saved."
            ))
        })
    }
}

/// A headless build (without the `telemetry` feature) samples no GPU counters, so it watches nothing.
#[cfg(not(feature = "telemetry"))]
pub(super) struct Telemetry;

#[cfg(not(feature = "telemetry"))]
pub(super) fn spill_telemetry() -> Option<Telemetry> {
    None
}

#[cfg(not(feature = "telemetry"))]
pub(super) struct SpillWatch;

#[cfg(not(feature = "telemetry"))]
impl SpillWatch {
    pub(super) fn new(_: &Telemetry, _: bool) -> Self {
        Self
    }

    pub(super) fn after_step(&mut self, _: f64) -> Option<Spill> {
        None
    }
}
