//! What the app does with each finished job, and the run preparation job itself.

use std::path::PathBuf;

use framesmith_config::protocol::{Event, LogLevel, StartRun};

use super::config_editor::parse_config;
use super::jobs::{JobResult, PickPurpose};
use super::queue::QueuedRun;
use super::spill_guard::SpillGuard;
use super::window::{FramesmithApp, ModelStatus};

/// Applies one job result to the app.
pub(super) fn handle(app: &mut FramesmithApp, result: JobResult) {
    match result {
        JobResult::ModelInspected { role, path, result } => {
            // A newer file may have been picked for the slot meanwhile.
            if app.models.get(&role).map(|(p, _)| p) == Some(&path) {
                let status = match result {
                    Ok(summary) => ModelStatus::Ready(summary),
                    Err(err) => ModelStatus::Error(err),
                };
                app.models.insert(role, (path, status));
            }
        }
        JobResult::DatasetScanned { generation, result } => {
            app.dataset.finish_scan(generation, result)
        }
        JobResult::Validated { generation, issues } => {
            if app.validating == Some(generation) {
                app.validating = None;
            }
            app.editor.set_issues(generation, issues);
        }
        JobResult::Planned { generation, result } => app.fit.finish(generation, result),
        JobResult::SystemChecked(result) => app.system_check.finish(result),
        JobResult::OutputFolderRead { dir, runs, next } => {
            app.output_folder.finish(dir, runs, next)
        }
        JobResult::Picked { purpose, paths } => picked(app, purpose, paths),
        JobResult::ConfigLoaded { path, result } => match result {
            Ok(config) => {
                app.editor.replace(*config);
                app.generate.reset();
                app.inspect_all_models();
                app.run
                    .note(LogLevel::Info, format!("Loaded {}", path.display()));
            }
            Err(err) => app
                .run
                .note(LogLevel::Error, format!("{err}: {}", path.display())),
        },
        JobResult::DatasetRead { path, result } => {
            match result.and_then(|text| app.dataset.import(&text)) {
                Ok(()) => {
                    app.run.note(
                        LogLevel::Info,
                        format!("Imported the dataset config {}", path.display()),
                    );
                    app.scan_dataset();
                }
                Err(err) => app
                    .run
                    .note(LogLevel::Error, format!("{err}: {}", path.display())),
            }
        }
        JobResult::Saved { what, result } => match result {
            Ok(path) => app.run.note(
                LogLevel::Info,
                format!("Saved the {what} to {}", path.display()),
            ),
            Err(err) => app.run.note(LogLevel::Error, err),
        },
        JobResult::RunPrepared(result) => run_prepared(app, result),
        JobResult::SampleThumbnail { frames, thumbnail } => {
            app.samples.take_thumbnail(frames, thumbnail);
        }
        JobResult::GenerateDefaults(settings) => {
            app.generate.take_defaults(*settings);
            super::generate_panel::start_queued(&mut super::generate_panel::GenerateContext {
                view: &mut app.generate,
                backend: &app.backend,
                jobs: &mut app.jobs,
                config: app.editor.config(),
            });
        }
        JobResult::LoraToolDone { label, result } => lora_tool_done(app, label, result),
        JobResult::MergeBaseChosen(Some(base)) => app.lora_tools.choose_base(base),
        JobResult::MergeBaseChosen(None) => {}
        JobResult::Generated { result, log } => generated(app, result, log),
    }
}

/// A generation of the generate panel ended: its clip opened in the player, a failure in the log too.
fn generated(
    app: &mut FramesmithApp,
    result: Result<super::backend::GeneratedClip, String>,
    log: Vec<String>,
) {
    if let Err(err) = &result {
        app.run
            .note(LogLevel::Error, format!("Generating failed: {err}"));
    }
    app.generate.finished(result, log, &mut app.samples.player);
}

/// A LoRA tool ended: its outcome in the panel, and a failure in the log too.
fn lora_tool_done(
    app: &mut FramesmithApp,
    label: String,
    result: Result<super::backend::LoraReport, String>,
) {
    if let Err(err) = &result {
        app.run
            .note(LogLevel::Error, format!("{label} failed: {err}"));
    }
    app.lora_tools.finish(label, result);
}

fn run_prepared(app: &mut FramesmithApp, result: Result<Box<StartRun>, String>) {
    app.preparing = false;
    match result {
        Ok(start) => {
            let guard = SpillGuard::for_run(start.config.memory.shared_memory_guard);
            if app.send_run(start) {
                app.spill_guard = guard;
                app.run.note(LogLevel::Info, "Run sent to the engine");
            }
        }
        Err(message) => app.apply_event(Event::Failed { message }),
    }
}

fn picked(app: &mut FramesmithApp, purpose: PickPurpose, paths: Vec<PathBuf>) {
    let Some(first) = paths.first().cloned() else {
        return;
    };
    match purpose {
        PickPurpose::Model(role) => app.set_model(role, first),
        PickPurpose::DatasetFolders => app.add_dataset_folders(&paths),
        PickPurpose::ConfigPath(key) => {
            app.editor.set(
                &key,
                Some(toml::Value::String(first.to_string_lossy().into_owned())),
            );
        }
        PickPurpose::DatasetPath(index, key) => {
            if let Some(entry) = app.dataset.entry_mut(index) {
                entry.insert(
                    key,
                    toml::Value::String(first.to_string_lossy().into_owned()),
                );
                app.dataset.drafts.clear();
                app.scan_dataset();
            }
        }
        PickPurpose::LoadConfig => app.load_config_file(first),
        PickPurpose::SaveConfig => {
            let text = app.editor.to_toml();
            app.jobs
                .spawn("save config", move || write_text("run config", first, text));
        }
        PickPurpose::ImportDataset => {
            app.jobs
                .spawn("import dataset", move || JobResult::DatasetRead {
                    result: std::fs::read_to_string(&first)
                        .map_err(|err| format!("cannot read the file: {err}")),
                    path: first,
                });
        }
        PickPurpose::ExportDataset => {
            let text = app.dataset.to_toml();
            app.jobs.spawn("export dataset", move || {
                write_text("dataset config", first, text)
            });
        }
        PickPurpose::ResumeState => app.start(Some(first)),
        PickPurpose::LoraFile => app.lora_tools.choose_file(first),
        // Chosen through `lora_panel`'s own job, which reads the file's size too.
        PickPurpose::MergeBase => app.lora_tools.choose_base(super::lora_tools::MergeBase {
            bytes: None,
            path: first,
        }),
    }
}

fn write_text(what: &'static str, path: PathBuf, text: Result<String, String>) -> JobResult {
    let result = text.and_then(|text| {
        std::fs::write(&path, text)
            .map(|()| path.clone())
            .map_err(|err| format!("cannot save the {what}: {err}: {}", path.display()))
    });
    JobResult::Saved { what, result }
}

/// Reads a dropped or picked TOML: a `[[datasets]]` file is a dataset config, anything else a run config.
pub(super) fn read_toml_file(path: PathBuf) -> JobResult {
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => {
            return JobResult::ConfigLoaded {
                result: Err(format!("cannot read the file: {err}")),
                path,
            }
        }
    };
    let is_dataset = toml::from_str::<toml::Table>(&text).is_ok_and(|t| t.contains_key("datasets"));
    if is_dataset {
        JobResult::DatasetRead {
            path,
            result: Ok(text),
        }
    } else {
        JobResult::ConfigLoaded {
            result: parse_config(&text).map(Box::new),
            path,
        }
    }
}

/// Writes the run's dataset TOML (when it was built in the Project tab) beside its outputs and points the config
/// at it. Runs on a job thread.
pub(super) fn prepare_run(
    run: QueuedRun,
    resume_from: Option<PathBuf>,
) -> Result<Box<StartRun>, String> {
    let mut config = run.config;
    if let Some(text) = run.dataset_toml {
        let dir = &config.output.output_dir;
        std::fs::create_dir_all(dir)
            .map_err(|err| format!("cannot create the output folder: {err}: {}", dir.display()))?;
        let path = dir.join(format!("{}_dataset.toml", config.output.output_name));
        std::fs::write(&path, text)
            .map_err(|err| format!("cannot write the dataset config: {err}: {}", path.display()))?;
        config.dataset.config = path;
    }
    Ok(Box::new(StartRun {
        config,
        resume_from,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use framesmith_config::RunConfig;

    #[test]
    fn prepare_run_writes_the_dataset_toml_and_points_the_config_at_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RunConfig::default();
        config.output.output_dir = dir.path().join("out");
        config.output.output_name = "cat".into();
        let run = QueuedRun {
            name: "cat".into(),
            config: config.clone(),
            dataset_toml: Some("[[datasets]]\nimage_directory = \"/d\"\n".into()),
            gpus: Vec::new(),
        };
        let start = prepare_run(run, None).unwrap();
        let written = dir.path().join("out").join("cat_dataset.toml");
        assert_eq!(start.config.dataset.config, written);
        assert!(std::fs::read_to_string(written)
            .unwrap()
            .contains("image_directory"));
        let plain = prepare_run(
            QueuedRun {
                name: "x".into(),
                config: config.clone(),
                dataset_toml: None,
                gpus: Vec::new(),
            },
            Some(PathBuf::from("/state")),
        )
        .unwrap();
        assert_eq!(plain.config, config);
        assert_eq!(plain.resume_from, Some(PathBuf::from("/state")));
    }

    #[test]
    fn toml_files_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let dataset = dir.path().join("d.toml");
        std::fs::write(&dataset, "[[datasets]]\nimage_directory = \"/d\"\n").unwrap();
        assert!(matches!(
            read_toml_file(dataset),
            JobResult::DatasetRead { result: Ok(_), .. }
        ));
        let run = dir.path().join("r.toml");
        std::fs::write(&run, "[lora]\nrank = 4\n").unwrap();
        match read_toml_file(run) {
            JobResult::ConfigLoaded {
                result: Ok(config), ..
            } => assert_eq!(config.lora.rank, 4),
            other => panic!("{other:?}"),
        }
    }
}
