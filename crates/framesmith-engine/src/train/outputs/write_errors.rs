//! What a failed write of a run's output says: out of disk space gets its own message (what was being written,
//! how much it needed, and what to do once there is space, checked against what the run folder holds); anything
//! else names the file.

use std::path::Path;

use framesmith_config::outputs::{checked_states_newest_first, holds_run};
use framesmith_nn::lora_file::LoraFileError;

use super::io_context;

/// The I/O error behind a candle failure to write a file, if that is what it was.
pub(super) fn candle_io(err: &candle_core::Error) -> Option<&std::io::Error> {
    match err {
        candle_core::Error::Io(io) => Some(io),
        candle_core::Error::WithPath { inner, .. }
        | candle_core::Error::Context { inner, .. }
        | candle_core::Error::WithBacktrace { inner, .. } => candle_io(inner),
        other => {
            // A safetensors write error names its I/O error as its source.
            let mut source = std::error::Error::source(other);
            while let Some(error) = source {
                if let Some(io) = error.downcast_ref::<std::io::Error>() {
                    return Some(io);
                }
                source = error.source();
            }
            None
        }
    }
}

/// Whether an I/O error means the disk (or the user's quota) is full.
pub fn is_disk_full(err: &std::io::Error) -> bool {
    // ENOSPC / EDQUOT on Unix; ERROR_HANDLE_DISK_FULL / ERROR_DISK_FULL on Windows.
    let raw = err.raw_os_error();
    err.kind() == std::io::ErrorKind::StorageFull
        || err.kind() == std::io::ErrorKind::QuotaExceeded
        || (cfg!(unix) && matches!(raw, Some(28 | 122)))
        || (cfg!(windows) && matches!(raw, Some(39 | 112)))
}

/// The message for a write that ran out of disk space: what was being written, how much it needed, and what
/// to do; the earlier files are kept.
pub(super) fn disk_full(action: &str, path: &Path, needed_bytes: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "out of disk space: could not {action} (it needs about {:.1} MiB). Nothing half-written was left, and the \
         files saved before are kept. Free space on that disk, or set output.output_dir to another disk, then {}: \
         {}",
        needed_bytes as f64 / (1u64 << 20) as f64,
        once_there_is_space(path),
        path.display()
    )
}

/// What to do once there is space again: go on from the newest good training state of the run that was writing
/// `path` when there is one, else start the run again (a `--resume` would find nothing to continue).
fn once_there_is_space(path: &Path) -> String {
    // `path` is in the run folder, in one of its state folders or in its `samples` folder.
    let state = path
        .ancestors()
        .skip(1)
        .take(2)
        .find(|dir| holds_run(dir))
        .and_then(|run| {
            checked_states_newest_first(run, None)
                .into_iter()
                .find_map(Result::ok)
        });
    match state {
        Some(state) => format!("go on with --resume {}", state.dir.display()),
        None => {
            "start the run again (no training state was saved yet, so there is nothing to resume)"
                .into()
        }
    }
}

/// An I/O failure while writing an output: out of space gets its own message; anything else names the file.
pub(super) fn write_failure(
    err: std::io::Error,
    action: &str,
    path: &Path,
    needed_bytes: u64,
) -> anyhow::Error {
    if is_disk_full(&err) {
        disk_full(action, path, needed_bytes)
    } else {
        anyhow::Error::new(err).context(io_context(action, path))
    }
}

/// A failed LoRA write: out of space gets its own message; anything else keeps the LoRA writer's.
pub(super) fn lora_write_failure(
    err: LoraFileError,
    action: &str,
    path: &Path,
    needed_bytes: u64,
) -> anyhow::Error {
    let disk_is_full = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(is_disk_full);
    if disk_is_full {
        disk_full(action, path, needed_bytes)
    } else {
        anyhow::Error::new(err).context(io_context(action, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_space_says_what_failed_and_what_it_needed() {
        let full = || std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert!(is_disk_full(&full()));
        #[cfg(unix)]
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(28)));
        assert!(!is_disk_full(&std::io::Error::from(
            std::io::ErrorKind::PermissionDenied
        )));
        let path = Path::new("out/run.safetensors");
        let message = format!(
            "{:#}",
            write_failure(full(), "append to the metrics log", path, 3 << 20)
        );
        assert!(
            message.starts_with("out of disk space: could not append to the metrics log")
                && message.contains("3.0 MiB")
                && message.ends_with("out/run.safetensors"),
            "{message}"
        );
        let lora = LoraFileError::Io {
            action: "write",
            path: path.to_path_buf(),
            source: full(),
        };
        let message = format!(
            "{:#}",
            lora_write_failure(lora, "save the LoRA", path, 1 << 20)
        );
        assert!(
            message.contains("could not save the LoRA (it needs about 1.0 MiB)"),
            "{message}"
        );
        let denied = write_failure(
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            "write",
            path,
            1,
        );
        assert!(format!("{denied:#}").starts_with("cannot write out/run.safetensors"));
    }

    /// The advice after a full disk names a state to resume only when the run folder holds a good one.
    #[test]
    fn out_of_space_advice_is_checked_against_the_run_folder() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        std::fs::write(run.join("run.toml"), "").unwrap();
        let path = run.join("demo-lora-000004.safetensors");
        let message = format!("{:#}", disk_full("save the LoRA", &path, 1 << 20));
        assert!(
            message.contains("then start the run again (no training state was saved yet")
                && !message.contains("resume:")
                && !message.contains("--resume"),
            "{message}"
        );
        // A state folder without its tensors is no state to resume from either.
        let state = run.join("demo-state-000004");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("state.json"), "{}").unwrap();
        let message = format!("{:#}", disk_full("save the LoRA", &path, 1 << 20));
        assert!(!message.contains("--resume"), "{message}");
        // Once whole, it is.
        let record = framesmith_config::outputs::StateRecord {
            format: framesmith_config::outputs::STATE_FORMAT,
            step: 4,
            seed: 1,
            accumulation: 1,
            total_steps: 10,
            lora_modules: 1,
            run_id: None,
            world_size: 1,
        };
        std::fs::write(
            state.join("state.json"),
            serde_json::to_string(&record).unwrap(),
        )
        .unwrap();
        let header = r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#;
        let mut tensors = (header.len() as u64).to_le_bytes().to_vec();
        tensors.extend(header.as_bytes());
        std::fs::write(state.join("lora.safetensors"), &tensors).unwrap();
        std::fs::write(state.join("optimizer.safetensors"), &tensors).unwrap();
        let message = format!("{:#}", disk_full("save the LoRA", &path, 1 << 20));
        assert!(
            message.contains(&format!("then go on with --resume {}: ", state.display())),
            "{message}"
        );
    }
}
