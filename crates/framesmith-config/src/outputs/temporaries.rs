//! What an interrupted save leaves in an output folder: hidden `.NAME.tmp-PID` files beside the files they were
//! to replace (as large as those), and `NAME-state-NNNNNN.partial` folders. Removed when a run takes the folder
//! under its lock (`lock`), where no other run can be writing; a file of a process still alive is left alone.

use std::fs;
use std::path::{Path, PathBuf};

use super::RUN_DIR_PREFIX;

/// What [`remove_stale_temporaries`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemovedTemporaries {
    /// Temporary files and `.partial` folders.
    pub paths: Vec<PathBuf>,
    pub bytes: u64,
}

/// Removes the temporary files and `.partial` state folders that interrupted saves left in `output_folder`, its
/// `run-N` folders, their state folders and their `samples` folders. Call only while holding the folder's lock.
pub fn remove_stale_temporaries(output_folder: &Path) -> RemovedTemporaries {
    let mut removed = RemovedTemporaries::default();
    let mut run_dirs = vec![output_folder.to_path_buf()];
    run_dirs.extend(
        children(output_folder)
            .into_iter()
            .filter(|p| name_of(p).is_some_and(|n| n.starts_with(RUN_DIR_PREFIX))),
    );
    for run_dir in run_dirs {
        let mut dirs = vec![run_dir.join("samples")];
        for child in children(&run_dir) {
            let name = name_of(&child).unwrap_or_default();
            if name.ends_with(".partial") && name.contains("-state-") {
                let bytes = folder_bytes(&child);
                if fs::remove_dir_all(&child).is_ok() {
                    removed.bytes += bytes;
                    removed.paths.push(child);
                }
            } else if name.contains("-state-") {
                dirs.push(child);
            }
        }
        dirs.push(run_dir);
        for dir in dirs {
            remove_temporaries_in(&dir, &mut removed);
        }
    }
    removed
}

fn remove_temporaries_in(dir: &Path, removed: &mut RemovedTemporaries) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let Some(pid) = name_of(&path).and_then(|n| temporary_pid(&n)) else {
            continue;
        };
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if !meta.is_file() || pid == std::process::id() || process_alive(pid) {
            continue;
        }
        if fs::remove_file(&path).is_ok() {
            removed.bytes += meta.len();
            removed.paths.push(path);
        }
    }
}

/// The PID in a temporary file's name: `.lora.safetensors.tmp-123` or `.run.json.tmp-123-4` → 123.
fn temporary_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (stem, tail) = rest.rsplit_once(".tmp-")?;
    if stem.is_empty() {
        return None;
    }
    let mut parts = tail.split('-');
    let pid = parts.next()?.parse().ok()?;
    let counter_ok = match (parts.next(), parts.next()) {
        (None, _) => true,
        (Some(n), None) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        _ => false,
    };
    counter_ok.then_some(pid)
}

/// Whether process `pid` is running, where the system can tell (Linux); elsewhere the folder's lock alone says
/// that no run is writing there.
fn process_alive(pid: u32) -> bool {
    cfg!(target_os = "linux") && Path::new("/proc").join(pid.to_string()).exists()
}

fn children(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn name_of(path: &Path) -> Option<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
}

fn folder_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_give_their_pid() {
        assert_eq!(temporary_pid(".lora.safetensors.tmp-123"), Some(123));
        assert_eq!(temporary_pid(".run.json.tmp-77-4"), Some(77));
        assert_eq!(temporary_pid("lora.safetensors.tmp-123"), None);
        assert_eq!(temporary_pid(".framesmith.lock"), None);
        assert_eq!(temporary_pid(".x.tmp-12-a"), None);
        assert_eq!(temporary_pid(".tmp-12"), None);
    }

    #[test]
    fn a_dead_runs_temporaries_go_and_everything_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        // PIDs above the kernel's limit (4194304) are never alive.
        let dead = ".demo-lora.safetensors.tmp-4999999";
        let state = out.join("run-2").join("demo-state-000004");
        let partial = out.join("demo-state-000006.partial");
        fs::create_dir_all(&state).unwrap();
        fs::create_dir_all(&partial).unwrap();
        fs::write(partial.join("lora.safetensors"), [0u8; 100]).unwrap();
        fs::write(out.join(dead), [0u8; 1000]).unwrap();
        fs::write(state.join(".optimizer.safetensors.tmp-4999998"), [0u8; 10]).unwrap();
        let ours = format!(".metrics.jsonl.tmp-{}-1", std::process::id());
        fs::write(out.join(&ours), "x").unwrap();
        fs::write(out.join("demo-lora.safetensors"), "x").unwrap();
        fs::write(out.join(".notes.tmp-draft"), "x").unwrap();

        let removed = remove_stale_temporaries(out);
        assert_eq!(removed.paths.len(), 3, "{removed:?}");
        assert_eq!(removed.bytes, 1110);
        assert!(!out.join(dead).exists() && !partial.exists());
        assert!(!state.join(".optimizer.safetensors.tmp-4999998").exists());
        for kept in [ours.as_str(), "demo-lora.safetensors", ".notes.tmp-draft"] {
            assert!(out.join(kept).exists(), "{kept}");
        }
        assert!(state.exists());
    }
}
