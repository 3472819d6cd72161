//! NVIDIA GPUs through NVML (loaded at run time, so machines without the driver still start).

use nvml_wrapper::enum_wrappers::device::{PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};

use super::history::{GpuSample, Sample};

/// NVML opened once, or why it could not be.
pub(super) struct NvmlSource {
    nvml: Result<Nvml, String>,
    pid: u32,
}

impl NvmlSource {
    pub(super) fn open() -> Self {
        let nvml = Nvml::init().map_err(|err| format!("no NVIDIA GPU found (NVML: {err})"));
        Self {
            nvml,
            pid: std::process::id(),
        }
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

    pub(super) fn sample(&mut self, sample: &mut Sample) {
        let Ok(nvml) = &self.nvml else { return };
        let count = nvml.device_count().unwrap_or(0);
        for index in 0..count {
            // A device that fails to open (fallen off the bus) is skipped, not fatal for the others.
            if let Ok(device) = nvml.device_by_index(index) {
                sample.gpus.push(gpu_sample(&device, index, self.pid));
            }
        }
    }
}

fn gpu_sample(device: &Device<'_>, index: u32, pid: u32) -> GpuSample {
    let memory = device.memory_info().ok();
    GpuSample {
        index,
        name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
        memory_used_bytes: memory.as_ref().map_or(0, |m| m.used),
        memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
        process_memory_bytes: process_memory(device, pid),
        utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
        temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
        power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        pcie_tx_bytes_per_sec: pcie(device, PcieUtilCounter::Send),
        pcie_rx_bytes_per_sec: pcie(device, PcieUtilCounter::Receive),
    }
}

/// Our memory on the device: CUDA (compute) and the GUI's own (graphics) contexts together.
fn process_memory(device: &Device<'_>, pid: u32) -> Option<u64> {
    let mut total = None;
    let lists = [
        device.running_compute_processes(),
        device.running_graphics_processes(),
    ];
    for info in lists.into_iter().flatten().flatten() {
        if info.pid == pid {
            if let UsedGpuMemory::Used(bytes) = info.used_gpu_memory {
                total = Some(total.unwrap_or(0) + bytes);
            }
        }
    }
    total
}

fn pcie(device: &Device<'_>, counter: PcieUtilCounter) -> Option<u64> {
    // NVML reports KB/s.
    device
        .pcie_throughput(counter)
        .ok()
        .map(|kb| u64::from(kb) * 1024)
}
