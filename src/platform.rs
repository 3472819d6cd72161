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

/// Runs `handler` when the console window is closed, the user logs off or Windows shuts down, and keeps the
/// process alive while it runs (Windows ends the process when it returns, or about 5 s after a close whatever
/// happens). Ctrl-C and Ctrl-Break are left to the other handlers. Elsewhere nothing is installed (a closed
/// terminal sends SIGHUP, which the Ctrl-C handler already takes). Returns whether the handler was installed.
pub fn on_console_close(handler: fn()) -> bool {
    #[cfg(windows)]
    {
        windows_impl::on_console_close(handler)
    }
    #[cfg(not(windows))]
    {
        let _ = handler;
        false
    }
}

#[cfg(windows)]
mod windows_impl {
    // Two plain Win32 calls each, through the `windows` crate, which marks every foreign call `unsafe`.
    #![allow(unsafe_code)]

    use std::sync::OnceLock;

    use windows::core::BOOL;
    use windows::Win32::System::Console::{
        FreeConsole, GetConsoleProcessList, SetConsoleCtrlHandler, CTRL_CLOSE_EVENT,
        CTRL_LOGOFF_EVENT, CTRL_SHUTDOWN_EVENT,
    };

    static ON_CLOSE: OnceLock<fn()> = OnceLock::new();

    unsafe extern "system" fn console_event(kind: u32) -> BOOL {
        match (kind, ON_CLOSE.get()) {
            (CTRL_CLOSE_EVENT | CTRL_LOGOFF_EVENT | CTRL_SHUTDOWN_EVENT, Some(handler)) => {
                handler();
                BOOL::from(true)
            }
            // Ctrl-C and Ctrl-Break go on to the handler registered before this one.
            _ => BOOL::from(false),
        }
    }

    pub fn on_console_close(handler: fn()) -> bool {
        if ON_CLOSE.set(handler).is_err() {
            return false;
        }
        // SAFETY: registers a plain function that lives as long as the program; Windows calls it on its own
        // thread, and it only reads the `OnceLock` set above.
        unsafe { SetConsoleCtrlHandler(Some(console_event), true) }.is_ok()
    }

    pub fn release_own_console() -> bool {
        let mut processes = [0u32; 2];
        // SAFETY: the buffer is valid for its length; the call only writes process ids into it.
        let attached = unsafe { GetConsoleProcessList(&mut processes) };
        // Only this process on the console: Windows made it for us, nobody is reading it.
        attached == 1 && unsafe { FreeConsole() }.is_ok()
    }
}
