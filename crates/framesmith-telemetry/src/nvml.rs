//! NVIDIA GPUs through NVML (loaded at run time, so machines without the driver still start).

use nvml_wrapper::enum_wrappers::device::{PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};

use super::history::{GpuSample, Sample};

/// NVML opened once, or why it could not be.
pub(super) struct NvmlSource {
    nvml: Result<Nvml, String>,
}

impl NvmlSource {
    pub(super) fn open() -> Self {
        let nvml = Nvml::init().map_err(|err| format!("no NVIDIA GPU found (NVML: {err})"));
        Self { nvml }
    }

    /// `Err` says why GPU charts are empty.
    pub(super) fn status(&self) -> Result<(), String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        match nvml.device_count() {
            Ok(0) => Err("no NVIDIA GPU found".into()),
            Ok(_) => Ok(()),
            Err(err) => Err(format!("NVML cannot count GPUs: {err}")),
        }
    }

    /// Samples every GPU; the memory of the processes `pids` (the app and its rank processes) is the run's own.
    pub(super) fn sample(&mut self, sample: &mut Sample, pids: &[u32]) {
        let Ok(nvml) = &self.nvml else { return };
        let count = nvml.device_count().unwrap_or(0);
        for index in 0..count {
            // A device that fails to open (fallen off the bus) is skipped, not fatal for the others.
            if let Ok(device) = nvml.device_by_index(index) {
                sample.gpus.push(gpu_sample(&device, index, pids));
            }
        }
    }
}

fn gpu_sample(device: &Device<'_>, index: u32, pids: &[u32]) -> GpuSample {
    let memory = device.memory_info().ok();
    GpuSample {
        index,
        name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
        memory_used_bytes: memory.as_ref().map_or(0, |m| m.used),
        memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
        process_memory_bytes: process_memory(device, pids),
        utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
        temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
        power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        pcie_tx_bytes_per_sec: pcie(device, PcieUtilCounter::Send),
        pcie_rx_bytes_per_sec: pcie(device, PcieUtilCounter::Receive),
        budget_hold: None,
    }
}

/// Our memory on the device: CUDA (compute) and the GUI's own (graphics) contexts of every process in `pids`.
fn process_memory(device: &Device<'_>, pids: &[u32]) -> Option<u64> {
    let lists = [
        device.running_compute_processes(),
        device.running_graphics_processes(),
    ];
    let used = lists
        .into_iter()
        .flatten()
        .flatten()
        .map(|info| match info.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => (info.pid, Some(bytes)),
            UsedGpuMemory::Unavailable => (info.pid, None),
        });
    memory_of(pids, used)
}

/// The memory the processes `pids` hold, summed over `(pid, bytes)` entries (a process may appear once per
/// context); `None` when none of them has a known amount (not on the device, or WDDM hides it).
pub(crate) fn memory_of(
    pids: &[u32],
    used: impl Iterator<Item = (u32, Option<u64>)>,
) -> Option<u64> {
    used.filter(|(pid, _)| pids.contains(pid))
        .filter_map(|(_, bytes)| bytes)
        .reduce(|a, b| a + b)
}

fn pcie(device: &Device<'_>, counter: PcieUtilCounter) -> Option<u64> {
    // NVML reports KB/s.
    device
        .pcie_throughput(counter)
        .ok()
        .map(|kb| u64::from(kb) * 1024)
}

#[cfg(test)]
mod tests {
    use super::memory_of;

    #[test]
    fn the_runs_memory_is_summed_over_its_processes() {
        // The app (10), two rank processes (20, 30) and a stranger (99); rank 20 has a compute and a graphics
        // context, and one entry's amount is hidden.
        let entries = [
            (10, Some(100)),
            (20, Some(1_000)),
            (99, Some(7_000)),
            (30, Some(2_000)),
            (20, Some(5)),
            (30, None),
        ];
        assert_eq!(memory_of(&[10, 20, 30], entries.into_iter()), Some(3_105));
        assert_eq!(memory_of(&[10], entries.into_iter()), Some(100));
        assert_eq!(memory_of(&[42], entries.into_iter()), None);
        assert_eq!(memory_of(&[30], [(30, None)].into_iter()), None);
    }
}
