//! Which training-state folders a run can resume from: a state whose `state.json`, saved config or tensor files
//! are missing, cut short or unreadable is damaged (a crash, a full disk or a copy cut short leaves such folders)
//! and is passed over, with the reason, for the next older good one. Structure only: header sizes and lengths,
//! no tensor is read.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{SavedState, StateRecord};
use crate::run::RunConfig;

/// The largest `state.json` or saved `config.toml` read.
const SMALL_FILE_LIMIT: u64 = 4 << 20;
/// The largest safetensors header accepted (the safetensors reader's own limit).
const HEADER_LIMIT: u64 = 100_000_000;
/// The files every training state holds.
const REQUIRED: [&str; 3] = ["state.json", "lora.safetensors", "optimizer.safetensors"];

/// A training-state folder that cannot be resumed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedState {
    pub dir: PathBuf,
    /// What is wrong, naming the file: `lora.safetensors is cut short (…)`.
    pub reason: String,
}

impl DamagedState {
    /// The line a resume prints for a state it passed over.
    pub fn describe(&self) -> String {
        format!(
            "skipped a damaged training state ({}): {}",
            self.reason,
            self.dir.display()
        )
    }
}

/// Checks that the state folder `dir` is complete: its record, its config (when saved) and every safetensors
/// file whole. Returns the record, or why the state cannot be resumed from.
pub fn check_state(dir: &Path) -> Result<StateRecord, String> {
    let names: Vec<String> = fs::read_dir(dir)
        .map_err(|e| format!("the folder cannot be read ({e})"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    if names.is_empty() {
        return Err("the folder is empty".into());
    }
    if let Some(missing) = REQUIRED.iter().find(|r| !names.iter().any(|n| n == *r)) {
        return Err(format!("{missing} is missing"));
    }
    let text = read_small(&dir.join("state.json"))?;
    let record: StateRecord = serde_json::from_str(&text)
        .map_err(|e| format!("state.json is cut short or not a training state ({e})"))?;
    let mut tensors: Vec<&String> = names
        .iter()
        .filter(|n| n.ends_with(".safetensors") && !n.starts_with('.'))
        .collect();
    tensors.sort();
    for name in tensors {
        check_safetensors(&dir.join(name)).map_err(|e| format!("{name} {e}"))?;
    }
    if names.iter().any(|n| n == "config.toml") {
        let path = dir.join("config.toml");
        let text = read_small(&path)?;
        RunConfig::from_toml_str(&text, &path)
            .map_err(|e| format!("config.toml is cut short or unreadable ({e})"))?;
    }
    Ok(record)
}

/// Every `{name}-state-NNNNNN` folder in `dir` (any name when `name` is `None`), complete or not, oldest first.
pub fn state_folders(dir: &Path, name: Option<&str>) -> Vec<SavedState> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut states: Vec<SavedState> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .filter_map(|p| {
            let step = state_step(&p, name)?;
            Some(SavedState { step, dir: p })
        })
        .collect();
    states.sort_by(|a, b| (a.step, &a.dir).cmp(&(b.step, &b.dir)));
    states
}

/// The step of a state folder's name (`lora-state-000120` → 120), when it names one of `name`'s states.
pub(super) fn state_step(dir: &Path, name: Option<&str>) -> Option<usize> {
    let file_name = dir.file_name()?.to_str()?;
    let (stem, step) = file_name.rsplit_once("-state-")?;
    if name.is_some_and(|n| n != stem)
        || step.len() < 6
        || !step.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    step.parse().ok()
}

/// The state folders of `dir` newest first, each checked: a good one with its record, or why it is damaged.
pub fn checked_states_newest_first(
    dir: &Path,
    name: Option<&str>,
) -> Vec<Result<SavedState, DamagedState>> {
    state_folders(dir, name)
        .into_iter()
        .rev()
        .map(|s| match check_state(&s.dir) {
            Ok(record) => Ok(SavedState {
                step: record.step,
                dir: s.dir,
            }),
            Err(reason) => Err(DamagedState { dir: s.dir, reason }),
        })
        .collect()
}

/// The newest good state of `dir` saved before step `before` (for the advice after a state fails to load).
pub fn newest_good_state_before(
    dir: &Path,
    name: Option<&str>,
    before: usize,
) -> Option<SavedState> {
    state_folders(dir, name)
        .into_iter()
        .rev()
        .filter(|s| s.step < before)
        .find(|s| check_state(&s.dir).is_ok())
}

fn read_small(path: &Path) -> Result<String, String> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let file = File::open(path).map_err(|e| format!("{name} cannot be read ({e})"))?;
    let mut text = String::new();
    file.take(SMALL_FILE_LIMIT)
        .read_to_string(&mut text)
        .map_err(|e| format!("{name} cannot be read ({e})"))?;
    Ok(text)
}

/// Whether a safetensors file is whole: a header that parses and a length that matches it. The error completes
/// a sentence that starts with the file's name.
fn check_safetensors(path: &Path) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| format!("cannot be read ({e})"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot be read ({e})"))?
        .len();
    if len < 8 {
        return Err(format!("is cut short ({len} bytes)"));
    }
    let mut n = [0u8; 8];
    file.read_exact(&mut n)
        .map_err(|e| format!("cannot be read ({e})"))?;
    let header_len = u64::from_le_bytes(n);
    if header_len > HEADER_LIMIT || header_len > len - 8 {
        return Err(format!(
            "is cut short or not safetensors (a {header_len}-byte header in a {len}-byte file)"
        ));
    }
    let mut header = Vec::new();
    (&mut file)
        .take(header_len)
        .read_to_end(&mut header)
        .map_err(|e| format!("cannot be read ({e})"))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format!("has an unreadable header ({e})"))?;
    let data_bytes = header
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let expected = 8 + header_len + data_bytes;
    if len != expected {
        let what = if len < expected {
            "is cut short"
        } else {
            "is longer than its header says"
        };
        return Err(format!("{what} ({len} of {expected} bytes)"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A minimal safetensors file: one f32 tensor of `values`.
    fn safetensors(values: usize) -> Vec<u8> {
        let header = format!(
            r#"{{"w":{{"dtype":"F32","shape":[{values}],"data_offsets":[0,{}]}}}}"#,
            4 * values
        );
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        bytes.extend(vec![0u8; 4 * values]);
        bytes
    }

    fn write_state(dir: &Path, step: usize) -> PathBuf {
        let state = dir.join(format!("lora-state-{step:06}"));
        fs::create_dir_all(&state).unwrap();
        let record = StateRecord {
            format: super::super::STATE_FORMAT,
            step,
            seed: 1,
            accumulation: 1,
            total_steps: 100,
            lora_modules: 1,
            run_id: None,
            world_size: 1,
        };
        fs::write(
            state.join("state.json"),
            serde_json::to_string(&record).unwrap(),
        )
        .unwrap();
        fs::write(state.join("lora.safetensors"), safetensors(4)).unwrap();
        fs::write(state.join("optimizer.safetensors"), safetensors(8)).unwrap();
        let config = RunConfig::default().to_toml_string().unwrap();
        fs::write(state.join("config.toml"), config).unwrap();
        state
    }

    fn cut(path: &Path, keep: usize) {
        let bytes = fs::read(path).unwrap();
        fs::write(path, &bytes[..keep.min(bytes.len())]).unwrap();
    }

    #[test]
    fn each_kind_of_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let good = write_state(dir.path(), 10);
        assert_eq!(check_state(&good).unwrap().step, 10);

        let lora = write_state(dir.path(), 20);
        cut(&lora.join("lora.safetensors"), 70);
        let reason = check_state(&lora).unwrap_err();
        assert!(
            reason.starts_with("lora.safetensors is cut short ("),
            "{reason}"
        );

        let optimizer = write_state(dir.path(), 30);
        cut(&optimizer.join("optimizer.safetensors"), 20);
        let reason = check_state(&optimizer).unwrap_err();
        assert!(
            reason.starts_with("optimizer.safetensors is cut short"),
            "{reason}"
        );

        let record = write_state(dir.path(), 40);
        cut(&record.join("state.json"), 12);
        let reason = check_state(&record).unwrap_err();
        assert!(reason.starts_with("state.json is cut short"), "{reason}");

        let emptied = dir.path().join("lora-state-000050");
        fs::create_dir_all(&emptied).unwrap();
        assert_eq!(check_state(&emptied).unwrap_err(), "the folder is empty");

        let zeroed = write_state(dir.path(), 60);
        fs::write(zeroed.join("lora.safetensors"), vec![0u8; 4096]).unwrap();
        let reason = check_state(&zeroed).unwrap_err();
        assert!(
            reason.starts_with("lora.safetensors has an unreadable header"),
            "{reason}"
        );

        let checked = checked_states_newest_first(dir.path(), Some("lora"));
        let steps: Vec<Result<usize, usize>> = checked
            .iter()
            .map(|c| {
                c.as_ref()
                    .map(|s| s.step)
                    .map_err(|d| state_step(&d.dir, None).unwrap())
            })
            .collect();
        assert_eq!(steps, [Err(60), Err(50), Err(40), Err(30), Err(20), Ok(10)]);
        assert_eq!(
            newest_good_state_before(dir.path(), Some("lora"), 60).map(|s| s.dir),
            Some(good)
        );
        let line = checked[1].as_ref().unwrap_err().describe();
        assert!(
            line.starts_with("skipped a damaged training state (the folder is empty): ")
                && line.ends_with("lora-state-000050"),
            "{line}"
        );
    }
}
