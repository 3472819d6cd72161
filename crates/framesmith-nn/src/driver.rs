//! Whether the NVIDIA driver library can be used, asked before the CUDA path opens a device.

/// Why the NVIDIA driver cannot be used, or `None` when it can be tried.
///
/// The Windows CUDA build imports the driver library (`nvcuda.dll`) lazily, so the program starts on a PC without
/// an NVIDIA driver; the first CUDA call would then fail hard. Every path that opens a CUDA device asks here first
/// and falls back to the CPU, or says what is missing. Elsewhere the driver library is linked normally and this
/// always answers `None`.
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
mod windows_impl {
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
                None
            }
            Err(_) => Some(
                "no NVIDIA driver is installed (nvcuda.dll was not found): training runs on the CPU. \
                 Install the NVIDIA driver (GeForce or Studio, 580 or newer) to train on the GPU"
                    .into(),
            ),
        }
    }
}
