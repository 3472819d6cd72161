//! The ffmpeg tools as subprocesses: run with a time limit (a hung tool is killed and reported), found beside the
//! executable or on `PATH`, asked for their version.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::{MediaError, DEFAULT_PROBE_TIMEOUT};

/// Output of a finished subprocess.
#[derive(Debug)]
pub(super) struct Finished {
    pub(super) status: ExitStatus,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
}

/// Runs `cmd`, reading stdout and stderr on their own threads so that neither pipe can fill up and block the
/// child. Past `timeout` the child is killed: a hung decoder is reported, not waited on.
pub(super) fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
    tool: &str,
    path: &Path,
) -> Result<Finished, MediaError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(windows)]
    {
        // CREATE_NO_WINDOW: from the app, each decode would otherwise flash a console window.
        use std::os::windows::process::CommandExt;
        cmd.creation_flags(0x0800_0000);
    }
    let mut child = cmd.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => MediaError::ToolMissing { tool: tool.into() },
        _ => MediaError::Io {
            tool: tool.into(),
            path: path.to_path_buf(),
            source,
        },
    })?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let read = stdout.map(|mut s| s.read_to_end(&mut buf));
        // The receiver is gone only after a timeout, when the output is no longer wanted.
        let _ = tx.send((buf, read.map(|r| r.is_ok()).unwrap_or(true)));
    });
    let stderr = child.stderr.take();
    let stderr_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut s) = stderr {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    match rx.recv_timeout(timeout) {
        Ok((stdout, _)) => {
            let status = wait(&mut child, tool, path)?;
            let stderr = stderr_reader.join().unwrap_or_default();
            Ok(Finished {
                status,
                stdout,
                stderr,
            })
        }
        Err(_) => {
            // Killing closes the pipes, which ends both reader threads.
            let _ = child.kill();
            let _ = child.wait();
            Err(MediaError::Timeout {
                tool: tool.into(),
                secs: timeout.as_secs_f64().ceil() as u64,
                path: path.to_path_buf(),
            })
        }
    }
}

fn wait(child: &mut Child, tool: &str, path: &Path) -> Result<ExitStatus, MediaError> {
    child.wait().map_err(|source| MediaError::Io {
        tool: tool.into(),
        path: path.to_path_buf(),
        source,
    })
}

/// The first line of `tool -version` (`ffmpeg version 6.1.1-3ubuntu5 …`), or why it did not answer; within the
/// probe time limit, so a hung tool is reported, not waited on.
pub fn tool_version(tool: &Path) -> Result<String, String> {
    let name = tool
        .file_stem()
        .map_or_else(|| "the tool".into(), |s| s.to_string_lossy().into_owned());
    let mut cmd = Command::new(tool);
    cmd.arg("-version");
    let out =
        run_with_timeout(cmd, DEFAULT_PROBE_TIMEOUT, &name, tool).map_err(|err| match err {
            MediaError::Timeout { secs, .. } => {
                format!("{name} -version did not answer within {secs} s")
            }
            MediaError::Io { source, .. } => format!("cannot run {name} ({source})"),
            other => other.reason(),
        })?;
    if !out.status.success() {
        return Err(format!("{name} -version failed ({})", out.status));
    }
    // "ffmpeg version 5.1.6-0+deb12u1 Copyright (c) 2000-2024 the FFmpeg developers": the part before the notice.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(" Copyright").next().unwrap_or(l).trim())
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| format!("{name} -version printed nothing"))
}

/// Where [`MediaTools::locate`] finds the tools: beside the running executable, else on `PATH`.
pub use framesmith_config::tools::find_tool;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn tool_version_reads_the_first_line_or_says_why_not() {
        let missing = tool_version(Path::new("/nonexistent/ffmpeg")).unwrap_err();
        assert!(missing.contains("ffmpeg"), "{missing}");
        // ffmpeg is on the PATH of the test machines (the decoding tests need it too).
        if let Some(ffmpeg) = find_tool("ffmpeg") {
            let line = tool_version(&ffmpeg).unwrap();
            assert!(
                line.starts_with("ffmpeg version") && !line.contains("Copyright"),
                "{line}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn hung_process_is_killed_and_reported() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exec sleep 30"]);
        let err = run_with_timeout(
            cmd,
            Duration::from_millis(100),
            "ffprobe",
            Path::new("/d/hung.mp4"),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, MediaError::Timeout { .. }), "{msg}");
        assert!(msg.ends_with("/d/hung.mp4"), "{msg}");
    }
}
