//! The GUI's `Backend`: connects the app (which never sees tensors) to the model inspector, the dataset checker,
//! the presets, validation, the system check and the engine thread. Uses only the crates' own paths, so `tests/app_wiring.rs` can
//! include this file as it is.

use std::path::{Path, PathBuf};

use framesmith_app::{Backend, DatasetSummary, FieldIssue, ModelRole, PresetView, Severity};
use framesmith_config::protocol::doctor::SystemReport;
use framesmith_config::protocol::memory::PlanReport;
use framesmith_config::protocol::EngineHandle;
use framesmith_config::{presets, validate_for, HostInfo, RunConfig};
use framesmith_data::config::DatasetKind;
use framesmith_data::{check_path, DatasetReport, ScanOptions};

/// Where the GUI's demo project writes its outputs.
pub const DEMO_DIR: &str = "framesmith-demo";
/// How often the GUI's demo project samples (it also samples before the first step).
const DEMO_SAMPLE_EVERY_N_STEPS: usize = 100;

/// Writes the start frames of the generated demo clips and the sample prompt file into `dir`; returns the file.
fn write_demo_samples(dir: &Path, seed: u64) -> anyhow::Result<PathBuf> {
    use framesmith_engine::train::demo_setup::{
        write_sample_prompts, DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE,
    };
    let clips = framesmith_engine::demo::shapes::generate(DEMO_CLIPS, DEMO_FRAMES, DEMO_SIZE, seed);
    write_sample_prompts(dir, &clips)
}

/// The real modules behind the app.
pub struct EngineBackend {
    presets: Vec<presets::Preset>,
}

impl EngineBackend {
    /// Loads the built-in presets once.
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            presets: presets::builtins()?,
        })
    }
}

/// What the app's model picker shows for a file: what `framesmith inspect` says of it (a Wan or FLUX.1 DiT, VAE or
/// autoencoder, text encoder). A DiT it cannot name is an error; a VAE or text encoder it cannot name (e.g. an
/// official `.pth`) gets its size, checked when the run loads it.
fn describe_model(role: ModelRole, path: &Path) -> Result<String, String> {
    match (framesmith_models::identify::identify(path), role) {
        (Ok(report), _) => Ok(report.to_string()),
        (Err(err), ModelRole::Dit) => Err(format!("{err:#}")),
        (Err(_), ModelRole::Vae | ModelRole::TextEncoder) => std::fs::metadata(path)
            .map(|meta| {
                format!(
                    "{} (checked when the run loads it)",
                    framesmith_app::format_bytes(meta.len())
                )
            })
            .map_err(|err| format!("cannot read the file: {err}: {}", path.display())),
    }
}

impl Backend for EngineBackend {
    fn inspect_model(&self, role: ModelRole, path: &Path) -> Result<String, String> {
        describe_model(role, path)
    }

    fn scan_dataset(&self, folders: &[PathBuf]) -> Result<DatasetSummary, String> {
        let options = ScanOptions::locate();
        let mut summary = DatasetSummary {
            folders: folders.to_vec(),
            thumbnails: framesmith_app::thumbnails(folders, framesmith_app::THUMBNAILS),
            ..DatasetSummary::default()
        };
        for folder in folders {
            let report = check_path(folder, &options).map_err(|err| format!("{err:#}"))?;
            add_report(&mut summary, folder, &report);
        }
        Ok(summary)
    }

    fn presets(&self) -> Vec<PresetView> {
        self.presets
            .iter()
            .map(|preset| PresetView {
                name: preset.name.clone(),
                summary: preset.summary.clone(),
                reasons: preset
                    .settings()
                    .into_iter()
                    .map(|s| (s.key, s.why))
                    .collect(),
            })
            .collect()
    }

    fn apply_preset(&self, name: &str, config: &RunConfig) -> Result<RunConfig, String> {
        let preset = self
            .presets
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| format!("no preset named {name}"))?;
        preset
            .apply(config)
            .map(|applied| applied.config)
            .map_err(|err| format!("{err:#}"))
    }

    fn validate(&self, config: &RunConfig) -> Vec<FieldIssue> {
        // Validation runs on a job thread; counting CUDA devices (and reading model.dit's header for the family)
        // there never stalls the UI.
        let host = HostInfo::new(framesmith_engine::train::setup::cuda_device_count());
        let family = framesmith_engine::train::flux::model_family(config);
        match validate_for(config, &host, family) {
            Ok(_) => Vec::new(),
            Err(errors) => errors
                .problems
                .into_iter()
                .map(|p| FieldIssue {
                    key: p.key,
                    message: format!("{}; {}", p.message, p.fix),
                    severity: Severity::Error,
                })
                .collect(),
        }
    }

    fn plan_memory(
        &self,
        config: &RunConfig,
        dataset_toml: Option<&str>,
    ) -> Result<PlanReport, String> {
        framesmith_engine::plan::plan_config(config, dataset_toml).map_err(|err| format!("{err:#}"))
    }

    fn system_check(&self, output_dir: &Path) -> Result<SystemReport, String> {
        Ok(framesmith_engine::doctor::check(output_dir))
    }

    fn demo_project(&self) -> RunConfig {
        // demo-cpu over the defaults trains on generated data: nothing to download first.
        let mut config = self
            .apply_preset("demo-cpu", &RunConfig::default())
            .unwrap_or_default();
        let dir = std::path::absolute(DEMO_DIR).unwrap_or_else(|_| PathBuf::from(DEMO_DIR));
        config.output.output_dir = dir.join("output");
        // Samples need the start frames of the generated clips on disk (a few KiB): without them the project
        // still trains, with no samples.
        match write_demo_samples(&dir, config.training.seed) {
            Ok(prompts) => {
                config.sampling.prompts = Some(prompts);
                config.sampling.sample_every_n_steps = Some(DEMO_SAMPLE_EVERY_N_STEPS);
                config.sampling.sample_at_first = true;
            }
            Err(err) => eprintln!("the demo project makes no samples: {err:#}"),
        }
        config
    }

    fn spawn_engine(&self) -> Result<EngineHandle, String> {
        framesmith_engine::train::engine::spawn()
            .map_err(|err| format!("cannot start the engine thread: {err}"))
    }
}

/// Folds one folder's dataset report into the app's summary.
fn add_report(summary: &mut DatasetSummary, folder: &Path, report: &DatasetReport) {
    for dataset in &report.datasets {
        match dataset.kind {
            DatasetKind::Image => summary.images += dataset.media_found,
            DatasetKind::Video => {
                summary.videos += dataset.media_found;
                summary.video_folders.push(folder.to_path_buf());
            }
        }
        summary.captions += dataset.captions;
        summary
            .missing_captions
            .extend(dataset.missing_captions.iter().cloned());
        summary.unreadable.extend(
            dataset
                .unreadable
                .iter()
                .map(|p| (p.clone(), "cannot be read".to_owned())),
        );
        for (&size, &count) in &dataset.sizes {
            *summary.resolutions.entry(size).or_insert(0) += count;
        }
        if let Some(spread) = dataset.frame_counts {
            let (min, max) = summary
                .frame_range
                .map_or((spread.min, spread.max), |(a, b)| {
                    (a.min(spread.min), b.max(spread.max))
                });
            summary.frame_range = Some((min, max));
        }
    }
    summary
        .problems
        .extend(report.problems.iter().map(ToString::to_string));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flux_fixture(case: &str) -> PathBuf {
        framesmith_models::fixtures::case_dir("flux", case).join("weights.safetensors")
    }

    #[test]
    fn the_model_picker_names_flux_files_and_refuses_what_is_no_dit() {
        let dit = describe_model(ModelRole::Dit, &flux_fixture("flux_dit"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(dit.contains("FLUX.1"), "{dit}");
        let ae = describe_model(ModelRole::Vae, &flux_fixture("flux_ae"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ae.contains("FLUX.1") && !ae.contains("checked when"),
            "{ae}"
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let junk = dir.path().join("notes.safetensors");
        std::fs::write(&junk, b"not a model").unwrap_or_else(|e| panic!("{e}"));
        assert!(describe_model(ModelRole::Dit, &junk).is_err());
        let vae = describe_model(ModelRole::Vae, &junk).unwrap_or_else(|e| panic!("{e}"));
        assert!(vae.contains("checked when the run loads it"), "{vae}");
        assert!(describe_model(ModelRole::Vae, &dir.path().join("missing.pth")).is_err());
    }
}
