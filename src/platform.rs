//! What the operating system provides that Framesmith checks before relying on it: the NVIDIA driver library of
//! the CUDA build on Windows, and the console a double-clicked app is given there. No GUI, no tensors.

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

/// Gives back the console window Windows opens for a console program started from Explorer or a shortcut, so
/// the app's window stands alone. A console shared with a shell (the program typed at a prompt) is kept, so
/// headless commands print as usual. Elsewhere it does nothing. Returns whether the console was given back.
pub fn release_own_console() -> bool {
    #[cfg(windows)]
    {
        windows_impl::release_own_console()
    }
    #[cfg(not(windows))]
    {
        false
    }
}

/// What to run instead of the app when no window can open.
const HEADLESS_HINT: &str =
    "run `framesmith demo` to train the demo model without a window, or `framesmith --help` for the other commands";

/// Why the app's window cannot open, or `None` when one can be tried: on Linux and the BSDs, neither `DISPLAY`
/// (X11) nor `WAYLAND_DISPLAY` (Wayland) is set, as on a server or in a plain SSH session.
pub fn display_missing() -> Option<String> {
    #[cfg(all(unix, not(target_os = "macos")))]
    {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        if !set("DISPLAY") && !set("WAYLAND_DISPLAY") {
            return Some(format!(
                "there is no display to open the app's window on: neither DISPLAY nor WAYLAND_DISPLAY is set (a \
                 server or an SSH session?); {HEADLESS_HINT}, or start it from a desktop session (or `ssh -X`)"
            ));
        }
    }
    None
}

/// The message for a window that failed to open: the windowing library's reason without the source file and line
/// it likes to add (`os error at …/winit-0.30/src/….rs:81: `), and what to do instead.
pub fn window_failed(reason: &str) -> String {
    let cleaned = regex::Regex::new(r"(os error )?at [^\s]+\.rs:\d+(:\d+)?:?\s*")
        .map(|re| re.replace_all(reason, "").trim().to_string())
        .unwrap_or_else(|_| reason.trim().to_string());
    let displays = if cfg!(all(unix, not(target_os = "macos"))) {
        "; check DISPLAY / WAYLAND_DISPLAY point to a running display"
    } else {
        ""
    };
    format!("the app's window could not open ({cleaned}){displays}; {HEADLESS_HINT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_error_loses_its_source_location() {
        let message = window_failed(
            "winit EventLoopError: os error at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/\
             winit-0.30.12/src/platform_impl/linux/mod.rs:785: neither WAYLAND_DISPLAY nor DISPLAY is set",
        );
        assert!(
            !message.contains(".rs:") && !message.contains("registry"),
            "{message}"
        );
        assert!(
            message.contains("winit EventLoopError: neither WAYLAND_DISPLAY nor DISPLAY is set")
                && message.contains("framesmith demo"),
            "{message}"
        );
    }
}

#[cfg(windows)]
mod windows_impl {
    // Two plain Win32 calls each, through the `windows` crate, which marks every foreign call `unsafe`.
    #![allow(unsafe_code)]

    use windows::Win32::System::Console::{FreeConsole, GetConsoleProcessList};

    pub fn release_own_console() -> bool {
        let mut processes = [0u32; 2];
        // SAFETY: the buffer is valid for its length; the call only writes process ids into it.
        let attached = unsafe { GetConsoleProcessList(&mut processes) };
        // Only this process on the console: Windows made it for us, nobody is reading it.
        attached == 1 && unsafe { FreeConsole() }.is_ok()
    }

    #[cfg(feature = "cuda")]
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
