//! Where an external tool (ffmpeg, ffprobe, ffplay) is found: beside the running executable (as an installer that
//! ships one puts it), else the first match on `PATH`. The data readers and the app's player both look here.

use std::path::PathBuf;

/// `name` (without `.exe`) beside the running executable, else the first match on `PATH`.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let file = if cfg!(windows) {
        format!("{name}.exe")
    } else {
        name.to_owned()
    };
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&file)))
        .filter(|p| p.is_file());
    beside_exe.or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join(&file))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_does_not_exist_is_not_found() {
        assert_eq!(find_tool("framesmith-no-such-tool-7f3a"), None);
    }
}
