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
    let install = missing_library_hint(&cleaned);
    format!("the app's window could not open ({cleaned}){install}{displays}; {HEADLESS_HINT}")
}

/// The text of a panic's payload (a `&str` or `String` message; anything else in general words).
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the windowing library stopped with an error".to_string())
}

/// Libraries the window loads at run time, and the Debian/Ubuntu package of each.
const RUNTIME_LIBRARIES: [(&str, &str); 8] = [
    ("libxkbcommon-x11", "libxkbcommon-x11-0"),
    ("libxkbcommon", "libxkbcommon0"),
    ("libX11-xcb", "libx11-xcb1"),
    ("libX11", "libx11-6"),
    ("libXcursor", "libxcursor1"),
    ("libXrandr", "libxrandr2"),
    ("libXi", "libxi6"),
    ("libvulkan", "libvulkan1"),
];

/// `: install it (…)` when `reason` names a library the window could not load.
fn missing_library_hint(reason: &str) -> String {
    if !(reason.contains("could not be loaded") || reason.contains("cannot open shared object")) {
        return String::new();
    }
    RUNTIME_LIBRARIES
        .iter()
        .find(|(lib, _)| {
            reason
                .split(|c: char| c.is_whitespace() || c == ':' || c == '`' || c == '\'')
                .any(|word| word.strip_prefix(lib).is_some_and(|rest| rest.starts_with(".so")))
        })
        .map(|(_, package)| {
            format!(": a system library is missing, install it (Debian/Ubuntu: `sudo apt install {package}`)")
        })
        .unwrap_or_else(|| ": a system library is missing, install it with your package manager".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_window_library_names_its_package() {
        let message = window_failed("Library libxkbcommon-x11.so could not be loaded.");
        assert!(
            message.contains("Library libxkbcommon-x11.so could not be loaded")
                && message.contains("sudo apt install libxkbcommon-x11-0")
                && message.contains("framesmith demo"),
            "{message}"
        );
        let message = window_failed("Library libxkbcommon.so could not be loaded.");
        assert!(message.contains("apt install libxkbcommon0"), "{message}");
        assert!(!window_failed("no display").contains("apt install"));
        let payload: Box<dyn std::any::Any + Send> = Box::new(String::from("boom"));
        assert_eq!(panic_text(&*payload), "boom");
    }

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
