//! What the planner reads from this machine: the card's free memory (NVML, loaded at run time, so machines
//! without the NVIDIA driver still plan) and the total RAM (sysinfo). Both are `None` without the `telemetry`
//! feature or when the driver is missing.

/// Free memory of CUDA device `index` now, per NVML. NVML numbers every GPU of the machine, CUDA only those
/// `CUDA_VISIBLE_DEVICES` lists, in its order: the ordinal is looked up there first (`None` where the entry
/// cannot be matched to a GPU, rather than another GPU's memory).
pub fn free_vram_bytes(index: usize) -> Option<u64> {
    #[cfg(feature = "telemetry")]
    {
        let nvml = nvml_wrapper::Nvml::init().ok()?;
        let device = nvml.device_by_index(nvml_index_in(&nvml, index)?).ok()?;
        device.memory_info().ok().map(|m| m.free)
    }
    #[cfg(not(feature = "telemetry"))]
    {
        let _ = index;
        None
    }
}

/// NVML's index of CUDA device `index` (the index the app's telemetry samples carry), matched as
/// [`free_vram_bytes`] matches it; `None` where it cannot be matched.
pub fn nvml_index(index: usize) -> Option<u32> {
    #[cfg(feature = "telemetry")]
    {
        let nvml = nvml_wrapper::Nvml::init().ok()?;
        nvml_index_in(&nvml, index)
    }
    #[cfg(not(feature = "telemetry"))]
    {
        let _ = index;
        None
    }
}

#[cfg(feature = "telemetry")]
fn nvml_index_in(nvml: &nvml_wrapper::Nvml, index: usize) -> Option<u32> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    match nvml_device(index, visible.as_deref())? {
        NvmlDevice::Index(i) => Some(i),
        NvmlDevice::UuidPrefix(prefix) => {
            let count = nvml.device_count().ok()?;
            let mut matching = (0..count).filter(|&i| {
                nvml.device_by_index(i)
                    .is_ok_and(|d| d.uuid().is_ok_and(|u| u.starts_with(&prefix)))
            });
            let found = matching.next()?;
            matching.next().is_none().then_some(found)
        }
    }
}

/// An NVML device as `CUDA_VISIBLE_DEVICES` names it.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "telemetry"), allow(dead_code))]
enum NvmlDevice {
    /// NVML's index (CUDA's order is the PCI bus order NVML uses, on machines of one GPU model).
    Index(u32),
    /// A GPU UUID (`GPU-…`, which CUDA also takes shortened to a unique prefix).
    UuidPrefix(String),
}

/// The NVML device of CUDA ordinal `index` under `visible` (the value of `CUDA_VISIBLE_DEVICES`; unset: every
/// GPU, numbered as NVML does). `None` for an ordinal past the list, a MIG instance (whose memory NVML reports
/// differently) or an entry CUDA would not take (it stops enumerating there).
#[cfg_attr(not(feature = "telemetry"), allow(dead_code))]
fn nvml_device(index: usize, visible: Option<&str>) -> Option<NvmlDevice> {
    let Some(list) = visible else {
        return u32::try_from(index).ok().map(NvmlDevice::Index);
    };
    for (k, entry) in list.split(',').map(str::trim).enumerate() {
        let device = if let Ok(i) = entry.parse::<u32>() {
            NvmlDevice::Index(i)
        } else if entry.starts_with("GPU-") {
            NvmlDevice::UuidPrefix(entry.to_string())
        } else {
            return None;
        };
        if k == index {
            return Some(device);
        }
    }
    None
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

/// What of the host RAM the machine can give now without swapping (sysinfo's available memory: free plus what
/// the OS can reclaim, such as file caches).
pub fn available_ram_bytes() -> Option<u64> {
    #[cfg(feature = "telemetry")]
    {
        use sysinfo::{MemoryRefreshKind, System};
        let mut system = System::new().ok()?;
        system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        Some(system.available_memory()).filter(|&b| b > 0)
    }
    #[cfg(not(feature = "telemetry"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{nvml_device, NvmlDevice};

    #[test]
    fn cuda_ordinals_are_looked_up_in_cuda_visible_devices() {
        use NvmlDevice::{Index, UuidPrefix};
        assert_eq!(nvml_device(1, None), Some(Index(1)));
        assert_eq!(nvml_device(0, Some("3")), Some(Index(3)));
        assert_eq!(nvml_device(1, Some("2, 0")), Some(Index(0)));
        assert_eq!(nvml_device(2, Some("2,0")), None);
        assert_eq!(
            nvml_device(0, Some("GPU-8f1c2a")),
            Some(UuidPrefix("GPU-8f1c2a".into()))
        );
        // CUDA stops at an entry it cannot read, and NVML reports a MIG instance's memory another way.
        assert_eq!(nvml_device(1, Some("1,x,2")), None);
        assert_eq!(nvml_device(0, Some("MIG-1c2d")), None);
        assert_eq!(nvml_device(0, Some("")), None);
    }
}
