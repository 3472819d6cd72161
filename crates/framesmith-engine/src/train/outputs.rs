//! Run outputs: LoRA files (musubi-tuner / ComfyUI format with ss_* and modelspec metadata plus our numerics
//! knobs), resumable training-state folders, and the JSONL metrics log, all in the run's own folder
//! (`config::outputs`). Every file is written under a temporary name, synced, then renamed, so a kill at any
//! instant leaves the previous checkpoint intact; a failed write leaves nothing half-written in sight.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::train::optimizer::AdamW;
use crate::train::trainer::{StepReport, Trainer};
use framesmith_config::file_read::{read_string_bounded, ReadLimit};
use framesmith_config::outputs::{
    newest_good_state_before, states_in, FolderLock, RunRecord, StateRecord, RUN_RECORD_FILE,
    STATE_FORMAT,
};
use framesmith_config::protocol::{Event, LogLevel, ValidationLoss};
use framesmith_config::schedule::LrSchedule;
use framesmith_nn::lora::LoraSet;
use framesmith_nn::lora_file::{LoraFile, LoraFileError};

mod write_errors;

pub use write_errors::is_disk_full;
use write_errors::{candle_io, disk_full, lora_write_failure, write_failure};

/// Training-state folders kept; older ones are removed once a newer one is complete.
const STATES_KEPT: usize = 2;

/// Where and when a run writes its outputs.
pub struct Outputs {
    pub dir: PathBuf,
    pub name: String,
    pub every_n_steps: Option<usize>,
    pub every_n_epochs: Option<usize>,
    pub save_state: bool,
    pub save_dtype: DType,
    /// ss_* / modelspec / framesmith.* metadata written into every LoRA.
    pub metadata: HashMap<String, String>,
    /// The resolved run config (TOML), copied into every training-state folder.
    pub config_toml: String,
    /// Who owns the folder: written by `begin` for a new run, read back for a resumed one.
    pub record: RunRecord,
    /// `metrics.jsonl`, open from `begin` on.
    metrics: Option<File>,
    /// The output folder's lock, held until the run ends (see `train::preflight`).
    lock: Option<FolderLock>,
}

/// What a save wrote.
#[derive(Debug)]
pub struct Saved {
    pub step: usize,
    /// The LoRA files: one, or a `split` run's high-noise then low-noise LoRA.
    pub loras: Vec<PathBuf>,
    pub state: Option<PathBuf>,
}

impl Saved {
    /// The protocol events announcing it, one per LoRA file.
    pub fn events(&self) -> Vec<Event> {
        self.loras
            .iter()
            .map(|lora| Event::CheckpointSaved {
                step: self.step,
                lora: lora.clone(),
                state: self.state.clone(),
            })
            .collect()
    }
}

/// The file-name suffixes of a `split` run's two LoRAs, and the `framesmith.expert` metadata each carries.
const EXPERT_SUFFIXES: [(&str, &str); 2] =
    [("_high_noise", "high_noise"), ("_low_noise", "low_noise")];

/// Where a state folder keeps the low-noise expert's LoRA and optimizer state (a `split` run).
const LOW_NOISE_STATE: [&str; 2] = [
    "lora_low_noise.safetensors",
    "optimizer_low_noise.safetensors",
];

fn io_context(action: &str, path: &Path) -> String {
    format!("cannot {action} {}", path.display())
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename), naming the file on failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    framesmith_config::io::write_atomic(path, bytes)
        .map_err(|e| write_failure(e, "write", path, bytes.len() as u64))
}

fn sync_dir(dir: Option<&Path>) {
    // Persisting the rename needs the directory synced; not possible on every platform, and not fatal.
    if let Some(d) = dir.and_then(|d| File::open(d).ok()) {
        let _ = d.sync_all();
    }
}

impl Outputs {
    /// The outputs of a run writing into `dir` (its own run folder). Nothing is written before `begin`.
    pub fn create(dir: &Path, name: &str, metadata: HashMap<String, String>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            every_n_steps: None,
            every_n_epochs: None,
            save_state: true,
            save_dtype: DType::F32,
            metadata,
            config_toml: String::new(),
            record: RunRecord::new(name),
            metrics: None,
            lock: None,
        }
    }

    /// Holds the output folder's lock for as long as these outputs live (the run).
    pub fn hold(&mut self, lock: FolderLock) {
        self.lock = Some(lock);
    }

    /// Takes the folder for this run, before its first step: the run record (kept when resuming), the resolved
    /// config (`run.toml`), and `metrics.jsonl` without the rows of steps after `step` (a resumed run writes them
    /// again, so every step has one row).
    pub fn begin(
        &mut self,
        step: usize,
        config: &framesmith_config::RunConfig,
    ) -> anyhow::Result<()> {
        fs::create_dir_all(&self.dir)
            .with_context(|| io_context("create the output folder", &self.dir))?;
        let record_path = self.dir.join(RUN_RECORD_FILE);
        match RunRecord::read(&self.dir) {
            Some(existing) if step > 0 => self.record = existing,
            _ => write_atomic(
                &record_path,
                serde_json::to_string_pretty(&self.record)?.as_bytes(),
            )?,
        }
        config
            .save(&self.dir.join("run.toml"))
            .context("saving the resolved run config")?;
        let metrics_path = self.dir.join("metrics.jsonl");
        if step > 0 {
            truncate_metrics(&metrics_path, step)?;
        }
        let metrics = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| io_context("open", &metrics_path))?;
        self.metrics = Some(metrics);
        Ok(())
    }

    /// Removes what `begin` wrote for a new run that ended before anything was saved or sampled, so that an
    /// aborted start leaves no run behind for the next one to step around. Only this run's own files go; the
    /// folder goes too when it is then empty.
    pub fn abandon_unused(&mut self) {
        self.metrics = None;
        if self.dir.join("samples").exists() {
            return;
        }
        for file in [RUN_RECORD_FILE, "run.toml", "metrics.jsonl"] {
            let _ = fs::remove_file(self.dir.join(file));
        }
        let _ = fs::remove_dir(&self.dir);
    }

    /// Appends one line to `metrics.jsonl`.
    pub fn append_metrics(&mut self, step: usize, r: &StepReport) -> anyhow::Result<()> {
        let mut line = serde_json::json!({
            "step": step,
            "epoch": r.epoch,
            "loss": r.loss,
            "lr": r.learning_rate,
            "step_secs": r.step_secs,
            "grad_norm": r.grad_norm,
            "skipped": r.warning.is_some(),
        });
        if let (Some(expert), Some(map)) = (r.expert, line.as_object_mut()) {
            map.insert("expert".into(), expert.name.into());
            map.insert("expert_switches".into(), expert.switches.into());
            map.insert("expert_switch_secs".into(), expert.switch_secs.into());
        }
        self.append_line(&line)
    }

    /// Appends a validation record to `metrics.jsonl`: `"kind": "validation"` and `val_loss` (the name musubi-tuner's
    /// forks log it under) instead of a training row's `loss`, so readers of training rows skip it.
    pub fn append_validation(&mut self, v: &ValidationLoss, secs: f64) -> anyhow::Result<()> {
        let line = serde_json::json!({
            "kind": "validation",
            "step": v.step,
            "val_loss": v.loss.is_finite().then_some(v.loss),
            "items": v.items,
            "timesteps": v.timesteps,
            "secs": secs,
        });
        self.append_line(&line)
    }

    fn append_line(&mut self, line: &serde_json::Value) -> anyhow::Result<()> {
        if let Some(metrics) = &mut self.metrics {
            writeln!(metrics, "{line}").map_err(|e| {
                write_failure(
                    e,
                    "append to the metrics log",
                    &self.dir.join("metrics.jsonl"),
                    4096,
                )
            })?;
        }
        Ok(())
    }

    /// Whether the save schedule falls on `step` (`epoch_done`: the epoch that step completed, if any).
    pub fn save_due(&self, step: usize, epoch_done: Option<usize>) -> bool {
        let by_steps = self.every_n_steps.is_some_and(|n| n > 0 && step % n == 0);
        let by_epochs = match (self.every_n_epochs, epoch_done) {
            (Some(n), Some(e)) => n > 0 && e > 0 && e % n == 0,
            _ => false,
        };
        by_steps || by_epochs
    }

    fn state_dirs(&self) -> Vec<PathBuf> {
        states_in(&self.dir, Some(&self.name))
            .into_iter()
            .map(|s| s.dir)
            .collect()
    }
}

impl Trainer {
    /// Saves the LoRA (and, when enabled, a training-state folder). `final_save` writes `{name}.safetensors`;
    /// otherwise `{name}-{step:06}.safetensors`.
    pub fn save(&mut self, final_save: bool) -> anyhow::Result<Saved> {
        let step = self.step;
        // Every rank holds the same LoRA: rank 0 alone writes it.
        if !self.writes_outputs() {
            return Ok(Saved {
                step,
                loras: Vec::new(),
                state: None,
            });
        }
        let out = &self.outputs;
        let file = |suffix: &str| {
            if final_save {
                out.dir.join(format!("{}{suffix}.safetensors", out.name))
            } else {
                out.dir
                    .join(format!("{}{suffix}-{step:06}.safetensors", out.name))
            }
        };
        let mut metadata = out.metadata.clone();
        metadata.insert("ss_steps".into(), step.to_string());
        metadata.insert(
            "ss_epoch".into(),
            self.epoch().saturating_sub(1).to_string(),
        );
        let lora_bytes = self.lora_bytes(out.save_dtype);
        let mut loras = Vec::new();
        for (set, suffix) in self.lora_sets() {
            let path = file(suffix.map_or("", |(s, _)| s));
            let mut metadata = metadata.clone();
            if let Some((_, expert)) = suffix {
                metadata.insert("framesmith.expert".into(), expert.into());
            }
            set.save_as(&path, out.save_dtype, &metadata, self.family.lora_layout())
                .map_err(|e| lora_write_failure(e, "save the LoRA", &path, lora_bytes))?;
            loras.push(path);
        }
        let state = if out.save_state {
            let dir = out.dir.join(format!("{}-state-{:06}", out.name, self.step));
            let tmp = dir.with_extension("partial");
            let written = self.save_state(&metadata, &tmp, &dir);
            if written.is_err() {
                // Nothing half-written stays in sight; the earlier states are untouched.
                let _ = fs::remove_dir_all(&tmp);
            }
            Some(written?)
        } else {
            None
        };
        Ok(Saved { step, loras, state })
    }

    /// The LoRAs a save writes: the run's one (or joint) LoRA with no suffix, or a `split` run's two with their
    /// file-name suffix and expert name.
    fn lora_sets(&self) -> Vec<(&LoraSet, Option<(&'static str, &'static str)>)> {
        match self.family.second_lora() {
            Some((low, _)) => vec![
                (&self.loras, Some(EXPERT_SUFFIXES[0])),
                (low, Some(EXPERT_SUFFIXES[1])),
            ],
            None => vec![(&self.loras, None)],
        }
    }

    /// Bytes of the LoRA's tensors in `dtype` (what a save needs on disk, roughly).
    fn lora_bytes(&self, dtype: DType) -> u64 {
        let params = self.loras.parameter_count() as u64;
        params * dtype.size_in_bytes() as u64
    }

    /// Writes the state into `tmp`, then renames it to `dir` and prunes this run's older states.
    fn save_state(
        &self,
        metadata: &HashMap<String, String>,
        tmp: &Path,
        dir: &Path,
    ) -> anyhow::Result<PathBuf> {
        let out = &self.outputs;
        if tmp.exists() {
            fs::remove_dir_all(tmp).with_context(|| io_context("clear", tmp))?;
        }
        fs::create_dir_all(tmp).with_context(|| io_context("create", tmp))?;
        let lora_path = tmp.join("lora.safetensors");
        let lora_bytes = self.lora_bytes(DType::F32);
        self.loras
            .save(&lora_path, DType::F32, metadata)
            .map_err(|e| {
                lora_write_failure(e, "save the training state's LoRA", &lora_path, lora_bytes)
            })?;
        let optimizer: HashMap<String, Tensor> =
            self.optimizer.export_state()?.into_iter().collect();
        let optimizer_path = tmp.join("optimizer.safetensors");
        candle_core::safetensors::save(&optimizer, &optimizer_path).map_err(|e| {
            if candle_io(&e).is_some_and(is_disk_full) {
                disk_full("save the optimizer state", &optimizer_path, 2 * lora_bytes)
            } else {
                anyhow::Error::new(e).context(io_context("write", &optimizer_path))
            }
        })?;
        sync_file(&optimizer_path, 2 * lora_bytes)?;
        if let Some((loras, optimizer)) = self.family.second_lora() {
            let [lora_file, optimizer_file] = LOW_NOISE_STATE;
            let lora_path = tmp.join(lora_file);
            loras.save(&lora_path, DType::F32, metadata).map_err(|e| {
                lora_write_failure(e, "save the training state's LoRA", &lora_path, lora_bytes)
            })?;
            let optimizer_path = tmp.join(optimizer_file);
            let state: HashMap<String, Tensor> = optimizer.export_state()?.into_iter().collect();
            candle_core::safetensors::save(&state, &optimizer_path).map_err(|e| {
                if candle_io(&e).is_some_and(is_disk_full) {
                    disk_full("save the optimizer state", &optimizer_path, 2 * lora_bytes)
                } else {
                    anyhow::Error::new(e).context(io_context("write", &optimizer_path))
                }
            })?;
            sync_file(&optimizer_path, 2 * lora_bytes)?;
        }
        let state = StateRecord {
            format: STATE_FORMAT,
            step: self.step,
            seed: self.seed,
            accumulation: self.accumulation,
            total_steps: self.total_steps,
            lora_modules: self.loras.len(),
            run_id: Some(out.record.run_id.clone()),
            world_size: self.collective.world(),
        };
        write_atomic(
            &tmp.join("state.json"),
            serde_json::to_string_pretty(&state)?.as_bytes(),
        )?;
        write_atomic(&tmp.join("config.toml"), out.config_toml.as_bytes())?;
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| io_context("replace", dir))?;
        }
        fs::rename(tmp, dir).with_context(|| io_context("rename into place", dir))?;
        sync_dir(Some(&out.dir));
        let states = out.state_dirs();
        for old in states.iter().take(states.len().saturating_sub(STATES_KEPT)) {
            let _ = fs::remove_dir_all(old);
        }
        Ok(dir.to_path_buf())
    }

    /// Continues from a training-state folder of this run's folder (found by `config::outputs::find_resume`):
    /// LoRA weights, optimizer moments and the step count. The data order and noise follow from the step, so the
    /// run goes on exactly as if it had not stopped. Refuses, before anything is written, a state that has
    /// already reached this config's last step. When the run's length changed since the save, `log` says how the
    /// learning-rate schedule changes with it.
    pub fn resume(
        &mut self,
        dir: &Path,
        log: &mut dyn FnMut(LogLevel, String),
    ) -> anyhow::Result<PathBuf> {
        let state = StateRecord::read(dir)?;
        if state.format != STATE_FORMAT
            || state.accumulation != self.accumulation
            || state.seed != self.seed
        {
            anyhow::bail!(
                "the training state in {} was made with other settings (seed {}, accumulation {}); resume with the \
                 run's original config",
                dir.display(),
                state.seed,
                state.accumulation
            );
        }
        let world = self.collective.world();
        if state.world_size != world {
            anyhow::bail!(
                "the training state in {} was trained on {} GPU(s) and this run has {world}: each step took \
                 {} micro-batches (batch size × gradient accumulation × GPUs) there and would take {} here, so the \
                 run could not go on exactly as it would have. Resume it on {} GPU(s) (`--gpus` with that many \
                 ids), or start a new run",
                dir.display(),
                state.world_size,
                state.accumulation * state.world_size,
                self.accumulation * world,
                state.world_size
            );
        }
        if state.step >= self.total_steps {
            anyhow::bail!(
                "the run already reached step {} and this config ends at step {}: nothing to train, and nothing was \
                 changed. Raise training.max_train_steps (or max_train_epochs) to train on, or start a new run \
                 without --resume: {}",
                state.step,
                self.total_steps,
                dir.display()
            );
        }
        let damaged = |e: &dyn std::fmt::Display| {
            let earlier = dir.parent().and_then(|out| {
                newest_good_state_before(out, Some(&self.outputs.name), state.step)
            });
            let fix = match earlier {
                Some(s) => format!(
                    "resume from the state before it (--resume {})",
                    s.dir.display()
                ),
                None => "no earlier good state is left: start again without --resume".to_string(),
            };
            anyhow::anyhow!(
                "the training state in {} is damaged ({e}); {fix}",
                dir.display()
            )
        };
        let device = self.device().clone();
        let files = ["lora.safetensors", "optimizer.safetensors"];
        restore(dir, files, (&self.loras, &mut self.optimizer), &device)
            .map_err(|e| e.explain(dir, &damaged))?;
        let low_device = self.family.second_device().unwrap_or(&device).clone();
        if let Some((loras, optimizer)) = self.family.second_lora_mut() {
            restore(dir, LOW_NOISE_STATE, (loras, optimizer), &low_device)
                .map_err(|e| e.explain(dir, &damaged))?;
        }
        self.family.sync_lora(&self.loras)?;
        self.step = state.step;
        if let Some(line) = schedule_change(&self.schedule, state.step, state.total_steps) {
            log(LogLevel::Warn, line);
        }
        Ok(dir.to_path_buf())
    }
}

/// What a resumed run's learning-rate schedule does when the run's length changed since the save (`saved_total`
/// steps then, `now.total_steps` now): it is laid over the new length, as musubi-tuner's and OneTrainer's are
/// (their schedulers are rebuilt from the new step count on resume), so the rate jumps where the two differ.
/// `None` when nothing changes.
fn schedule_change(now: &LrSchedule, step: usize, saved_total: usize) -> Option<String> {
    let then = LrSchedule {
        total_steps: saved_total,
        ..*now
    };
    if saved_total == now.total_steps
        || (step..now.total_steps).all(|s| then.lr_at(s) == now.lr_at(s))
    {
        return None;
    }
    Some(format!(
        "the run now ends at step {} instead of step {saved_total} as when this state was saved: the {} \
         learning-rate schedule is stretched over the new length (as musubi-tuner and OneTrainer do on resume), so \
         at step {step} the learning rate is {:.3e} where the saved run's schedule had {:.3e}. To keep the old \
         schedule, resume with the length the run was saved with",
        now.total_steps,
        // The name the config gives it (`cosine_with_restarts`).
        serde_json::to_value(now.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        now.lr_at(step),
        then.lr_at(step),
    ))
}

/// Why a training state's LoRA or optimizer state could not be restored.
enum RestoreError {
    /// The state's LoRA does not fit this config's.
    Mismatch(LoraFileError),
    /// A file is missing or unreadable.
    Damaged(String),
}

impl RestoreError {
    /// The message for the user; `damaged` words a damaged state (with the earlier state to resume from).
    fn explain(
        self,
        dir: &Path,
        damaged: &dyn Fn(&dyn std::fmt::Display) -> anyhow::Error,
    ) -> anyhow::Error {
        match self {
            Self::Mismatch(e) => anyhow::anyhow!(
                "cannot resume: the training state's LoRA does not fit this config's LoRA ({e}). Resume with the \
                 run's config (lora.rank, lora.alpha, the include/exclude patterns and model.experts as they were), \
                 or start a new run without --resume: {}",
                dir.display()
            ),
            Self::Damaged(e) => damaged(&e),
        }
    }
}

/// Loads a LoRA's weights and its optimizer's moments from the state folder `dir` (`files`: the LoRA's and the
/// optimizer state's file names).
fn restore(
    dir: &Path,
    [lora_file, optimizer_file]: [&str; 2],
    (loras, optimizer): (&LoraSet, &mut AdamW),
    device: &Device,
) -> Result<(), RestoreError> {
    let lora_path = dir.join(lora_file);
    let lora =
        LoraFile::load(&lora_path, device).map_err(|e| RestoreError::Damaged(e.to_string()))?;
    loras.load_weights(&lora).map_err(|e| match e {
        LoraFileError::ShapeMismatch { .. } | LoraFileError::NotInModel { .. } => {
            RestoreError::Mismatch(e)
        }
        other => RestoreError::Damaged(other.to_string()),
    })?;
    let optimizer_path = dir.join(optimizer_file);
    let state = candle_core::safetensors::load(&optimizer_path, &Device::Cpu)
        .and_then(|tensors| {
            tensors
                .into_iter()
                .map(|(k, v)| Ok((k, v.to_device(device)?)))
                .collect::<candle_core::Result<HashMap<_, _>>>()
        })
        .map_err(|e| RestoreError::Damaged(format!("{e}: {}", optimizer_path.display())))?;
    optimizer
        .import_state(&state)
        .map_err(|e| RestoreError::Damaged(e.to_string()))
}

/// Flushes a written file to disk. Write access: Windows refuses to flush a file opened read-only.
fn sync_file(path: &Path, needed_bytes: u64) -> anyhow::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| write_failure(e, "sync", path, needed_bytes))
}

/// Drops the rows of steps after `step` from a metrics log (a resumed run writes them again).
fn truncate_metrics(path: &Path, step: usize) -> anyhow::Result<()> {
    let Ok(text) = read_string_bounded(path, ReadLimit::JSONL) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    write_atomic(path, kept.as_bytes())
}
