//! What the GPU build's CUDA libraries say about themselves, for the system check: how many devices the driver
//! reports (or its error), the version of each library linked in — the driver API, cuBLAS, cuBLASLt, cuRAND,
//! NVRTC — and, with the `cudnn` feature, whether cuDNN (opened only when attention first runs) can be loaded.
//! Host-side queries only: no context is created and no device memory is taken.

use std::ffi::c_int;

use candle_core::cuda_backend::cudarc;
use cudarc::driver::result::DriverError;

pub use crate::device::Library;

fn driver_error(call: &str, err: DriverError) -> String {
    let text = err
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{call} failed: {:?} ({text})", err.0)
}

/// CUDA devices the driver reports (`cuInit`, `cuDeviceGetCount`), or why it cannot count them.
pub fn device_count() -> Result<usize, String> {
    if let Some(why) = crate::driver::nvidia_driver_missing() {
        return Err(why);
    }
    cudarc::driver::result::init().map_err(|e| driver_error("cuInit", e))?;
    let count = cudarc::driver::result::device::get_count()
        .map_err(|e| driver_error("cuDeviceGetCount", e))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// `major.minor.patch` from the three library properties.
fn semver(property: impl Fn(u32) -> Result<c_int, String>) -> Result<String, String> {
    Ok(format!(
        "{}.{}.{}",
        property(0)?,
        property(1)?,
        property(2)?
    ))
}

/// A `major * 10000 + minor * 100 + patch` version number (cuBLASLt, cuDNN 9).
fn packed_version(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
}

fn driver_version() -> Result<String, String> {
    if let Some(why) = crate::driver::nvidia_driver_missing() {
        return Err(why);
    }
    let mut v: c_int = 0;
    // SAFETY: a plain query that writes one int; valid before cuInit.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| driver_error("cuDriverGetVersion", e))?;
    Ok(format!("{}.{}", v / 1000, v % 1000 / 10))
}

fn cublas_version() -> Result<String, String> {
    use cudarc::cublas::sys::{cublasGetProperty, libraryPropertyType};
    semver(|p| {
        let property = match p {
            0 => libraryPropertyType::MAJOR_VERSION,
            1 => libraryPropertyType::MINOR_VERSION,
            _ => libraryPropertyType::PATCH_LEVEL,
        };
        let mut v: c_int = 0;
        // SAFETY: a host-side query that writes one int; needs no handle or context.
        unsafe { cublasGetProperty(property, &mut v) }
            .result()
            .map_err(|e| format!("cublasGetProperty failed: {e}"))?;
        Ok(v)
    })
}

fn cublas_lt_version() -> Result<String, String> {
    // SAFETY: returns the library's version number; no arguments, no state.
    let v = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
    Ok(packed_version(v))
}

fn curand_version() -> Result<String, String> {
    use cudarc::curand::sys::{curandGetProperty, libraryPropertyType};
    semver(|p| {
        let property = match p {
            0 => libraryPropertyType::MAJOR_VERSION,
            1 => libraryPropertyType::MINOR_VERSION,
            _ => libraryPropertyType::PATCH_LEVEL,
        };
        let mut v: c_int = 0;
        // SAFETY: a host-side query that writes one int; needs no generator or context.
        unsafe { curandGetProperty(property, &mut v) }
            .result()
            .map_err(|e| format!("curandGetProperty failed: {e}"))?;
        Ok(v)
    })
}

fn nvrtc_version() -> Result<String, String> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints; no other state.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e}"))?;
    Ok(format!("{major}.{minor}"))
}

/// The libraries linked into this build, each with its version.
pub fn linked() -> Vec<Library> {
    vec![
        Library {
            name: "CUDA driver API",
            file_prefix: "libcuda.so",
            version: driver_version(),
        },
        Library {
            name: "cuBLAS",
            file_prefix: "libcublas.so",
            version: cublas_version(),
        },
        Library {
            name: "cuBLASLt",
            file_prefix: "libcublasLt.so",
            version: cublas_lt_version(),
        },
        Library {
            name: "cuRAND",
            file_prefix: "libcurand.so",
            version: curand_version(),
        },
        Library {
            name: "NVRTC",
            file_prefix: "libnvrtc.so",
            version: nvrtc_version(),
        },
    ]
}

/// The file the fused attention opens at its first call (`kernels/cudnn_sdpa.cpp`).
#[cfg(all(feature = "cudnn", not(windows)))]
const CUDNN_FILE: &std::ffi::CStr = c"libcudnn.so.9";

/// cuDNN as the fused attention will find it: opened by the same name, asked for its version. The library stays
/// loaded (the attention shim opens it anyway), so its path can be read from the process's mappings.
#[cfg(feature = "cudnn")]
pub fn cudnn() -> Library {
    Library {
        name: "cuDNN",
        file_prefix: "libcudnn.so",
        version: cudnn_version(),
    }
}

#[cfg(all(feature = "cudnn", target_os = "linux"))]
fn cudnn_version() -> Result<String, String> {
    let last_error = || {
        // SAFETY: dlerror returns null or a NUL-terminated string owned by libc, copied at once.
        let msg = unsafe { libc::dlerror() };
        if msg.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated (above).
            unsafe { std::ffi::CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: loads a shared library by name, as the attention shim does; the handle is kept for the process's
    // life, so no symbol taken from it can dangle.
    let handle = unsafe { libc::dlopen(CUDNN_FILE.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(format!("cannot open libcudnn.so.9: {}", last_error()));
    }
    // SAFETY: `handle` is a live library handle and the name is NUL-terminated.
    let symbol = unsafe { libc::dlsym(handle, c"cudnnGetVersion".as_ptr()) };
    if symbol.is_null() {
        return Err(format!(
            "libcudnn.so.9 has no cudnnGetVersion: {}",
            last_error()
        ));
    }
    // SAFETY: cuDNN declares `size_t cudnnGetVersion(void)`; the symbol was found in the library just loaded.
    let get_version = unsafe {
        std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn() -> usize>(symbol)
    };
    // SAFETY: no arguments, no state.
    let v = unsafe { get_version() };
    // cuDNN 9 packs major * 10000 + minor * 100 + patch; cuDNN 8 packed major * 1000.
    Ok(if v >= 90000 {
        packed_version(v)
    } else {
        format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    })
}

/// On Windows: `cudnn64_9.dll` as the delay-load import finds it (beside framesmith.exe first), asked for its
/// version through `cudnnGetVersion`.
#[cfg(all(feature = "cudnn", windows))]
#[allow(unsafe_code)]
fn cudnn_version() -> Result<String, String> {
    use windows::core::s;
    use windows::Win32::System::LibraryLoader::GetProcAddress;
    let module = crate::driver::windows_impl::cudnn_module()?;
    // SAFETY: `module` is a loaded library kept for the process's life; the name is NUL-terminated.
    let symbol = unsafe { GetProcAddress(module, s!("cudnnGetVersion")) }
        .ok_or_else(|| "cudnn64_9.dll has no cudnnGetVersion".to_owned())?;
    // SAFETY: cuDNN declares `size_t cudnnGetVersion(void)`; the symbol comes from that DLL.
    let get_version = unsafe {
        std::mem::transmute::<unsafe extern "system" fn() -> isize, unsafe extern "C" fn() -> usize>(
            symbol,
        )
    };
    // SAFETY: no arguments, no state.
    Ok(packed_version(unsafe { get_version() }))
}

#[cfg(all(feature = "cudnn", not(any(target_os = "linux", windows))))]
fn cudnn_version() -> Result<String, String> {
    Err(format!(
        "the fused attention opens {} on Linux and Windows only",
        CUDNN_FILE.to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_versions_read_as_major_minor_patch() {
        assert_eq!(packed_version(91900), "9.19.0");
        assert_eq!(packed_version(130001), "13.0.1");
    }

    #[test]
    fn every_linked_library_answers_on_a_gpu_machine() {
        let count = device_count();
        assert!(count.as_ref().is_ok_and(|&n| n > 0), "{count:?}");
        for lib in linked() {
            assert!(lib.version.is_ok(), "{lib:?}");
        }
    }

    #[cfg(feature = "cudnn")]
    #[test]
    fn cudnn_loads_and_reports_version_9() {
        let lib = cudnn();
        assert!(
            lib.version.as_ref().is_ok_and(|v| v.starts_with("9.")),
            "{lib:?}"
        );
    }
}
