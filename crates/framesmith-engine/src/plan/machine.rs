//! What the planner reads from this machine: the card's free memory (NVML, loaded at run time, so machines
//! without the NVIDIA driver still plan) and the total RAM (sysinfo). Both are `None` without the `telemetry`
//! feature or when the driver is missing.

/// Free memory of CUDA device `index` now, per NVML.
pub fn free_vram_bytes(index: usize) -> Option<u64> {
    #[cfg(feature = "telemetry")]
    {
        let nvml = nvml_wrapper::Nvml::init().ok()?;
        let device = nvml.device_by_index(u32::try_from(index).ok()?).ok()?;
        device.memory_info().ok().map(|m| m.free)
    }
    #[cfg(not(feature = "telemetry"))]
    {
        let _ = index;
        None
    }
}

/// Total host RAM.
pub fn host_ram_bytes() -> Option<u64> {
    #[cfg(feature = "telemetry")]
    {
        use sysinfo::{MemoryRefreshKind, System};
        let mut system = System::new().ok()?;
        system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        Some(system.total_memory()).filter(|&b| b > 0)
    }
    #[cfg(not(feature = "telemetry"))]
    {
        None
    }
}
