//! Telemetry: GPU (NVML), RAM (sysinfo) and Windows shared GPU memory (PDH), sampled on its own thread into a
//! bounded history that the UI reads. Knows nothing of egui or of the engine.

mod history;
mod nvml;
#[cfg(windows)]
mod shared_memory;
mod spill;
mod system;

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use history::{BudgetHold, GpuSample, History, Sample, SharedMemorySample};
pub use spill::{detect_spill, SpillWarning, SPILL_SHARED_GROWTH_BYTES, SPILL_VRAM_FRACTION};

/// How often the thread samples by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);
/// Ten minutes of samples at the default interval.
pub const DEFAULT_CAPACITY: usize = 2400;

/// Called after each sample (the UI passes a closure that requests a repaint).
pub type OnSample = Box<dyn Fn() + Send>;

/// How the telemetry thread runs.
pub struct TelemetryOptions {
    pub interval: Duration,
    /// Samples kept; older ones are dropped.
    pub capacity: usize,
    pub on_sample: Option<OnSample>,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            capacity: DEFAULT_CAPACITY,
            on_sample: None,
        }
    }
}

/// A running telemetry thread. Dropping it stops the thread.
pub struct Telemetry {
    history: Arc<Mutex<History>>,
    /// The processes whose GPU and RAM use is the run's own: this one, and the run's rank processes.
    processes: Arc<Mutex<Vec<u32>>>,
    /// What a run under a VRAM budget holds back, per GPU.
    holds: Arc<Mutex<Vec<BudgetHold>>>,
    stop: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Telemetry {
    /// Starts the sampling thread. NVML and PDH are opened on that thread, so a slow driver never delays the caller.
    pub fn spawn(options: TelemetryOptions) -> std::io::Result<Self> {
        let history = Arc::new(Mutex::new(History::new(options.capacity)));
        let processes = Arc::new(Mutex::new(vec![std::process::id()]));
        let holds = Arc::new(Mutex::new(Vec::new()));
        let (stop_tx, stop_rx) = std::sync::mpsc::sync_channel(1);
        let shared = Shared {
            history: Arc::clone(&history),
            processes: Arc::clone(&processes),
            holds: Arc::clone(&holds),
        };
        let thread = std::thread::Builder::new()
            .name("telemetry".into())
            .spawn(move || sample_loop(&shared, &stop_rx, options))?;
        Ok(Self {
            history,
            processes,
            holds,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// A telemetry with a fixed history and no thread (tests, and screens that replay a recording).
    pub fn fixed(history: History) -> Self {
        Self {
            history: Arc::new(Mutex::new(history)),
            processes: Arc::new(Mutex::new(vec![std::process::id()])),
            holds: Arc::new(Mutex::new(Vec::new())),
            stop: None,
            thread: None,
        }
    }

    /// Counts the memory of `pids` (a run's rank processes) as the run's own from the next sample on, beside
    /// this process's: `GpuSample::process_memory_bytes` and `Sample::process_resident_bytes` are summed over them.
    pub fn count_processes(&self, pids: &[u32]) {
        let mut all = vec![std::process::id()];
        all.extend(pids.iter().filter(|&&pid| pid != std::process::id()));
        all.sort_unstable();
        all.dedup();
        *self
            .processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = all;
    }

    /// Marks the samples from now on with what a run under a VRAM budget holds back on each GPU (none: an empty
    /// list), so that charts leave the hold out.
    pub fn set_budget_holds(&self, holds: &[BudgetHold]) {
        let mut guard = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.as_slice() != holds {
            *guard = holds.to_vec();
        }
    }

    /// The processes counted as the run's own (this one first among them, sorted).
    pub fn counted_processes(&self) -> Vec<u32> {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` on the history. The sampling thread holds the lock only to push one sample, so this never waits long.
    pub fn read<R>(&self, f: impl FnOnce(&History) -> R) -> R {
        let guard = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        f(&guard)
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread's timed wait at once.
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every source the thread reads, opened once.
struct Sources {
    nvml: nvml::NvmlSource,
    system: system::SystemSource,
    #[cfg(windows)]
    shared: shared_memory::SharedMemorySource,
}

impl Sources {
    fn open() -> Self {
        Self {
            nvml: nvml::NvmlSource::open(),
            system: system::SystemSource::new(),
            #[cfg(windows)]
            shared: shared_memory::SharedMemorySource::open(),
        }
    }

    fn sample(&mut self, at_secs: f64, pids: &[u32]) -> Sample {
        let mut sample = Sample {
            at_secs,
            ..Sample::default()
        };
        self.system.sample(&mut sample, pids);
        self.nvml.sample(&mut sample, pids);
        #[cfg(windows)]
        self.shared.sample(&mut sample);
        sample
    }

    fn gpu_status(&self) -> Result<(), String> {
        self.nvml.status()
    }

    fn shared_status(&self) -> Result<(), String> {
        #[cfg(windows)]
        return self.shared.status();
        #[cfg(not(windows))]
        Err("shared GPU memory is a Windows (WDDM) counter".into())
    }
}

/// Takes one sample of every source now (opening them first). For tools and tests; the app uses `Telemetry`.
pub fn sample_once() -> (Sample, Result<(), String>) {
    let mut sources = Sources::open();
    let sample = sources.sample(0.0, &[std::process::id()]);
    (sample, sources.gpu_status())
}

/// What the sampling thread shares with its owner.
struct Shared {
    history: Arc<Mutex<History>>,
    processes: Arc<Mutex<Vec<u32>>>,
    holds: Arc<Mutex<Vec<BudgetHold>>>,
}

/// Marks each GPU of `sample` with its hold in `holds`.
fn mark_holds(sample: &mut Sample, holds: &[BudgetHold]) {
    for gpu in &mut sample.gpus {
        gpu.budget_hold = holds.iter().find(|h| h.gpu == gpu.index).copied();
    }
}

fn sample_loop(shared: &Shared, stop: &Receiver<()>, options: TelemetryOptions) {
    let mut sources = Sources::open();
    {
        let mut guard = shared
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        guard.gpu_status = sources.gpu_status();
        guard.shared_status = sources.shared_status();
    }
    let start = Instant::now();
    loop {
        let pids = shared
            .processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut sample = sources.sample(start.elapsed().as_secs_f64(), &pids);
        mark_holds(
            &mut sample,
            &shared.holds.lock().unwrap_or_else(PoisonError::into_inner),
        );
        shared
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sample);
        if let Some(on_sample) = &options.on_sample {
            on_sample();
        }
        // A timed wait on the stop channel paces the loop and ends it the moment the owner drops.
        match stop.recv_timeout(options.interval) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_mark_only_their_own_gpu() {
        let mut sample = Sample {
            gpus: (0..3)
                .map(|index| GpuSample {
                    index,
                    ..GpuSample::default()
                })
                .collect(),
            ..Sample::default()
        };
        let hold = BudgetHold {
            gpu: 2,
            held_bytes: 7,
            budget_bytes: 5,
        };
        mark_holds(&mut sample, &[hold]);
        let marks: Vec<_> = sample.gpus.iter().map(|g| g.budget_hold).collect();
        assert_eq!(marks, vec![None, None, Some(hold)]);
        mark_holds(&mut sample, &[]);
        assert!(sample.gpus.iter().all(|g| g.budget_hold.is_none()));
    }

    #[test]
    fn thread_fills_history_and_stops_on_drop() {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let telemetry = Telemetry::spawn(TelemetryOptions {
            interval: Duration::from_millis(1),
            capacity: 3,
            on_sample: Some(Box::new(move || {
                let _ = tx.try_send(());
            })),
        })
        .unwrap();
        for _ in 0..5 {
            rx.recv().unwrap();
        }
        let (len, ram_total) = telemetry.read(|h| (h.len(), h.latest().map(|s| s.ram_total_bytes)));
        assert!(len <= 3, "history is bounded, got {len}");
        assert!(ram_total.unwrap_or(0) > 0, "sysinfo reports RAM");
        drop(telemetry);
        // The thread has joined, so the sender it owned is gone.
        while rx.try_recv().is_ok() {}
        assert!(rx.recv().is_err());
    }

    #[test]
    fn the_runs_processes_are_counted_beside_this_one() {
        let telemetry = Telemetry::fixed(History::new(1));
        let me = std::process::id();
        assert_eq!(telemetry.counted_processes(), vec![me]);
        telemetry.count_processes(&[me, 4_000_000, 4_000_001, 4_000_000]);
        let mut expected = vec![me, 4_000_000, 4_000_001];
        expected.sort_unstable();
        assert_eq!(telemetry.counted_processes(), expected);
        telemetry.count_processes(&[]);
        assert_eq!(telemetry.counted_processes(), vec![me]);
    }

    #[test]
    fn sample_once_reports_gpu_status_without_panicking() {
        let (sample, gpu) = sample_once();
        assert!(sample.ram_total_bytes >= sample.ram_used_bytes);
        match gpu {
            Ok(()) => assert!(!sample.gpus.is_empty()),
            Err(message) => {
                assert!(sample.gpus.is_empty());
                assert!(!message.is_empty());
            }
        }
    }
}
