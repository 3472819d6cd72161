//! Telemetry samples and the bounded history that holds them.

use std::collections::VecDeque;

/// One GPU at one instant. Fields NVML could not read are `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Memory held on the device by this process and the run's rank processes (`Telemetry::count_processes`);
    /// `None` when they hold none, and under Windows WDDM, where NVML cannot see it.
    pub process_memory_bytes: Option<u64>,
    pub utilization_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_watts: Option<f64>,
    pub pcie_tx_bytes_per_sec: Option<u64>,
    pub pcie_rx_bytes_per_sec: Option<u64>,
    /// What a run under a VRAM budget holds back on this GPU at the sample's time (`Telemetry::set_budget_holds`).
    pub budget_hold: Option<BudgetHold>,
}

/// Memory a run holds back on a GPU so that it runs as on a card of its budget: allocated by the run's process,
/// used by nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetHold {
    /// NVML's index of the GPU.
    pub gpu: u32,
    pub held_bytes: u64,
    pub budget_bytes: u64,
}

impl GpuSample {
    /// Memory in use on the card, a budget's hold left out.
    pub fn used_without_hold(&self) -> u64 {
        self.memory_used_bytes
            .saturating_sub(self.budget_hold.map_or(0, |h| h.held_bytes))
    }

    /// The run's own memory on the card, a budget's hold left out.
    pub fn process_without_hold(&self) -> Option<u64> {
        let held = self.budget_hold.map_or(0, |h| h.held_bytes);
        self.process_memory_bytes.map(|b| b.saturating_sub(held))
    }

    /// The card's size as a run sees it: the budget under a hold, else the card's memory.
    pub fn card_bytes(&self) -> u64 {
        self.budget_hold
            .map_or(self.memory_total_bytes, |h| h.budget_bytes)
    }

    /// Used fraction of the device memory (0 when the total is unknown); under a budget's hold, the fraction of
    /// the budget in use (the hold fills the rest of the card by design).
    pub fn memory_fraction(&self) -> f64 {
        match self.card_bytes() {
            0 => 0.0,
            card => self.used_without_hold() as f64 / card as f64,
        }
    }
}

/// Windows shared GPU memory (system RAM the driver maps for the GPU), from the PDH counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SharedMemorySample {
    /// `\GPU Adapter Memory(*)\Shared Usage`, summed over adapters.
    pub adapter_bytes: u64,
    /// `\GPU Process Memory(pid_<ours>*)\Shared Usage`.
    pub process_bytes: u64,
}

/// Everything sampled at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Seconds since the telemetry thread started.
    pub at_secs: f64,
    pub ram_used_bytes: u64,
    pub ram_total_bytes: u64,
    /// Resident memory of this process and the run's rank processes, summed.
    pub process_resident_bytes: u64,
    pub gpus: Vec<GpuSample>,
    /// `None` off Windows or when the counters cannot be read.
    pub shared: Option<SharedMemorySample>,
}

/// The last `capacity` samples, oldest first, plus why a source is missing.
#[derive(Debug, Clone)]
pub struct History {
    samples: VecDeque<Sample>,
    capacity: usize,
    /// `Err` says why there are no GPU samples (no NVIDIA driver, no device).
    pub gpu_status: Result<(), String>,
    /// `Err` says why there are no shared-memory samples.
    pub shared_status: Result<(), String>,
}

impl History {
    /// An empty history that keeps at most `capacity` samples (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            samples: VecDeque::with_capacity(capacity.clamp(1, 4096)),
            capacity: capacity.max(1),
            gpu_status: Err("waiting for the first sample".into()),
            shared_status: Err("waiting for the first sample".into()),
        }
    }

    /// Appends a sample, dropping the oldest when full.
    pub fn push(&mut self, sample: Sample) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// Samples, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Sample> + ExactSizeIterator {
        self.samples.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_drops_the_oldest_when_full() {
        let mut history = History::new(2);
        for i in 0..3 {
            history.push(Sample {
                at_secs: i as f64,
                ..Sample::default()
            });
        }
        let times: Vec<f64> = history.iter().map(|s| s.at_secs).collect();
        assert_eq!(times, vec![1.0, 2.0]);
        assert_eq!(history.latest().map(|s| s.at_secs), Some(2.0));
    }

    #[test]
    fn memory_fraction_handles_unknown_total() {
        let gpu = GpuSample {
            memory_used_bytes: 5,
            ..GpuSample::default()
        };
        assert_eq!(gpu.memory_fraction(), 0.0);
        let gpu = GpuSample {
            memory_used_bytes: 3,
            memory_total_bytes: 4,
            ..GpuSample::default()
        };
        assert_eq!(gpu.memory_fraction(), 0.75);
    }

    #[test]
    fn a_gpu_under_a_budget_hold_reads_as_a_card_of_the_budget() {
        const GIB: u64 = 1 << 30;
        let mut gpu = GpuSample {
            memory_used_bytes: 130 * GIB,
            memory_total_bytes: 140 * GIB,
            process_memory_bytes: Some(128 * GIB),
            ..GpuSample::default()
        };
        assert_eq!(
            (gpu.used_without_hold(), gpu.card_bytes()),
            (130 * GIB, 140 * GIB)
        );
        gpu.budget_hold = Some(BudgetHold {
            gpu: 0,
            held_bytes: 116 * GIB,
            budget_bytes: 24 * GIB,
        });
        assert_eq!(gpu.used_without_hold(), 14 * GIB);
        assert_eq!(gpu.process_without_hold(), Some(12 * GIB));
        assert_eq!(gpu.card_bytes(), 24 * GIB);
        assert!((gpu.memory_fraction() - 14.0 / 24.0).abs() < 1e-12);
    }
}
