//! Background jobs: anything that may block (file dialogs, scans, model inspection, validation, file reads and
//! writes) runs on its own thread and reports back through a bounded channel that the UI drains each frame.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use framesmith_config::protocol::doctor::SystemReport;
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::protocol::StartRun;
use framesmith_config::RunConfig;

use super::backend::{
    DatasetSummary, FieldIssue, GenerateSettings, GeneratedClip, LoraReport, ModelRole, Thumbnail,
};
use super::lora_tools::MergeBase;

/// Results waiting to be drained; workers block (never the UI) when it is full.
const RESULT_CAPACITY: usize = 64;

/// What a file dialog was opened for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickPurpose {
    Model(ModelRole),
    DatasetFolders,
    /// A run-config path field (dotted key).
    ConfigPath(String),
    /// A dataset form folder field: entry index and key.
    DatasetPath(usize, String),
    LoadConfig,
    SaveConfig,
    ImportDataset,
    ExportDataset,
    /// A training-state folder to resume from.
    ResumeState,
    /// An adapter file for the LoRA tools.
    LoraFile,
    /// The base model file a LoRA is merged into.
    MergeBase,
}

/// What a finished job hands back.
#[derive(Debug)]
pub enum JobResult {
    ModelInspected {
        role: ModelRole,
        path: PathBuf,
        result: Result<String, String>,
    },
    DatasetScanned {
        generation: u64,
        result: Result<DatasetSummary, String>,
    },
    Validated {
        generation: u64,
        issues: Vec<FieldIssue>,
    },
    /// The memory plan answering request `generation` (`FitView::needs_plan`).
    Planned {
        generation: u64,
        result: Result<Box<PlanReport>, String>,
    },
    /// The system check of the Monitor tab.
    SystemChecked(Result<Box<SystemReport>, String>),
    /// Empty when the dialog was cancelled.
    Picked {
        purpose: PickPurpose,
        paths: Vec<PathBuf>,
    },
    ConfigLoaded {
        path: PathBuf,
        result: Result<Box<RunConfig>, String>,
    },
    DatasetRead {
        path: PathBuf,
        result: Result<String, String>,
    },
    /// A file was written (or not): says what, for the log.
    Saved {
        what: &'static str,
        result: Result<PathBuf, String>,
    },
    /// The run is ready to send (its dataset TOML written), or why not.
    RunPrepared(Result<Box<StartRun>, String>),
    /// The runs the output folder `dir` holds (what Start would write beside).
    OutputFolderRead {
        dir: PathBuf,
        runs: Vec<framesmith_config::outputs::FoundRun>,
        next: PathBuf,
    },
    SampleThumbnail {
        frames: PathBuf,
        thumbnail: Option<Thumbnail>,
    },
    /// The generate panel's starting settings for the project.
    GenerateDefaults(Box<GenerateSettings>),
    /// A LoRA tool's action ended (`LoraAction::label`).
    LoraToolDone {
        label: String,
        result: Result<LoraReport, String>,
    },
    /// The base model of a merge was chosen, with its size when it could be read.
    MergeBaseChosen(Option<MergeBase>),
    /// A generation of the generate panel ended, with its log.
    Generated {
        result: Result<GeneratedClip, String>,
        log: Vec<String>,
    },
}

/// How jobs run: on threads (the app) or at once on the caller's thread (tests, for determinism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobMode {
    Background,
    Inline,
}

/// Spawns jobs and collects their results.
pub struct Jobs {
    mode: JobMode,
    results_tx: SyncSender<JobResult>,
    results_rx: Receiver<JobResult>,
    repaint: Option<egui::Context>,
    /// Results that an inline job could not queue because the channel was full.
    overflow: Vec<JobResult>,
}

impl Jobs {
    pub fn new(mode: JobMode, repaint: Option<egui::Context>) -> Self {
        let (results_tx, results_rx) = std::sync::mpsc::sync_channel(RESULT_CAPACITY);
        Self {
            mode,
            results_tx,
            results_rx,
            repaint,
            overflow: Vec::new(),
        }
    }

    /// Runs `job` off the UI thread (or inline in `JobMode::Inline`).
    pub fn spawn(&mut self, name: &str, job: impl FnOnce() -> JobResult + Send + 'static) {
        match self.mode {
            JobMode::Inline => {
                if let Err(TrySendError::Full(result) | TrySendError::Disconnected(result)) =
                    self.results_tx.try_send(job())
                {
                    self.overflow.push(result);
                }
            }
            JobMode::Background => {
                let tx = self.results_tx.clone();
                let repaint = self.repaint.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("job: {name}"))
                    .spawn(move || {
                        // The receiver is gone only when the app is closing; nothing is left to tell.
                        let _ = tx.send(job());
                        if let Some(ctx) = repaint {
                            ctx.request_repaint();
                        }
                    });
                if let Err(err) = spawned {
                    self.overflow.push(JobResult::Saved {
                        what: "background job",
                        result: Err(format!("cannot start a thread for {name}: {err}")),
                    });
                }
            }
        }
    }

    /// Opens a file dialog for `purpose` off the UI thread; the choice comes back as `JobResult::Picked`.
    pub fn pick(&mut self, purpose: PickPurpose) {
        self.spawn("file dialog", move || {
            let paths = super::dialogs::pick(&purpose);
            JobResult::Picked { purpose, paths }
        });
    }

    /// Every result that has arrived.
    pub fn drain(&mut self) -> Vec<JobResult> {
        let mut results: Vec<JobResult> = self.results_rx.try_iter().collect();
        results.append(&mut self.overflow);
        results
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn saved(n: usize) -> JobResult {
        JobResult::Saved {
            what: "test",
            result: Ok(PathBuf::from(n.to_string())),
        }
    }

    #[test]
    fn background_results_arrive_through_the_channel() {
        let mut jobs = Jobs::new(JobMode::Background, None);
        jobs.spawn("one", || saved(1));
        // Blocking here is the test's own thread, standing in for later frames.
        let result = jobs.results_rx.recv().unwrap();
        assert!(matches!(result, JobResult::Saved { result: Ok(p), .. } if p == Path::new("1")));
    }

    #[test]
    fn inline_jobs_never_drop_results_when_the_channel_is_full() {
        let mut jobs = Jobs::new(JobMode::Inline, None);
        for n in 0..RESULT_CAPACITY + 3 {
            jobs.spawn("n", move || saved(n));
        }
        assert_eq!(jobs.drain().len(), RESULT_CAPACITY + 3);
        assert!(jobs.drain().is_empty());
    }
}
