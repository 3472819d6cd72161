//! Run folders: which run an output folder holds, where a new run writes so that it never touches another run's
//! files, and which run and training state `--resume` continues (only when the config still matches). Plain
//! files and JSON, no tensors: the app reads it to say what a folder holds before Start.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::file_read::{read_string_bounded, ReadLimit};
use super::run::RunConfig;

mod lock;
mod states;
mod temporaries;

pub use lock::{output_folder_of, FolderLock, FolderLockError, LockHolder, LOCK_FILE};
pub use states::{
    check_state, checked_states_newest_first, newest_good_state_before, state_folders, DamagedState,
};
pub use temporaries::{remove_stale_temporaries, RemovedTemporaries};

/// The record a run writes into its folder when it starts.
pub const RUN_RECORD_FILE: &str = "run.json";
/// Files every run writes into its folder (older versions wrote no `run.json`; these mark their runs too).
const RUN_MARKERS: [&str; 3] = [RUN_RECORD_FILE, "metrics.jsonl", "run.toml"];
/// Prefix of the folders that hold the second and later runs of an output folder.
const RUN_DIR_PREFIX: &str = "run-";
/// Format version of `state.json`.
pub const STATE_FORMAT: u32 = 1;

/// `run.json`: who owns a run folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub output_name: String,
    pub started_unix_secs: u64,
}

impl RunRecord {
    /// A record for a run starting now.
    pub fn new(output_name: &str) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            run_id: format!("{:x}-{:x}", now.as_nanos(), std::process::id()),
            output_name: output_name.to_string(),
            started_unix_secs: now.as_secs(),
        }
    }

    /// The record in `dir`, if it has a readable one.
    pub fn read(dir: &Path) -> Option<Self> {
        let text = read_string_bounded(&dir.join(RUN_RECORD_FILE), ReadLimit::JSON).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// `state.json` of a training-state folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRecord {
    pub format: u32,
    pub step: usize,
    pub seed: u64,
    pub accumulation: usize,
    pub total_steps: usize,
    pub lora_modules: usize,
    /// The run that wrote it (absent in states written before run records existed).
    #[serde(default)]
    pub run_id: Option<String>,
    /// How many GPUs (ranks) trained it: each step took `accumulation × world_size` micro-batches. 1 in states
    /// written before runs over several GPUs existed.
    #[serde(default = "one")]
    pub world_size: usize,
}

fn one() -> usize {
    1
}

impl StateRecord {
    pub fn read(state_dir: &Path) -> anyhow::Result<Self> {
        let path = state_dir.join("state.json");
        let text = read_string_bounded(&path, ReadLimit::JSON).map_err(|e| {
            anyhow::anyhow!("cannot read the training state ({e}): {}", path.display())
        })?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("corrupt training state ({e}): {}", path.display()))
    }
}

/// A complete training-state folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    pub step: usize,
    pub dir: PathBuf,
}

/// A run found in an output folder.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundRun {
    pub dir: PathBuf,
    /// `None` for a run written before run records existed.
    pub record: Option<RunRecord>,
    /// Its complete training states, oldest first.
    pub states: Vec<SavedState>,
}

impl FoundRun {
    /// One line for the app and the command line: what the run is and how far it got.
    pub fn describe(&self) -> String {
        let name = self.record.as_ref().map_or_else(
            || "a run".to_string(),
            |r| format!("run '{}'", r.output_name),
        );
        match self.states.last() {
            Some(s) => format!("{name}, saved at step {}", s.step),
            None => format!("{name}, no training state saved"),
        }
    }
}

/// Whether `dir` holds a run's outputs (a run record, metrics, the resolved config or training states).
pub fn holds_run(dir: &Path) -> bool {
    RUN_MARKERS.iter().any(|m| dir.join(m).is_file()) || !states_in(dir, None).is_empty()
}

/// The runs in an output folder: the folder's own (the first run) and its `run-N` folders, oldest first.
pub fn runs_in(output_dir: &Path) -> Vec<FoundRun> {
    let mut dirs: Vec<(usize, PathBuf)> = Vec::new();
    if holds_run(output_dir) {
        dirs.push((1, output_dir.to_path_buf()));
    }
    if let Ok(entries) = fs::read_dir(output_dir) {
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let number = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(RUN_DIR_PREFIX))
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(n) = number.filter(|_| path.is_dir() && holds_run(&path)) {
                dirs.push((n, path));
            }
        }
    }
    dirs.sort();
    dirs.into_iter()
        .map(|(_, dir)| FoundRun {
            record: RunRecord::read(&dir),
            states: states_in(&dir, None),
            dir,
        })
        .collect()
}

/// Where a new run configured to write into `output_dir` writes: `output_dir` itself when it holds no run yet,
/// otherwise its first free `run-N` folder, so that no file of an earlier run is ever replaced or pruned.
pub fn new_run_dir(output_dir: &Path) -> PathBuf {
    if !holds_run(output_dir) {
        return output_dir.to_path_buf();
    }
    (2..)
        .map(|n| output_dir.join(format!("{RUN_DIR_PREFIX}{n}")))
        .find(|dir| !dir.exists())
        .unwrap_or_else(|| output_dir.join(RUN_DIR_PREFIX))
}

/// Complete training-state folders (`{name}-state-NNNNNN` with a `state.json`; any name when `name` is `None`) in
/// `dir`, oldest first.
pub fn states_in(dir: &Path, name: Option<&str>) -> Vec<SavedState> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut states: Vec<SavedState> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("state.json").is_file())
        .filter_map(|p| {
            let file_name = p.file_name()?.to_str()?;
            let (stem, step) = file_name.rsplit_once("-state-")?;
            if name.is_some_and(|n| n != stem) || step.len() < 6 {
                return None;
            }
            let step = step.parse().ok()?;
            Some(SavedState { step, dir: p })
        })
        .collect();
    states.sort_by(|a, b| (a.step, &a.dir).cmp(&(b.step, &b.dir)));
    states
}

/// Settings a resumed run may change: when to stop, how memory is used, when and where outputs and samples
/// are written. Everything else decides what is learned, and must match the run's own config.
/// In `[validation]`, only the held-out split (`validation_split`, `validation_seed`) decides what is learned.
const RESUMABLE_CHANGES: [&str; 12] = [
    "training.max_train_steps",
    "training.max_train_epochs",
    "training.max_consecutive_nonfinite",
    "training.device",
    "training.low_noise_device",
    "memory.",
    "output.",
    "sampling.",
    "validation.validate_every_n_steps",
    "validation.validate_every_n_epochs",
    "validation.validate_at_save",
    "validation.num_timesteps",
];

/// The settings in which `now` differs from the config a run was started with, as
/// `lora.rank (16 in the run, 32 now)`, leaving out those a resumed run may change.
pub fn resume_mismatches(run: &RunConfig, now: &RunConfig) -> Vec<String> {
    let (Ok(run), Ok(now)) = (leaves(run), leaves(now)) else {
        return vec!["the configs cannot be compared (not expressible as TOML)".into()];
    };
    let keys: std::collections::BTreeSet<&String> = run.keys().chain(now.keys()).collect();
    keys.into_iter()
        .filter(|k| !RESUMABLE_CHANGES.iter().any(|free| k.starts_with(free)))
        .filter(|k| run.get(*k) != now.get(*k))
        .map(|k| {
            let show = |v: Option<&toml::Value>| v.map_or("unset".to_string(), |v| v.to_string());
            format!(
                "{k} ({} in the run, {} now)",
                show(run.get(k)),
                show(now.get(k))
            )
        })
        .collect()
}

fn leaves(config: &RunConfig) -> Result<BTreeMap<String, toml::Value>, toml::ser::Error> {
    Ok(match toml::Value::try_from(config)? {
        toml::Value::Table(table) => super::presets::flatten(&table),
        _ => BTreeMap::new(),
    })
}

/// What `--resume PATH` continues: a training state and the run folder it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeTarget {
    pub run_dir: PathBuf,
    pub state: SavedState,
    /// Damaged states passed over for an older good one, newest first.
    pub skipped: Vec<DamagedState>,
}

/// Finds what `--resume path` continues under `config`: `path` is a training-state folder, or an output folder
/// (then the newest run in it whose config matches, at its newest good state: damaged states are passed over
/// and listed). Refuses a state whose run was started with other settings, naming each one that differs, and a
/// damaged state named directly, naming the good one before it.
pub fn find_resume(path: &Path, config: &RunConfig) -> anyhow::Result<ResumeTarget> {
    if path.join("state.json").is_file()
        || (path.is_dir() && states::state_step(path, None).is_some())
    {
        let state = explicit_state(path)?;
        check_matches(&state.dir, config)?;
        let run_dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
        return Ok(ResumeTarget {
            run_dir,
            state,
            skipped: Vec::new(),
        });
    }
    let mut skipped = Vec::new();
    let mut mismatch = None;
    for run in runs_in(path).iter().rev() {
        // The run's newest good state decides whether the run matches this config.
        let newest_good = checked_states_newest_first(&run.dir, None)
            .into_iter()
            .find_map(|checked| checked.map_err(|d| skipped.push(d)).ok());
        let Some(state) = newest_good else {
            continue;
        };
        match check_matches(&state.dir, config) {
            Ok(()) => {
                return Ok(ResumeTarget {
                    run_dir: run.dir.clone(),
                    state,
                    skipped,
                })
            }
            Err(err) => {
                mismatch.get_or_insert(err);
            }
        }
    }
    if let Some(err) = mismatch {
        return Err(err);
    }
    if !skipped.is_empty() {
        let lines: Vec<String> = skipped
            .iter()
            .map(|d| format!("\n  - {}", d.describe()))
            .collect();
        anyhow::bail!(
            "no good training state to resume in {}: every one is damaged:{}\nStart again without --resume \
             (the damaged states stay as they are): {}",
            path.display(),
            lines.concat(),
            path.display()
        );
    }
    anyhow::bail!(
        "no training state to resume in {} (expected a `…-state-NNNNNN` folder with a state.json, or an output \
         folder holding them; states are written with output.save_state = true at each save)",
        path.display()
    );
}

/// The state folder `path` named directly, when it is whole; else why not, and the good state before it.
fn explicit_state(path: &Path) -> anyhow::Result<SavedState> {
    match check_state(path) {
        Ok(record) => Ok(SavedState {
            step: record.step,
            dir: path.to_path_buf(),
        }),
        Err(reason) => {
            let step = states::state_step(path, None).unwrap_or(usize::MAX);
            let earlier = path
                .parent()
                .and_then(|run| newest_good_state_before(run, None, step));
            let fix = match earlier {
                Some(s) => format!(
                    "resume from the state before it (--resume {})",
                    s.dir.display()
                ),
                None => "no earlier good state is left: start again without --resume".into(),
            };
            anyhow::bail!(
                "the training state is damaged ({reason}); {fix}: {}",
                path.display()
            )
        }
    }
}

/// Errors when the config saved in `state_dir` differs from `config` in a setting that decides what is learned.
fn check_matches(state_dir: &Path, config: &RunConfig) -> anyhow::Result<()> {
    let saved = state_dir.join("config.toml");
    // States written before the config was saved in them cannot be checked; the LoRA shapes still are.
    if !saved.exists() {
        return Ok(());
    }
    let text = crate::io::read_toml_text(&saved)?;
    let run = RunConfig::from_toml_str(&text, &saved)?;
    let differs = resume_mismatches(&run, config);
    if differs.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "cannot resume: this config differs from the run's in {}. Resume with the run's config ({}), or start a new \
         run without --resume (it writes beside the old one, which stays as it is): {}",
        differs.join(", "),
        saved.display(),
        state_dir.display()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn state(dir: &Path, name: &str, step: usize, config: &RunConfig) -> PathBuf {
        let state = dir.join(format!("{name}-state-{step:06}"));
        fs::create_dir_all(&state).unwrap();
        let record = StateRecord {
            format: STATE_FORMAT,
            step,
            seed: config.training.seed,
            accumulation: 1,
            total_steps: config.training.max_train_steps,
            lora_modules: 4,
            run_id: None,
            world_size: 1,
        };
        fs::write(
            state.join("state.json"),
            serde_json::to_string(&record).unwrap(),
        )
        .unwrap();
        fs::write(state.join("config.toml"), config.to_toml_string().unwrap()).unwrap();
        // Two empty tensors: whole safetensors files.
        let header = r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#;
        let mut tensors = (header.len() as u64).to_le_bytes().to_vec();
        tensors.extend(header.as_bytes());
        fs::write(state.join("lora.safetensors"), &tensors).unwrap();
        fs::write(state.join("optimizer.safetensors"), &tensors).unwrap();
        state
    }

    #[test]
    fn a_new_run_takes_the_folder_only_while_it_holds_no_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        assert_eq!(new_run_dir(&out), out, "a folder that does not exist yet");
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("notes.txt"), "mine").unwrap();
        assert_eq!(new_run_dir(&out), out, "unrelated files are no run");
        fs::write(out.join("metrics.jsonl"), "").unwrap();
        assert_eq!(
            new_run_dir(&out),
            out.join("run-2"),
            "a run written before run records"
        );
        fs::create_dir_all(out.join("run-2")).unwrap();
        assert_eq!(
            new_run_dir(&out),
            out.join("run-3"),
            "an existing folder is never reused"
        );
    }

    #[test]
    fn runs_are_listed_oldest_first_with_their_states() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let config = RunConfig::default();
        state(out, "lora", 10, &config);
        state(out, "lora", 400, &config);
        let second = out.join("run-2");
        state(&second, "lora", 50, &config);
        let tenth = out.join("run-10");
        fs::create_dir_all(&tenth).unwrap();
        fs::write(
            tenth.join(RUN_RECORD_FILE),
            serde_json::to_string(&RunRecord::new("x")).unwrap(),
        )
        .unwrap();
        fs::create_dir_all(out.join("run-3")).unwrap(); // empty: no run
        let runs = runs_in(out);
        let dirs: Vec<&Path> = runs.iter().map(|r| r.dir.as_path()).collect();
        assert_eq!(dirs, [out, second.as_path(), tenth.as_path()]);
        let steps: Vec<usize> = runs[0].states.iter().map(|s| s.step).collect();
        assert_eq!(steps, [10, 400]);
        assert!(runs[0].describe().contains("saved at step 400"));
        assert!(runs[2].describe().contains("run 'x', no training state"));
    }

    #[test]
    fn a_partial_or_foreign_state_folder_is_not_a_state() {
        let dir = tempfile::tempdir().unwrap();
        let config = RunConfig::default();
        let done = state(dir.path(), "a", 5, &config);
        fs::rename(done, dir.path().join("a-state-000005.partial")).unwrap();
        state(dir.path(), "b", 7, &config);
        assert!(states_in(dir.path(), Some("a")).is_empty());
        assert_eq!(states_in(dir.path(), None).len(), 1);
    }

    #[test]
    fn mismatches_name_what_decides_learning_and_allow_the_rest() {
        let run = RunConfig::default();
        let mut now = run.clone();
        now.training.max_train_steps += 100;
        now.output.save_every_n_steps = Some(7);
        now.memory.vram_budget_gb = Some(12.0);
        assert!(resume_mismatches(&run, &now).is_empty());
        now.lora.rank = 16;
        now.optimizer.learning_rate = 1e-3;
        let differs = resume_mismatches(&run, &now);
        assert_eq!(differs.len(), 2, "{differs:?}");
        assert!(
            differs[0].starts_with("lora.rank (32 in the run, 16 now)"),
            "{differs:?}"
        );
        assert!(
            differs[1].starts_with("optimizer.learning_rate"),
            "{differs:?}"
        );
    }

    #[test]
    fn resume_picks_the_newest_matching_run_and_names_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let mut first = RunConfig::default();
        first.lora.rank = 8;
        state(out, "lora", 400, &first);
        let second = RunConfig::default();
        state(&out.join("run-2"), "lora", 100, &second);

        let target = find_resume(out, &second).unwrap();
        assert_eq!(
            (target.run_dir.as_path(), target.state.step),
            (out.join("run-2").as_path(), 100)
        );
        let target = find_resume(out, &first).unwrap();
        assert_eq!((target.run_dir.as_path(), target.state.step), (out, 400));

        let mut other = second.clone();
        other.lora.rank = 64;
        let err = find_resume(out, &other).unwrap_err().to_string();
        assert!(err.contains("lora.rank (32 in the run, 64 now)"), "{err}");
        let err = find_resume(&out.join("run-2").join("lora-state-000100"), &other)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lora.rank") && err.contains("without --resume"),
            "{err}"
        );
        let empty = tempfile::tempdir().unwrap();
        let err = find_resume(empty.path(), &second).unwrap_err().to_string();
        assert!(err.contains("no training state to resume"), "{err}");
    }

    #[test]
    fn resume_passes_over_damaged_states_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let config = RunConfig::default();
        fs::write(out.join(RUN_RECORD_FILE), "{}").unwrap();
        let good = state(out, "lora", 10, &config);
        let cut_lora = state(out, "lora", 20, &config);
        let lora = fs::read(cut_lora.join("lora.safetensors")).unwrap();
        fs::write(cut_lora.join("lora.safetensors"), &lora[..lora.len() - 3]).unwrap();
        let cut_record = state(out, "lora", 30, &config);
        fs::write(cut_record.join("state.json"), "{\"format\": 1, \"st").unwrap();
        let emptied = out.join("lora-state-000040");
        fs::create_dir_all(&emptied).unwrap();

        let target = find_resume(out, &config).unwrap();
        assert_eq!(target.state.dir, good);
        let skipped: Vec<&Path> = target.skipped.iter().map(|d| d.dir.as_path()).collect();
        assert_eq!(skipped, [emptied.as_path(), &cut_record, &cut_lora]);
        assert!(target.skipped[2]
            .reason
            .starts_with("lora.safetensors is cut short"));

        // Named directly, a damaged state is refused with the good one before it.
        let err = find_resume(&cut_record, &config).unwrap_err().to_string();
        assert!(
            err.starts_with("the training state is damaged (state.json is cut short")
                && err.contains(&format!("(--resume {})", good.display())),
            "{err}"
        );
        fs::remove_dir_all(&good).unwrap();
        let err = find_resume(out, &config).unwrap_err().to_string();
        assert!(
            err.starts_with("no good training state to resume in")
                && err.contains("the folder is empty")
                && err.contains("Start again without --resume"),
            "{err}"
        );
    }
}
