//! `FramesmithApp`: the eframe app. `logic` drains jobs, engine events and dropped files (no drawing); `ui` lays
//! out the tabs. Actions that may block are handed to `Jobs`.

mod engine;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use framesmith_config::protocol::{Command, EngineHandle, Event, LogLevel};
use framesmith_config::RunConfig;
use framesmith_telemetry::{detect_spill, SpillWarning, Telemetry, TelemetryOptions};

use super::backend::{Backend, ModelRole, PresetView};
use super::config_editor::{parse_config, ConfigEditor};
use super::dataset_config::DatasetEditor;
use super::fit_panel::FitView;
use super::jobs::{JobMode, JobResult, Jobs};
use super::queue::{QueuedRun, RunQueue};
use super::run_view::RunView;
use super::samples_panel::SamplesState;
use super::screenshot::ScreenshotState;
use super::settings::{SavedRun, Settings, Tab};
use super::spill_guard::SpillGuard;
use super::system_check_panel::SystemCheckView;
use super::{tabs_ui, theme, AppOptions, TelemetrySource};

/// How often the UI polls the engine while a run is active (the engine cannot wake the UI itself).
const RUN_POLL: Duration = Duration::from_millis(100);
/// How often the Monitor tab redraws.
const MONITOR_POLL: Duration = Duration::from_millis(250);

/// A model slot's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelStatus {
    Inspecting,
    Ready(String),
    Error(String),
}

/// The Framesmith desktop app.
pub struct FramesmithApp {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) settings: Settings,
    pub(super) editor: ConfigEditor,
    pub(super) dataset: DatasetEditor,
    pub(super) models: BTreeMap<ModelRole, (PathBuf, ModelStatus)>,
    pub(super) run: RunView,
    /// Name of the run in progress (the output name or the queued run's name).
    pub(super) run_name: Option<String>,
    pub(super) queue: RunQueue,
    pub(super) presets: Vec<PresetView>,
    pub(super) engine: Option<EngineHandle>,
    /// The GPUs the engine was started for (`Backend::spawn_engine`).
    engine_gpus: Vec<usize>,
    /// The GPUs of the run being prepared.
    run_gpus: Vec<usize>,
    pub(super) jobs: Jobs,
    pub(super) telemetry: Option<Telemetry>,
    pub(super) spill: Option<SpillWarning>,
    /// Pauses the run in progress when it starts spilling (`memory.shared_memory_guard`).
    pub(super) spill_guard: SpillGuard,
    pub(super) samples: SamplesState,
    /// The Samples tab's "Try the LoRA" panel.
    pub(super) generate: super::generate_panel::GenerateView,
    /// The Samples tab's LoRA tools.
    pub(super) lora_tools: super::lora_tools::LoraToolsView,
    pub(super) dataset_thumbnails: std::collections::HashMap<PathBuf, egui::TextureHandle>,
    /// A run is being prepared (its dataset TOML written) and will start when the job reports.
    pub(super) preparing: bool,
    pub(super) validating: Option<u64>,
    /// The "Will it fit?" plan of the edited config.
    pub(super) fit: FitView,
    /// The Monitor tab's system check.
    pub(super) system_check: SystemCheckView,
    pub(super) screenshot: Option<ScreenshotState>,
    /// What the configured output folder holds (shown before Start).
    pub(super) output_folder: super::output_folder::OutputFolderView,
    /// Closing the window during a run (asked, then waiting for the save).
    pub(super) closing: super::close_guard::Closing,
    persistence: bool,
}

impl FramesmithApp {
    /// Builds the app; `cc.storage` supplies the last session's settings.
    pub fn new(cc: &eframe::CreationContext<'_>, options: AppOptions) -> Self {
        theme::apply(&cc.egui_ctx);
        let settings = if options.persistence {
            Settings::load(cc.storage)
        } else {
            Settings::default()
        };
        let backend = options.backend;
        let mut run = RunView::default();
        let config = match settings.config_toml.as_deref().map(parse_config) {
            Some(Ok(config)) => config,
            Some(Err(err)) => {
                run.note(
                    LogLevel::Warn,
                    format!(
                        "The saved config could not be read, so the demo project opened: {err}"
                    ),
                );
                backend.demo_project()
            }
            None => backend.demo_project(),
        };
        let repaint = (options.jobs == JobMode::Background).then(|| cc.egui_ctx.clone());
        let telemetry = match options.telemetry {
            TelemetrySource::Off => None,
            TelemetrySource::Live => spawn_telemetry(&mut run),
            TelemetrySource::Fixed(history) => Some(Telemetry::fixed(history)),
        };
        let mut app = Self {
            presets: backend.presets(),
            dataset: DatasetEditor::from_toml(&settings.dataset_toml),
            queue: restore_queue(&settings.queue),
            editor: ConfigEditor::new(config),
            models: BTreeMap::new(),
            run,
            run_name: None,
            engine: None,
            engine_gpus: Vec::new(),
            run_gpus: Vec::new(),
            jobs: Jobs::new(options.jobs, repaint.clone()),
            telemetry,
            spill: None,
            spill_guard: SpillGuard::default(),
            samples: SamplesState::new(options.jobs, repaint),
            generate: Default::default(),
            lora_tools: Default::default(),
            dataset_thumbnails: std::collections::HashMap::new(),
            preparing: false,
            validating: None,
            fit: FitView::default(),
            system_check: SystemCheckView::default(),
            screenshot: options.screenshot.map(ScreenshotState::new),
            closing: Default::default(),
            output_folder: Default::default(),
            persistence: options.persistence,
            backend,
            settings,
        };
        app.samples.player.set_muted(app.settings.sound_muted);
        if let Some(path) = options.project {
            app.load_config_file(path);
        }
        app.inspect_all_models();
        if !app.dataset.is_empty() {
            app.scan_dataset();
        }
        if app.screenshot.is_some() {
            super::screenshot::stage(&mut app);
        }
        app
    }

    /// The run as the UI shows it.
    pub fn run_view(&self) -> &RunView {
        &self.run
    }

    /// The config a Start would send.
    pub fn config(&self) -> &RunConfig {
        self.editor.config()
    }

    /// The "Will it fit?" plan of the edited config, once one has arrived.
    pub fn memory_plan(&self) -> Option<&framesmith_config::protocol::memory::PlanReport> {
        self.fit.report()
    }

    /// The Monitor tab's system check, once one has arrived.
    pub fn system_report(&self) -> Option<&framesmith_config::protocol::doctor::SystemReport> {
        self.system_check.report()
    }

    /// The frame now shown by the sample player.
    pub fn shown_sample_frame(&self) -> Option<usize> {
        self.samples.player.shown_frame()
    }

    /// The spilling warning, when the driver spills.
    pub fn spill_warning(&self) -> Option<&SpillWarning> {
        self.spill.as_ref()
    }

    /// Folds an event in as if the engine sent it (the screenshot's staged run uses this).
    pub fn apply_event(&mut self, event: Event) {
        if let Some(end) = self.run.apply(event) {
            self.run_ended(end);
        }
    }

    // ---- jobs ----

    pub(super) fn set_model(&mut self, role: ModelRole, path: PathBuf) {
        self.editor.set(
            role.config_key(),
            Some(toml::Value::String(path.to_string_lossy().into_owned())),
        );
        self.inspect_model(role, path);
    }

    pub(super) fn inspect_all_models(&mut self) {
        let config = self.editor.config().clone();
        for (role, path) in [
            (ModelRole::Dit, config.model.dit),
            (ModelRole::Vae, config.model.vae),
            (ModelRole::TextEncoder, config.model.text_encoder),
        ] {
            if !path.as_os_str().is_empty() {
                self.inspect_model(role, path);
            }
        }
    }

    fn inspect_model(&mut self, role: ModelRole, path: PathBuf) {
        self.models
            .insert(role, (path.clone(), ModelStatus::Inspecting));
        let backend = Arc::clone(&self.backend);
        self.jobs
            .spawn("inspect model", move || JobResult::ModelInspected {
                result: backend.inspect_model(role, &path),
                role,
                path,
            });
    }

    pub(super) fn add_dataset_folders(&mut self, folders: &[PathBuf]) {
        self.dataset.add_folders(folders);
        self.scan_dataset();
    }

    pub(super) fn scan_dataset(&mut self) {
        super::dataset_panel::scan_dataset(&mut self.dataset, &self.backend, &mut self.jobs);
    }

    pub(super) fn load_config_file(&mut self, path: PathBuf) {
        self.jobs
            .spawn("load config", move || super::handlers::read_toml_file(path));
    }

    fn validate_if_stale(&mut self) {
        let Some(generation) = self.editor.needs_validation() else {
            return;
        };
        if self.validating == Some(generation) {
            return;
        }
        self.validating = Some(generation);
        let backend = Arc::clone(&self.backend);
        let config = self.editor.config().clone();
        self.jobs.spawn("validate", move || JobResult::Validated {
            issues: backend.validate(&config),
            generation,
        });
    }

    /// Re-plans "Will it fit?" when the config or the Project tab's dataset changed, while the Train tab shows it.
    fn plan_if_stale(&mut self) {
        if self.settings.tab != Tab::Train || !self.run.can_start() {
            return;
        }
        let dataset_toml = self.dataset_toml_for(self.editor.config());
        let Some(request) = self
            .fit
            .needs_plan(self.editor.generation(), dataset_toml.as_deref())
        else {
            return;
        };
        let config = self.editor.config().clone();
        let backend = Arc::clone(&self.backend);
        self.jobs.spawn("plan memory", move || JobResult::Planned {
            result: backend
                .plan_memory(&config, dataset_toml.as_deref())
                .map(Box::new),
            generation: request,
        });
    }

    /// Runs the system check when the Monitor tab first shows it, and again when asked.
    fn check_system_if_wanted(&mut self) {
        if self.settings.tab != Tab::Monitor || !self.system_check.needs_check() {
            return;
        }
        let output_dir = self.editor.config().output.output_dir.clone();
        let backend = Arc::clone(&self.backend);
        self.jobs.spawn("system check", move || {
            JobResult::SystemChecked(backend.system_check(&output_dir).map(Box::new))
        });
    }

    fn read_output_folder_if_stale(&mut self) {
        if self.settings.tab != Tab::Train || !self.run.can_start() {
            return;
        }
        let dir = self.editor.config().output.output_dir.clone();
        if let Some(dir) = self.output_folder.needs_read(&dir) {
            self.jobs.spawn("read output folder", move || {
                let runs = framesmith_config::outputs::runs_in(&dir);
                let next = framesmith_config::outputs::new_run_dir(&dir);
                JobResult::OutputFolderRead { dir, runs, next }
            });
        }
    }

    fn take_dropped_files(&mut self, ctx: &egui::Context) {
        let paths: Vec<PathBuf> = ctx.input(|i| {
            i.raw
                .dropped_files
                .iter()
                .map(|f| f.path().to_path_buf())
                .collect()
        });
        if paths.is_empty() {
            return;
        }
        let (folders, files): (Vec<PathBuf>, Vec<PathBuf>) =
            paths.into_iter().partition(|p| p.is_dir());
        if !folders.is_empty() {
            self.add_dataset_folders(&folders);
            self.settings.tab = Tab::Project;
        }
        for file in files {
            self.take_dropped_file(file);
        }
    }

    fn take_dropped_file(&mut self, file: PathBuf) {
        let ext = file
            .extension()
            .map(|e| e.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        match ext.as_str() {
            "safetensors" | "pth" | "pt" | "bin" | "gguf" | "ckpt" => {
                self.set_model(ModelRole::guess(&file), file);
                self.settings.tab = Tab::Project;
            }
            "toml" => self.load_config_file(file),
            _ => self.run.note(
                LogLevel::Warn,
                format!(
                    "Framesmith does not know what to do with {}: drop a dataset folder, a model file \
                     (.safetensors, .pth) or a run config (.toml)",
                    file.display()
                ),
            ),
        }
    }

    fn schedule_repaint(&self, ctx: &egui::Context) {
        if self.run.is_active() || self.preparing {
            ctx.request_repaint_after(RUN_POLL);
        }
        if self.settings.tab == Tab::Monitor && self.telemetry.is_some() {
            ctx.request_repaint_after(MONITOR_POLL);
        }
    }

    fn save_settings(&mut self) {
        self.settings.config_toml = self.editor.to_toml().ok();
        self.settings.dataset_toml = self.dataset.to_toml().unwrap_or_default();
        self.settings.sound_muted = self.samples.player.muted();
        self.settings.queue = self
            .queue
            .iter()
            .filter_map(|run| {
                Some(SavedRun {
                    name: run.name.clone(),
                    config_toml: toml::to_string(&run.config).ok()?,
                    dataset_toml: run.dataset_toml.clone(),
                    gpus: run.gpus.clone(),
                })
            })
            .collect();
    }
}

fn spawn_telemetry(run: &mut RunView) -> Option<Telemetry> {
    match Telemetry::spawn(TelemetryOptions::default()) {
        Ok(telemetry) => Some(telemetry),
        Err(err) => {
            run.note(LogLevel::Warn, format!("Telemetry could not start: {err}"));
            None
        }
    }
}

fn restore_queue(saved: &[SavedRun]) -> RunQueue {
    let mut queue = RunQueue::default();
    for run in saved {
        if let Ok(config) = parse_config(&run.config_toml) {
            queue.push(QueuedRun {
                name: run.name.clone(),
                config,
                dataset_toml: run.dataset_toml.clone(),
                gpus: run.gpus.clone(),
            });
        }
    }
    queue
}

/// Starts the run from any tab, as the Train tab's Start button does.
pub(super) const START_SHORTCUT: egui::KeyboardShortcut =
    egui::KeyboardShortcut::new(egui::Modifiers::COMMAND, egui::Key::Enter);

impl FramesmithApp {
    /// Ctrl+Enter (Cmd+Enter on macOS) starts the edited run when Start could.
    fn start_on_shortcut(&mut self, ctx: &egui::Context) {
        if self.run.can_start()
            && !self.preparing
            && ctx.input_mut(|i| i.consume_shortcut(&START_SHORTCUT))
        {
            self.start(None);
        }
    }
}

impl eframe::App for FramesmithApp {
    fn logic(&mut self, ctx: &egui::Context, _frame: &mut eframe::Frame) {
        for result in self.jobs.drain() {
            super::handlers::handle(self, result);
        }
        self.drain_engine();
        self.validate_if_stale();
        self.plan_if_stale();
        self.check_system_if_wanted();
        self.read_output_folder_if_stale();
        self.take_dropped_files(ctx);
        self.start_on_shortcut(ctx);
        if let Some(telemetry) = &self.telemetry {
            // The run's rank processes (a run over several GPUs) count as the run's memory.
            telemetry.count_processes(&self.run.processes);
            telemetry.set_budget_holds(&self.run.budget_holds());
            let steps = self.run.step_secs();
            self.spill = telemetry.read(|history| detect_spill(history, &steps));
        }
        self.guard_against_spilling();
        // Only a run of the engine's has anything to save (a screenshot's staged run has no engine).
        let engine_run = self.engine.is_some() && self.run.is_active();
        self.closing.logic(ctx, engine_run);
        if self.settings.tab != Tab::Samples {
            // A clip plays only while its tab shows it: its sound would otherwise go on behind the other tabs.
            self.samples.player.pause();
        }
        self.samples.player.logic(ctx);
        super::screenshot::logic(self, ctx);
        self.schedule_repaint(ctx);
    }

    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        tabs_ui(self, ui);
        if let Some(choice) = super::close_guard::close_dialog_ui(ui, self.closing) {
            if self.closing.answer(choice) {
                self.send(Command::Stop);
            }
        }
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        if self.persistence {
            self.save_settings();
            self.settings.save(storage);
        }
    }

    fn on_exit(&mut self) {
        // The sample player's ffplay, if one plays, ends with the window.
        self.samples.player.stop_sound();
        // Reached during a run only when the window is torn down without a close request (the session ends):
        // the engine is asked to stop, and dropping the handle tells it so too.
        if self.run.is_active() {
            let _ = self
                .engine
                .as_ref()
                .map(|e| e.commands.try_send(Command::Stop));
        }
    }
}
