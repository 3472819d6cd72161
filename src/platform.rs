//! The console a double-clicked program is given on Windows. No GUI, no tensors.

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
}
