//! Reads the system check's facts: this build's features, the driver and GPUs (NVML, loaded at run time, with the
//! `telemetry` feature), the CUDA side of a GPU build (`framesmith_nn::device::cuda_libraries`), and ffmpeg as the
//! dataset reader finds it. RAM, the page-locked limit and the disk are in `host`. Every reader turns what it
//! cannot read into a reason in the facts, never an error.

use std::path::Path;

use framesmith_config::protocol::doctor::{
    BuildFacts, CudaFacts, GpuScan, LibraryFacts, MediaFacts, SystemFacts, ToolFacts,
};
use framesmith_nn::device::Library;

use super::host;

/// Everything the check reads, for an output folder `output_dir`.
pub fn gather(output_dir: &Path) -> SystemFacts {
    // NVML first: its free-memory numbers must not include what CUDA's own queries below might take.
    let gpus = gpu_scan();
    SystemFacts {
        build: build(),
        gpus,
        cuda: cuda_facts(),
        memory: host::memory(),
        media: media(),
        disk: host::disk(output_dir),
    }
}

fn build() -> BuildFacts {
    BuildFacts {
        version: env!("CARGO_PKG_VERSION").into(),
        platform: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        cuda: framesmith_nn::device::CUDA_BUILD,
        cudnn: framesmith_nn::device::CUDNN_BUILD,
        reads_machine: cfg!(feature = "telemetry"),
    }
}

#[cfg(feature = "telemetry")]
fn gpu_scan() -> GpuScan {
    use framesmith_config::protocol::doctor::{CudaVersion, DriverFacts};
    use nvml_wrapper::{cuda_driver_version_major, cuda_driver_version_minor, Nvml};

    let nvml = match Nvml::init() {
        Ok(nvml) => nvml,
        Err(err) => {
            return GpuScan {
                error: Some(format!("no NVIDIA driver found (NVML: {err})")),
                ..GpuScan::default()
            }
        }
    };
    let driver = nvml.sys_driver_version().ok().map(|version| DriverFacts {
        version,
        cuda: nvml.sys_cuda_driver_version().ok().map(|v| CudaVersion {
            major: u32::try_from(cuda_driver_version_major(v)).unwrap_or(0),
            minor: u32::try_from(cuda_driver_version_minor(v)).unwrap_or(0),
        }),
    });
    let count = match nvml.device_count() {
        Ok(count) => count,
        Err(err) => {
            return GpuScan {
                driver,
                gpus: Vec::new(),
                error: Some(format!("NVML cannot count the GPUs: {err}")),
            }
        }
    };
    let gpus = (0..count)
        .filter_map(|index| {
            // A device that fails to open (fallen off the bus) is left out; the others are still listed.
            let device = nvml.device_by_index(index).ok()?;
            Some(gpu_facts(&device, index))
        })
        .collect();
    GpuScan {
        driver,
        gpus,
        error: None,
    }
}

#[cfg(feature = "telemetry")]
fn gpu_facts(
    device: &nvml_wrapper::Device<'_>,
    index: u32,
) -> framesmith_config::protocol::doctor::GpuFacts {
    use framesmith_config::protocol::doctor::{ComputeCapability, GpuFacts};

    let memory = device.memory_info().ok();
    GpuFacts {
        index,
        name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
        compute_capability: device.cuda_compute_capability().ok().and_then(|c| {
            Some(ComputeCapability {
                major: u32::try_from(c.major).ok()?,
                minor: u32::try_from(c.minor).ok()?,
            })
        }),
        memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
        memory_free_bytes: memory.as_ref().map_or(0, |m| m.free),
        driver_model: driver_model(device),
    }
}

/// WDDM or TCC, read on Windows only (NVML has no driver model elsewhere).
#[cfg(feature = "telemetry")]
fn driver_model(
    device: &nvml_wrapper::Device<'_>,
) -> Option<framesmith_config::protocol::doctor::DriverModel> {
    #[cfg(windows)]
    {
        use framesmith_config::protocol::doctor::DriverModel;
        use nvml_wrapper::enum_wrappers::device::DriverModel as Nvml;
        // A model this NVML wrapper does not know (MCDM) reads as unknown.
        device.driver_model().ok().map(|state| match state.current {
            Nvml::WDDM => DriverModel::Wddm,
            Nvml::WDM => DriverModel::Tcc,
        })
    }
    #[cfg(not(windows))]
    {
        let _ = device;
        None
    }
}

#[cfg(not(feature = "telemetry"))]
fn gpu_scan() -> GpuScan {
    GpuScan {
        error: Some(
            "this build does not read the GPUs (built without the `telemetry` feature)".into(),
        ),
        ..GpuScan::default()
    }
}

/// ffmpeg and ffprobe where the dataset reader looks for them, each with its version line.
fn media() -> MediaFacts {
    let tool = |name: &str| {
        framesmith_data::media::find_tool(name).map(|path| ToolFacts {
            version: framesmith_data::media::tool_version(&path),
            path,
        })
    };
    MediaFacts {
        ffmpeg: tool("ffmpeg"),
        ffprobe: tool("ffprobe"),
        media_foundation: cfg!(windows),
    }
}

/// The devices CUDA counts and the libraries' versions, with the file each was loaded from (Linux); `None` in a
/// build without CUDA.
fn cuda_facts() -> Option<CudaFacts> {
    let libraries = framesmith_nn::device::cuda_libraries()?;
    let (device_count, device_error) = match libraries.device_count {
        Ok(n) => (Some(n), None),
        Err(err) => (None, Some(err)),
    };
    // Read after cuDNN was opened, so its file is mapped too.
    let maps = host::loaded_files();
    let facts = |lib: Library| LibraryFacts {
        name: lib.name.into(),
        path: host::loaded_path(&maps, lib.file_prefix),
        version: lib.version.as_ref().ok().cloned(),
        error: lib.version.err(),
    };
    Some(CudaFacts {
        device_count,
        device_error,
        libraries: libraries.linked.into_iter().map(facts).collect(),
        cudnn: libraries.cudnn.map(facts),
    })
}
