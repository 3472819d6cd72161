//! What a run settles before anything heavy loads: the folder it writes into, taken under the output folder's
//! lock (one run per folder), checked writable and cleared of the temporary files interrupted saves left; the
//! training state it resumes from; and a `lora.init_from` that holds NaN or infinite values. A run that cannot
//! write its outputs or start from its LoRA fails in seconds, not after a 14B model load.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::Device;
use framesmith_config::outputs::{
    find_resume, new_run_dir, output_folder_of, remove_stale_temporaries, runs_in, FolderLock,
    StateRecord,
};
use framesmith_config::plan::TrainLength;
use framesmith_config::protocol::{LogLevel, StartRun};
use framesmith_config::{RunConfig, RunPlan};
use framesmith_nn::lora_file::{LoraFile, LoraFileError};

/// The folder a run writes into, taken.
pub struct RunFolder {
    /// The training state to resume from, when resuming.
    pub resume: Option<PathBuf>,
    /// The output folder's lock (held by the process that writes: rank 0).
    pub lock: Option<FolderLock>,
}

/// Settles where the run of `request` writes (into `plan.output.output_dir`: the configured folder, a new
/// `run-N` folder of it, or the folder of the state it resumes) and, when this process writes, takes the output
/// folder: a folder another run holds is refused at once, naming that run.
pub fn take_run_folder(
    request: &StartRun,
    plan: &mut RunPlan,
    writes: bool,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<RunFolder> {
    let configured = plan.output.output_dir.clone();
    if let Some(path) = &request.resume_from {
        let target = find_resume(path, &request.config)?;
        let lock = writes
            .then(|| take(&output_folder_of(&target.run_dir), &target.run_dir, log))
            .transpose()?;
        for damaged in &target.skipped {
            log(LogLevel::Warn, damaged.describe());
        }
        plan.output.output_dir = target.run_dir;
        return Ok(RunFolder {
            resume: Some(target.state.dir),
            lock,
        });
    }
    if !writes {
        return Ok(RunFolder {
            resume: None,
            lock: None,
        });
    }
    // Taken before the run folder is chosen: two runs started together cannot both choose the same one.
    let lock = take(&configured, &configured, log)?;
    plan.output.output_dir = new_run_dir(&configured);
    if plan.output.output_dir != configured {
        log(
            LogLevel::Info,
            another_run_note(
                &configured,
                &plan.output.output_dir,
                &request.config,
                plan.training.length,
            ),
        );
    }
    Ok(RunFolder {
        resume: None,
        lock: Some(lock),
    })
}

/// Takes `output_folder` for a run writing into `run_dir` (the folder or one of its run folders): its lock,
/// a check that it can be written, and the removal of what interrupted saves left there.
fn take(
    output_folder: &Path,
    run_dir: &Path,
    log: &mut dyn FnMut(LogLevel, String),
) -> anyhow::Result<FolderLock> {
    let lock = FolderLock::acquire(output_folder)?;
    check_writable(if run_dir.is_dir() {
        run_dir
    } else {
        output_folder
    })?;
    let removed = remove_stale_temporaries(output_folder);
    if !removed.paths.is_empty() {
        log(
            LogLevel::Info,
            format!(
                "removed {} temporary file(s) and folder(s) ({:.1} MiB) that interrupted saves left in {}",
                removed.paths.len(),
                removed.bytes as f64 / (1u64 << 20) as f64,
                output_folder.display()
            ),
        );
    }
    Ok(lock)
}

/// Errors, naming the folder, when a file cannot be written into `dir`.
fn check_writable(dir: &Path) -> anyhow::Result<()> {
    let probe = dir.join(format!(".framesmith-write-check-{}", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"ok"));
    let _ = fs::remove_file(&probe);
    written.map_err(|e| {
        anyhow::anyhow!(
            "cannot write into the output folder ({e}); make it writable, or set output.output_dir to another \
             folder: {}",
            dir.display()
        )
    })
}

/// Reads `lora.init_from` and refuses it when it is unreadable or a tensor holds NaN or infinite values, naming
/// the tensor and the file (before the model loads; the LoRA is read again onto the run's device, and checked
/// against the model, once the model is there).
pub fn check_init_from(plan: &RunPlan) -> anyhow::Result<()> {
    if let Some(path) = &plan.lora.init_from {
        let expected = "a LoRA .safetensors with finite values (an earlier checkpoint, for one)";
        load_init_lora(path, &Device::Cpu, expected)?;
    }
    Ok(())
}

/// Loads the LoRA a run starts from (`lora.init_from`), refusing NaN or infinite values; an error says to point
/// it at `expected`, or remove it.
pub fn load_init_lora(path: &Path, device: &Device, expected: &str) -> anyhow::Result<LoraFile> {
    let read = LoraFile::load(path, device).and_then(|file| {
        file.check_finite(path)?;
        Ok::<_, LoraFileError>(file)
    });
    read.map_err(|e| {
        anyhow::anyhow!(
            "lora.init_from: {e}; point it at {expected}, or remove it to start from a fresh LoRA"
        )
    })
}

/// Says where a new run writes when its configured folder holds another run, and, when `--resume` would
/// continue that run under this config (a good state that matches it, short of the run's end), how to do that
/// instead.
fn another_run_note(
    configured: &Path,
    run_dir: &Path,
    config: &RunConfig,
    length: TrainLength,
) -> String {
    let held: Vec<String> = runs_in(configured).iter().map(|r| r.describe()).collect();
    let resumable = find_resume(configured, config).is_ok_and(|target| {
        let step = target.state.step;
        match length {
            TrainLength::Steps(total) => step < total,
            // The length in steps follows from the dataset: the saved run's is this one's.
            TrainLength::Epochs(_) => {
                StateRecord::read(&target.state.dir).is_ok_and(|r| step < r.total_steps)
            }
        }
    });
    let go_on = if resumable {
        format!(
            " (to continue the earlier run instead, start with --resume {})",
            configured.display()
        )
    } else {
        String::new()
    };
    format!(
        "{} already holds {}; this run writes to {} so that nothing of it is replaced{go_on}",
        configured.display(),
        held.join("; "),
        run_dir.display(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_that_cannot_be_written_is_named() {
        let dir = tempfile::tempdir().unwrap();
        check_writable(dir.path()).unwrap();
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no probe left"
        );
        // A file where the folder should be: no permission bits involved, so it fails for root too.
        let file = dir.path().join("file");
        fs::write(&file, "").unwrap();
        let err = format!("{:#}", check_writable(&file).unwrap_err());
        assert!(
            err.starts_with("cannot write into the output folder (")
                && err.ends_with(&file.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn the_note_on_another_run_offers_resume_only_when_it_would_work() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        // A run that died before its first save: run files, no training state.
        fs::write(out.join("run.toml"), "").unwrap();
        fs::write(out.join("metrics.jsonl"), "").unwrap();
        let config = RunConfig::default();
        let note = another_run_note(out, &out.join("run-2"), &config, TrainLength::Steps(10));
        assert!(
            note.contains("a run, no training state saved") && !note.contains("--resume"),
            "{note}"
        );
    }
}
