//! One run per output folder: an OS lock on `.framesmith.lock` in the folder, held while a run writes there and
//! released by the OS when the process ends, however it ends (a lock file a killed run left behind blocks
//! nothing). The file names its holder (PID, start time, command) so that a refused run can say who has it.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{holds_run, RUN_DIR_PREFIX};

/// The lock file in an output folder.
pub const LOCK_FILE: &str = ".framesmith.lock";

/// The longest holder record read back from a lock file.
const HOLDER_READ_LIMIT: u64 = 16 << 10;

/// Who holds an output folder, as its lock file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub pid: u32,
    pub started_unix_secs: u64,
    /// The holder's command line.
    pub command: String,
}

impl LockHolder {
    /// This process, now.
    fn this_process() -> Self {
        let command: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        Self {
            pid: std::process::id(),
            started_unix_secs: unix_now(),
            command: command.join(" "),
        }
    }

    /// `PID 123, started 5 min ago: framesmith train --config a.toml`.
    fn describe(&self) -> String {
        let ago = unix_now().saturating_sub(self.started_unix_secs);
        format!(
            "PID {}, started {} ago: {}",
            self.pid,
            duration_words(ago),
            self.command
        )
    }
}

/// Why an output folder could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum FolderLockError {
    #[error(
        "another run is writing into this output folder ({}): wait for it to end or stop it, or set \
         output.output_dir to another folder: {}",
        .holder.as_ref().map_or_else(|| "its holder has not written its name yet".to_string(), LockHolder::describe),
        .folder.display()
    )]
    Held {
        holder: Option<LockHolder>,
        folder: PathBuf,
    },
    #[error(
        "cannot {action} ({error}); make the output folder writable, or set output.output_dir to another \
         folder: {}",
        .path.display()
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

/// An output folder taken by this process; dropping it removes the lock file (and the folder, when taking it
/// created the folder and nothing else was written there) and releases the folder.
#[derive(Debug)]
pub struct FolderLock {
    file: Option<File>,
    path: PathBuf,
    folder: PathBuf,
    created_folder: bool,
}

impl FolderLock {
    /// Takes `folder` (created if missing) for this process, or says who holds it. Never waits.
    pub fn acquire(folder: &Path) -> Result<Self, FolderLockError> {
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |error| FolderLockError::Io {
                action,
                path,
                error,
            }
        };
        let created_folder = !folder.exists();
        fs::create_dir_all(folder).map_err(io("create the output folder", folder))?;
        let path = folder.join(LOCK_FILE);
        // A holder that ends between our open and our lock has removed the file we locked: open it again.
        for _ in 0..8 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io("create the lock file", &path))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(FolderLockError::Held {
                        holder: read_holder(&mut file),
                        folder: folder.to_path_buf(),
                    })
                }
                // A filesystem without locks (some network and FUSE mounts) must not keep every run out.
                Err(TryLockError::Error(error))
                    if error.kind() == std::io::ErrorKind::Unsupported => {}
                Err(TryLockError::Error(error)) => {
                    return Err(io("lock the lock file", &path)(error))
                }
            }
            if !still_at(&file, &path) {
                continue;
            }
            let holder = serde_json::to_string(&LockHolder::this_process())
                .map_err(|e| io("write the lock file", &path)(std::io::Error::other(e)))?;
            file.set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)))
                .and_then(|_| file.write_all(holder.as_bytes()))
                .map_err(io("write the lock file", &path))?;
            return Ok(Self {
                file: Some(file),
                path,
                folder: folder.to_path_buf(),
                created_folder,
            });
        }
        Err(io("lock the lock file", &path)(std::io::Error::other(
            "it kept being replaced by other runs",
        )))
    }

    /// The folder this lock holds.
    pub fn folder(&self) -> &Path {
        &self.folder
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        // Removed while still locked: a run that opens the file after this finds it gone and makes its own.
        let _ = fs::remove_file(&self.path);
        drop(self.file.take());
        if self.created_folder {
            // Only when empty: a run that wrote nothing leaves no folder behind.
            let _ = fs::remove_dir(&self.folder);
        }
    }
}

/// The output folder whose lock covers the run folder `run_dir`: its parent for a `run-N` folder of an output
/// folder holding runs, else `run_dir` itself.
pub fn output_folder_of(run_dir: &Path) -> PathBuf {
    let numbered = run_dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(RUN_DIR_PREFIX))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match run_dir.parent() {
        Some(parent) if numbered && holds_run(parent) => parent.to_path_buf(),
        _ => run_dir.to_path_buf(),
    }
}

/// Whether the locked `file` is still the one at `path` (a holder removes its file as it ends).
#[cfg(unix)]
fn still_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(ours), Ok(there)) => ours.ino() == there.ino() && ours.dev() == there.dev(),
        _ => false,
    }
}

/// Windows does not remove a file another process has open, so the locked file is the one at the path.
#[cfg(not(unix))]
fn still_at(_: &File, path: &Path) -> bool {
    path.is_file()
}

/// The holder record in a lock file held by another process (none while it is being written, or where the
/// platform's lock also keeps others from reading).
fn read_holder(file: &mut File) -> Option<LockHolder> {
    let mut text = String::new();
    file.take(HOLDER_READ_LIMIT)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(&text).ok()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// `42 s`, `5 min`, `3 h`, `2 days`.
fn duration_words(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        7200..172_800 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_held_folder_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let lock = FolderLock::acquire(&out).unwrap();
        assert_eq!(lock.folder(), out);
        // A second open of the file is a second lock, even in the same process.
        let err = FolderLock::acquire(&out).unwrap_err();
        let FolderLockError::Held { holder, folder } = &err else {
            panic!("{err}")
        };
        assert_eq!(folder, &out);
        assert_eq!(holder.as_ref().map(|h| h.pid), Some(std::process::id()));
        let message = err.to_string();
        assert!(
            message.starts_with("another run is writing into this output folder (PID ")
                && message.contains(" s ago: ")
                && message.ends_with(&format!("folder: {}", out.display())),
            "{message}"
        );
        drop(lock);
        assert!(!out.exists(), "the folder the lock made, empty, is gone");
        let again = FolderLock::acquire(&out).unwrap();
        fs::write(out.join("metrics.jsonl"), "").unwrap();
        drop(again);
        assert!(out.join("metrics.jsonl").exists() && !out.join(LOCK_FILE).exists());
    }

    #[test]
    fn a_lock_file_left_by_a_killed_run_blocks_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let stale = LockHolder {
            pid: 999_999,
            started_unix_secs: 1,
            command: "framesmith train".into(),
        };
        fs::write(
            dir.path().join(LOCK_FILE),
            serde_json::to_string(&stale).unwrap(),
        )
        .unwrap();
        let lock = FolderLock::acquire(dir.path()).unwrap();
        let text = fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        let holder: LockHolder = serde_json::from_str(&text).unwrap();
        assert_eq!(holder.pid, std::process::id());
        drop(lock);
        assert!(dir.path().exists(), "a folder that was there stays");
    }

    #[test]
    fn a_run_folder_is_covered_by_its_output_folders_lock() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        assert_eq!(output_folder_of(&out.join("run-2")), out.join("run-2"));
        fs::write(out.join("run.toml"), "").unwrap();
        assert_eq!(output_folder_of(&out.join("run-2")), out);
        assert_eq!(output_folder_of(&out.join("run-x")), out.join("run-x"));
        assert_eq!(output_folder_of(out), out);
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(5), "5 s");
        assert_eq!(duration_words(600), "10 min");
        assert_eq!(duration_words(3 * 3600), "3 h");
        assert_eq!(duration_words(5 * 86_400), "5 days");
    }
}
