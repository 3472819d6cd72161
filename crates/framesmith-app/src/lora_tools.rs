//! The LoRA tools on a finished run's adapter (or one the user picks): inspect, convert, resize and merge, the
//! same library calls as `framesmith lora`, made through `Backend::lora_tool` on a job thread. The state and the
//! job (output names included) live here, tested without egui; `lora_panel.rs` draws them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::backend::{Backend, LoraLayout, LoraReport, LoraTask};
use super::jobs::{JobResult, Jobs};
use super::run_view::{Checkpoint, RunEnd};

/// How many numbered names (`_2`, `_3`, …) are tried for an output before giving up.
const MAX_NUMBERED_NAMES: usize = 999;

/// What the user asked a LoRA tool to do with the chosen file.
#[derive(Debug, Clone, PartialEq)]
pub enum LoraAction {
    Inspect,
    Convert(LoraLayout),
    Resize(usize),
    Merge { base: PathBuf, strength: f64 },
}

impl LoraAction {
    /// What the status line calls the action while it runs ("Converting to ComfyUI").
    pub fn label(&self) -> String {
        match self {
            Self::Inspect => "Inspecting".into(),
            Self::Convert(layout) => format!("Converting to {}", layout.label()),
            Self::Resize(rank) => format!("Resizing to rank {rank}"),
            Self::Merge { strength, .. } => format!("Merging at strength {strength}"),
        }
    }

    /// The name of the file the action writes beside `lora`, without the extension or a number; `None` for
    /// Inspect, which writes nothing.
    pub fn output_stem(&self, lora: &Path) -> Option<String> {
        let stem = file_stem(lora);
        match self {
            Self::Inspect => None,
            Self::Convert(layout) => Some(format!("{stem}_{}", layout.tag())),
            Self::Resize(rank) => Some(format!("{stem}_rank{rank}")),
            Self::Merge { base, .. } => Some(format!("{}_merged_{stem}", file_stem(base))),
        }
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "lora".into())
}

/// `{stem}.safetensors` in `dir`, or the first of `{stem}_2.safetensors`, `{stem}_3.safetensors`, … that no file
/// holds yet: the tools never write over a file.
pub fn free_output(dir: &Path, stem: &str) -> Result<PathBuf, String> {
    let first = dir.join(format!("{stem}.safetensors"));
    if !first.exists() {
        return Ok(first);
    }
    (2..=MAX_NUMBERED_NAMES)
        .map(|n| dir.join(format!("{stem}_{n}.safetensors")))
        .find(|path| !path.exists())
        .ok_or_else(|| {
            format!(
                "every name up to {stem}_{MAX_NUMBERED_NAMES}.safetensors is taken; move some of those files \
                 away: {}",
                dir.display()
            )
        })
}

/// Runs `action` on the adapter `lora` through `backend`, writing any output beside it under a free name. Runs
/// on a job thread (it reads and writes files).
pub fn run_action(
    backend: &dyn Backend,
    lora: &Path,
    action: &LoraAction,
) -> Result<LoraReport, String> {
    let output = match action.output_stem(lora) {
        Some(stem) => {
            let dir = lora.parent().unwrap_or(Path::new("."));
            free_output(dir, &stem)?
        }
        None => PathBuf::new(),
    };
    let input = lora.to_path_buf();
    let task = match action.clone() {
        LoraAction::Inspect => LoraTask::Inspect { file: input },
        LoraAction::Convert(to) => LoraTask::Convert { input, output, to },
        LoraAction::Resize(rank) => LoraTask::Resize {
            input,
            output,
            rank,
        },
        LoraAction::Merge { base, strength } => LoraTask::Merge {
            base,
            lora: input,
            strength,
            output,
        },
    };
    backend.lora_tool(&task)
}

/// The base model a merge folds the LoRA into, and its size (the merged file's size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeBase {
    pub path: PathBuf,
    pub bytes: Option<u64>,
}

/// How the last action ended.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraOutcome {
    /// The action's label ([`LoraAction::label`]).
    pub label: String,
    pub result: Result<LoraReport, String>,
}

/// The LoRA tools' state.
#[derive(Debug)]
pub struct LoraToolsView {
    /// The finished run's LoRA files (its checkpoints, the newest last).
    choices: Vec<PathBuf>,
    /// The adapter the tools work on.
    file: Option<PathBuf>,
    pub layout: LoraLayout,
    pub rank: usize,
    pub strength: f64,
    base: Option<MergeBase>,
    /// The label of the action running.
    running: Option<String>,
    outcome: Option<LoraOutcome>,
}

impl Default for LoraToolsView {
    fn default() -> Self {
        Self {
            choices: Vec::new(),
            file: None,
            layout: LoraLayout::ComfyUi,
            rank: 8,
            strength: 1.0,
            base: None,
            running: None,
            outcome: None,
        }
    }
}

impl LoraToolsView {
    /// A run ended: a finished (or stopped) run that saved LoRAs offers them, its newest chosen.
    pub fn run_ended(&mut self, end: RunEnd, checkpoints: &[Checkpoint]) {
        if end == RunEnd::Failed {
            return;
        }
        let mut loras: Vec<PathBuf> = Vec::new();
        for checkpoint in checkpoints {
            loras.retain(|l| l != &checkpoint.lora);
            loras.push(checkpoint.lora.clone());
        }
        if let Some(newest) = loras.last() {
            self.file = Some(newest.clone());
            self.choices = loras;
        }
    }

    /// The run's LoRA files the user can choose between.
    pub fn choices(&self) -> &[PathBuf] {
        &self.choices
    }

    /// The adapter the tools work on.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Works on `path` from now on (a run's checkpoint, or a file the user picked).
    pub fn choose_file(&mut self, path: PathBuf) {
        self.file = Some(path);
    }

    /// The base model chosen for a merge.
    pub fn base(&self) -> Option<&MergeBase> {
        self.base.as_ref()
    }

    pub fn choose_base(&mut self, base: MergeBase) {
        self.base = Some(base);
    }

    /// Whether an action can start now: a file is chosen and none runs.
    pub fn can_run(&self) -> bool {
        self.file.is_some() && self.running.is_none()
    }

    /// The label of the action running, if one is.
    pub fn running(&self) -> Option<&str> {
        self.running.as_deref()
    }

    /// How the last action ended; `None` while one runs or before the first.
    pub fn outcome(&self) -> Option<&LoraOutcome> {
        self.outcome.as_ref().filter(|_| self.running.is_none())
    }

    /// The merge action of the chosen base and strength, when a base is chosen.
    pub fn merge_action(&self) -> Option<LoraAction> {
        self.base.as_ref().map(|base| LoraAction::Merge {
            base: base.path.clone(),
            strength: self.strength,
        })
    }

    /// What a merge costs in disk space, shown before it starts.
    pub fn merge_warning(&self) -> Option<String> {
        let base = self.base.as_ref()?;
        let size = base
            .bytes
            .map_or_else(|| "the base's size".into(), super::format_bytes);
        Some(format!(
            "Merging writes a new full model file of {size} beside the LoRA; the base file is left as it is"
        ))
    }

    /// Starts `action` on the chosen file on a job thread; nothing when no file is chosen or one runs.
    pub fn start(&mut self, action: LoraAction, backend: &Arc<dyn Backend>, jobs: &mut Jobs) {
        if !self.can_run() {
            return;
        }
        let Some(lora) = self.file.clone() else {
            return;
        };
        let label = action.label();
        self.running = Some(label.clone());
        let backend = Arc::clone(backend);
        jobs.spawn("LoRA tool", move || JobResult::LoraToolDone {
            result: run_action(backend.as_ref(), &lora, &action),
            label,
        });
    }

    /// An action ended.
    pub fn finish(&mut self, label: String, result: Result<LoraReport, String>) {
        self.running = None;
        self.outcome = Some(LoraOutcome { label, result });
    }

    /// The status line: what runs, or how the last action ended (its error names the file and the fix).
    pub fn status(&self) -> Option<String> {
        if let Some(label) = &self.running {
            return Some(format!("{label}…"));
        }
        let outcome = self.outcome.as_ref()?;
        Some(match &outcome.result {
            Ok(LoraReport {
                written: Some(path),
                ..
            }) => format!("{}: wrote {}", outcome.label, path.display()),
            Ok(_) => format!("{}: done", outcome.label),
            Err(err) => format!("{} failed: {err}", outcome.label),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Mutex;

    use framesmith_config::protocol::EngineHandle;
    use framesmith_config::RunConfig;

    use super::*;
    use crate::backend::{DatasetSummary, FieldIssue, ModelRole, PresetView};
    use crate::jobs::JobMode;

    /// A backend whose LoRA tools write a marker file (or fail with `fail`), and keep what they were asked.
    #[derive(Default)]
    struct ToolBackend {
        asked: Mutex<Vec<LoraTask>>,
        fail: Option<String>,
    }

    impl Backend for ToolBackend {
        fn inspect_model(&self, _: ModelRole, _: &Path) -> Result<String, String> {
            Ok(String::new())
        }
        fn scan_dataset(&self, _: &[PathBuf]) -> Result<DatasetSummary, String> {
            Ok(DatasetSummary::default())
        }
        fn presets(&self) -> Vec<PresetView> {
            Vec::new()
        }
        fn apply_preset(&self, _: &str, config: &RunConfig) -> Result<RunConfig, String> {
            Ok(config.clone())
        }
        fn validate(&self, _: &RunConfig) -> Vec<FieldIssue> {
            Vec::new()
        }
        fn demo_project(&self) -> RunConfig {
            RunConfig::default()
        }
        fn spawn_engine(&self, _: &[usize]) -> Result<EngineHandle, String> {
            Err("no engine".into())
        }
        fn lora_tool(&self, task: &LoraTask) -> Result<LoraReport, String> {
            self.asked.lock().unwrap().push(task.clone());
            if let Some(err) = &self.fail {
                return Err(err.clone());
            }
            let written = match task {
                LoraTask::Inspect { .. } => None,
                LoraTask::Convert { output, .. }
                | LoraTask::Resize { output, .. }
                | LoraTask::Merge { output, .. } => {
                    assert!(!output.exists(), "asked to write over {}", output.display());
                    std::fs::write(output, b"new").unwrap();
                    Some(output.clone())
                }
            };
            Ok(LoraReport {
                lines: vec!["rank 16".into()],
                norms: vec![("blocks".into(), vec![(0, 0.5), (1, 0.25)])],
                written,
            })
        }
    }

    fn checkpoint(step: usize, lora: &Path) -> Checkpoint {
        Checkpoint {
            step,
            lora: lora.to_path_buf(),
            state: None,
        }
    }

    /// Starts `action` with inline jobs and hands its result to `view`.
    fn run(view: &mut LoraToolsView, backend: &Arc<dyn Backend>, action: LoraAction) {
        let mut jobs = Jobs::new(JobMode::Inline, None);
        view.start(action, backend, &mut jobs);
        assert!(view.running().is_some());
        for result in jobs.drain() {
            match result {
                JobResult::LoraToolDone { label, result } => view.finish(label, result),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_finished_run_offers_its_newest_lora_and_a_failed_one_nothing() {
        let mut view = LoraToolsView::default();
        assert!(!view.can_run(), "no file before a run ends");
        let (early, last) = (
            Path::new("/o/cat-000100.safetensors"),
            Path::new("/o/cat.safetensors"),
        );
        let saved = [
            checkpoint(100, early),
            checkpoint(200, last),
            checkpoint(200, last),
        ];
        view.run_ended(RunEnd::Failed, &saved);
        assert!(!view.can_run());
        view.run_ended(RunEnd::Finished, &saved);
        assert!(view.can_run());
        assert_eq!(view.file(), Some(last));
        assert_eq!(view.choices(), [early.to_path_buf(), last.to_path_buf()]);
        assert_eq!(view.merge_action(), None, "a merge needs a base first");
        view.choose_base(MergeBase {
            path: PathBuf::from("/m/base.safetensors"),
            bytes: Some(3 << 30),
        });
        assert!(view.merge_warning().unwrap().contains("3.0 GiB"));
    }

    #[test]
    fn an_action_runs_through_the_backend_and_its_result_is_shown() {
        let dir = tempfile::tempdir().unwrap();
        let lora = dir.path().join("cat.safetensors");
        let backend = Arc::new(ToolBackend::default());
        let shared: Arc<dyn Backend> = backend.clone();
        let mut view = LoraToolsView::default();
        view.run_ended(RunEnd::Finished, &[checkpoint(10, &lora)]);
        run(&mut view, &shared, LoraAction::Resize(4));
        let written = dir.path().join("cat_rank4.safetensors");
        assert_eq!(
            backend.asked.lock().unwrap().last(),
            Some(&LoraTask::Resize {
                input: lora.clone(),
                output: written.clone(),
                rank: 4
            })
        );
        assert_eq!(
            view.status().unwrap(),
            format!("Resizing to rank 4: wrote {}", written.display())
        );
        run(&mut view, &shared, LoraAction::Inspect);
        let report = view.outcome().unwrap().result.as_ref().unwrap();
        assert_eq!(report.norms[0].1, [(0, 0.5), (1, 0.25)]);
        assert_eq!(view.status().unwrap(), "Inspecting: done");
    }

    #[test]
    fn an_error_is_shown_with_the_file_and_the_fix() {
        let backend: Arc<dyn Backend> = Arc::new(ToolBackend {
            fail: Some(
                "not an adapter file (`framesmith inspect` says what it is): /o/x.safetensors"
                    .into(),
            ),
            ..ToolBackend::default()
        });
        let mut view = LoraToolsView::default();
        view.choose_file(PathBuf::from("/o/x.safetensors"));
        run(&mut view, &backend, LoraAction::Inspect);
        assert!(view.can_run(), "a failed action can be tried again");
        assert_eq!(
            view.status().unwrap(),
            "Inspecting failed: not an adapter file (`framesmith inspect` says what it is): /o/x.safetensors"
        );
    }

    #[test]
    fn an_existing_output_file_is_never_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let lora = dir.path().join("cat.safetensors");
        let taken = dir.path().join("cat_comfyui.safetensors");
        std::fs::write(&taken, b"old").unwrap();
        let backend = Arc::new(ToolBackend::default());
        let shared: Arc<dyn Backend> = backend.clone();
        let mut view = LoraToolsView::default();
        view.choose_file(lora.clone());
        run(&mut view, &shared, LoraAction::Convert(LoraLayout::ComfyUi));
        run(&mut view, &shared, LoraAction::Convert(LoraLayout::ComfyUi));
        assert_eq!(std::fs::read(&taken).unwrap(), b"old");
        let outputs: Vec<PathBuf> = backend
            .asked
            .lock()
            .unwrap()
            .iter()
            .map(|task| match task {
                LoraTask::Convert { output, .. } => output.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            outputs,
            [
                dir.path().join("cat_comfyui_2.safetensors"),
                dir.path().join("cat_comfyui_3.safetensors")
            ]
        );
        let merged = LoraAction::Merge {
            base: PathBuf::from("/m/video_14b.safetensors"),
            strength: 0.8,
        };
        assert_eq!(merged.output_stem(&lora).unwrap(), "video_14b_merged_cat");
    }
}
