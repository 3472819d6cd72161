//! Run outputs: LoRA files (musubi-tuner / ComfyUI format with ss_* and modelspec metadata plus our numerics
//! knobs), resumable training-state folders, and the JSONL metrics log. Every file is written under a temporary
//! name, synced, then renamed, so a kill at any instant leaves the previous checkpoint intact.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::trainer::{StepReport, Trainer};
use crate::nn::lora_file::LoraFile;
use crate::protocol::Event;

/// Format version of `state.json`.
const STATE_FORMAT: u32 = 1;
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
    metrics: File,
}

/// `state.json` of a training-state folder.
#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    format: u32,
    step: usize,
    seed: u64,
    accumulation: usize,
    total_steps: usize,
    lora_modules: usize,
}

/// What a save wrote.
pub struct Saved {
    pub step: usize,
    pub lora: PathBuf,
    pub state: Option<PathBuf>,
}

impl Saved {
    /// The protocol event announcing it.
    pub fn event(&self) -> Event {
        Event::CheckpointSaved {
            step: self.step,
            lora: self.lora.clone(),
            state: self.state.clone(),
        }
    }
}

fn io_context(action: &str, path: &Path) -> String {
    format!("cannot {action} {}", path.display())
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename), naming the file on failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    crate::config::io::write_atomic(path, bytes).with_context(|| io_context("write", path))
}

fn sync_dir(dir: Option<&Path>) {
    // Persisting the rename needs the directory synced; not possible on every platform, and not fatal.
    if let Some(d) = dir.and_then(|d| File::open(d).ok()) {
        let _ = d.sync_all();
    }
}

impl Outputs {
    /// Creates the output folder and opens (appending) its `metrics.jsonl`.
    pub fn create(
        dir: &Path,
        name: &str,
        metadata: HashMap<String, String>,
    ) -> anyhow::Result<Self> {
        fs::create_dir_all(dir).with_context(|| io_context("create the output folder", dir))?;
        let metrics_path = dir.join("metrics.jsonl");
        let metrics = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| io_context("open", &metrics_path))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            every_n_steps: None,
            every_n_epochs: None,
            save_state: true,
            save_dtype: DType::F32,
            metadata,
            config_toml: String::new(),
            metrics,
        })
    }

    /// Appends one line to `metrics.jsonl`.
    pub fn append_metrics(&mut self, step: usize, r: &StepReport) -> anyhow::Result<()> {
        let line = serde_json::json!({
            "step": step,
            "epoch": r.epoch,
            "loss": r.loss,
            "lr": r.learning_rate,
            "step_secs": r.step_secs,
            "grad_norm": r.grad_norm,
            "skipped": r.warning.is_some(),
        });
        writeln!(self.metrics, "{line}").context("cannot append to metrics.jsonl")?;
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
        list_states(&self.dir, &self.name)
    }
}

impl Trainer {
    /// Saves the LoRA (and, when enabled, a training-state folder). `final_save` writes `{name}.safetensors`;
    /// otherwise `{name}-{step:06}.safetensors`.
    pub fn save(&mut self, final_save: bool) -> anyhow::Result<Saved> {
        let step = self.step;
        let out = &self.outputs;
        let lora = if final_save {
            out.dir.join(format!("{}.safetensors", out.name))
        } else {
            out.dir.join(format!("{}-{step:06}.safetensors", out.name))
        };
        let mut metadata = out.metadata.clone();
        metadata.insert("ss_steps".into(), step.to_string());
        metadata.insert(
            "ss_epoch".into(),
            self.epoch().saturating_sub(1).to_string(),
        );
        self.loras
            .save(&lora, out.save_dtype, &metadata)
            .with_context(|| io_context("save the LoRA", &lora))?;
        let state = if out.save_state {
            Some(self.save_state(&metadata)?)
        } else {
            None
        };
        Ok(Saved { step, lora, state })
    }

    fn save_state(&self, metadata: &HashMap<String, String>) -> anyhow::Result<PathBuf> {
        let out = &self.outputs;
        let dir = out.dir.join(format!("{}-state-{:06}", out.name, self.step));
        let tmp = dir.with_extension("partial");
        if tmp.exists() {
            fs::remove_dir_all(&tmp).with_context(|| io_context("clear", &tmp))?;
        }
        fs::create_dir_all(&tmp).with_context(|| io_context("create", &tmp))?;
        self.loras
            .save(&tmp.join("lora.safetensors"), DType::F32, metadata)?;
        let optimizer: HashMap<String, Tensor> =
            self.optimizer.export_state()?.into_iter().collect();
        let optimizer_path = tmp.join("optimizer.safetensors");
        candle_core::safetensors::save(&optimizer, &optimizer_path)
            .with_context(|| io_context("write", &optimizer_path))?;
        // Write access: Windows refuses to flush a file opened read-only (access denied).
        fs::OpenOptions::new()
            .write(true)
            .open(&optimizer_path)
            .and_then(|f| f.sync_all())
            .with_context(|| io_context("sync", &optimizer_path))?;
        let state = StateFile {
            format: STATE_FORMAT,
            step: self.step,
            seed: self.seed,
            accumulation: self.accumulation,
            total_steps: self.total_steps,
            lora_modules: self.loras.len(),
        };
        write_atomic(
            &tmp.join("state.json"),
            serde_json::to_string_pretty(&state)?.as_bytes(),
        )?;
        write_atomic(&tmp.join("config.toml"), out.config_toml.as_bytes())?;
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| io_context("replace", &dir))?;
        }
        fs::rename(&tmp, &dir).with_context(|| io_context("rename into place", &dir))?;
        sync_dir(Some(&out.dir));
        let states = out.state_dirs();
        for old in states.iter().take(states.len().saturating_sub(STATES_KEPT)) {
            let _ = fs::remove_dir_all(old);
        }
        Ok(dir)
    }

    /// Continues from a training-state folder (or the newest complete one inside an output folder): LoRA weights,
    /// optimizer moments and the step count. The data order and noise follow from the step, so the run goes on
    /// exactly as if it had not stopped.
    pub fn resume(&mut self, path: &Path) -> anyhow::Result<PathBuf> {
        let dir = if path.join("state.json").exists() {
            path.to_path_buf()
        } else {
            list_states(path, &self.outputs.name).pop().with_context(|| {
                format!(
                    "no training state to resume in {} (expected a folder with state.json, or an output folder \
                     holding `{}-state-NNNNNN` folders)",
                    path.display(),
                    self.outputs.name
                )
            })?
        };
        let state_path = dir.join("state.json");
        let text =
            fs::read_to_string(&state_path).with_context(|| io_context("read", &state_path))?;
        let state: StateFile = serde_json::from_str(&text)
            .with_context(|| format!("corrupt training state {}", state_path.display()))?;
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
        let damaged = |e: &dyn std::fmt::Display| {
            // States are listed oldest first: the last one before `dir` is the newest earlier one.
            let earlier = dir
                .parent()
                .map(|out| list_states(out, &self.outputs.name))
                .unwrap_or_default()
                .into_iter()
                .rfind(|d| *d < dir);
            let fix = match earlier {
                Some(state) => format!(
                    "resume from an earlier state (--resume {})",
                    state.display()
                ),
                None => "start again without --resume".to_string(),
            };
            anyhow::anyhow!(
                "the training state in {} is damaged ({e}); {fix}",
                dir.display()
            )
        };
        let device = self.device().clone();
        let lora =
            LoraFile::load(&dir.join("lora.safetensors"), &device).map_err(|e| damaged(&e))?;
        self.loras.load_weights(&lora).map_err(|e| damaged(&e))?;
        let optimizer_path = dir.join("optimizer.safetensors");
        let optimizer = candle_core::safetensors::load(&optimizer_path, &Device::Cpu)
            .and_then(|tensors| {
                tensors
                    .into_iter()
                    .map(|(k, v)| Ok((k, v.to_device(&device)?)))
                    .collect::<candle_core::Result<HashMap<_, _>>>()
            })
            .map_err(|e| damaged(&format!("{e}: {}", optimizer_path.display())))?;
        self.optimizer
            .import_state(&optimizer)
            .map_err(|e| damaged(&e))?;
        self.step = state.step;
        Ok(dir)
    }
}

/// Complete training-state folders `{name}-state-NNNNNN` in `dir`, oldest first.
fn list_states(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}-state-");
    let mut dirs: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.join("state.json").exists()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&prefix) && !n.ends_with(".partial"))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}
