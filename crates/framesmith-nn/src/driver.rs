//! Whether the NVIDIA driver library can be used, asked before the CUDA path opens a device.

/// Why the NVIDIA driver cannot be used, or `None` when it can be tried.
///
/// The Windows CUDA build imports the driver library (`nvcuda.dll`) lazily, so the program starts on a PC without
/// an NVIDIA driver; the first CUDA call would then fail hard. Every path that opens a CUDA device asks here first
/// and falls back to the CPU, or says what is missing. Elsewhere the driver library is linked normally and this
/// always answers `None`.
///
/// The Windows GPU build also imports cuDNN (`cudnn64_9.dll`, shipped beside `framesmith.exe` for the fused
/// attention and convolutions) lazily; it counts as missing here too, so a broken install trains on the CPU with
/// a message instead of stopping at the first attention.
pub fn nvidia_driver_missing() -> Option<String> {
    #[cfg(all(windows, feature = "cuda"))]
    {
        windows_impl::driver_missing()
    }
    #[cfg(not(all(windows, feature = "cuda")))]
    {
        None
    }
}

#[cfg(all(windows, feature = "cuda"))]
pub(crate) mod windows_impl {
    // One plain Win32 call through the `windows` crate, which marks every foreign call `unsafe`.
    #![allow(unsafe_code)]

    pub fn driver_missing() -> Option<String> {
        use windows::core::w;
        use windows::Win32::Foundation::FreeLibrary;
        use windows::Win32::System::LibraryLoader::{LoadLibraryExW, LOAD_LIBRARY_SEARCH_SYSTEM32};

        // SAFETY: loading the driver's own DLL from System32 runs only its initialisation, as any CUDA program
        // does; the handle is released at once (the delay-load import takes its own reference later).
        match unsafe { LoadLibraryExW(w!("nvcuda.dll"), None, LOAD_LIBRARY_SEARCH_SYSTEM32) } {
            Ok(module) => {
                let _ = unsafe { FreeLibrary(module) };
            }
            Err(_) => {
                return Some(
                    "no NVIDIA driver is installed (nvcuda.dll was not found): training runs on the CPU. \
                     Install the NVIDIA driver (GeForce or Studio, 580 or newer) to train on the GPU"
                        .into(),
                )
            }
        }
        #[cfg(feature = "cudnn")]
        if let Err(why) = cudnn_module() {
            return Some(why);
        }
        None
    }

    /// cuDNN's DLL as the delay-load import will find it (the exe's folder first), loaded and kept loaded.
    #[cfg(feature = "cudnn")]
    pub fn cudnn_module() -> Result<windows::Win32::Foundation::HMODULE, String> {
        use windows::core::w;
        use windows::Win32::System::LibraryLoader::LoadLibraryW;
        // SAFETY: loads NVIDIA's cuDNN DLL by name with the standard search order, as its delay-load import
        // does at the first cuDNN call; the module stays loaded for the process's life (that import uses it).
        unsafe { LoadLibraryW(w!("cudnn64_9.dll")) }.map_err(|e| {
            format!(
                "cuDNN (cudnn64_9.dll) could not be loaded ({e}): training runs on the CPU. \
                 Reinstall Framesmith with the GPU installer (Framesmith-Setup-<version>-cuda.exe), which puts \
                 cuDNN beside framesmith.exe"
            )
        })
    }
}
