//! Why the app's window cannot open, said so that a user knows what to run instead.

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
