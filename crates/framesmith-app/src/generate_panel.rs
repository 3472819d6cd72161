//! "Try the LoRA", on the Samples tab: a finished run's LoRA (or any LoRA file) on the project's models with a
//! prompt, seed, steps, size, frames and strength; generated on a job thread through `Backend::generate`, with its
//! progress and a Cancel button, the result opened in the sample player. A prompt can be queued to generate as soon
//! as the project's defaults arrive (the screenshot of a generated clip).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use egui::{RichText, Ui};
use framesmith_config::RunConfig;

use super::backend::{Backend, GenerateSettings, GenerateUpdate, GeneratedClip};
use super::jobs::{JobResult, Jobs};
use super::player::Player;
use super::theme;

/// How often the panel redraws while a generation runs (its progress counters cannot wake the UI).
const PROGRESS_POLL: Duration = Duration::from_millis(100);

/// The generation in progress: its cancel flag and how far it has got.
struct Running {
    cancel: Arc<AtomicBool>,
    step: Arc<AtomicUsize>,
    steps: Arc<AtomicUsize>,
}

/// The panel's state.
#[derive(Default)]
pub struct GenerateView {
    /// The form; `None` until the project's defaults arrive.
    settings: Option<GenerateSettings>,
    lora_text: String,
    image_text: String,
    asked_defaults: bool,
    running: Option<Running>,
    outcome: Option<Result<GeneratedClip, String>>,
    log: Vec<String>,
    /// A prompt to generate with the project's defaults once they arrive.
    queued: Option<String>,
}

impl GenerateView {
    /// The project's defaults arrived (`Backend::generate_defaults`).
    pub fn take_defaults(&mut self, settings: GenerateSettings) {
        self.lora_text = settings.lora.display().to_string();
        self.image_text = settings
            .image
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        self.settings = Some(settings);
    }

    /// Generates `prompt` with the project's defaults as soon as they arrive ([`start_queued`]).
    pub fn queue(&mut self, prompt: String) {
        self.queued = Some(prompt);
    }

    /// How the last generation ended; `None` while one runs, or before the first.
    pub fn ended(&self) -> Option<Result<&GeneratedClip, String>> {
        if self.running.is_some() {
            return None;
        }
        self.outcome
            .as_ref()
            .map(|outcome| outcome.as_ref().map_err(Clone::clone))
    }

    /// A generation ended: its result, opened in `player` when there is one, and its log.
    pub fn finished(
        &mut self,
        result: Result<GeneratedClip, String>,
        log: Vec<String>,
        player: &mut Player,
    ) {
        self.running = None;
        if let Ok(clip) = &result {
            player.open(&clip.frames, &clip.file);
        }
        self.outcome = Some(result);
        self.log = log;
    }

    /// The settings the form holds now (the path fields parsed).
    pub fn settings(&self) -> Option<GenerateSettings> {
        let mut settings = self.settings.clone()?;
        settings.lora = PathBuf::from(self.lora_text.trim());
        let image = self.image_text.trim();
        settings.image = (!image.is_empty()).then(|| PathBuf::from(image));
        Some(settings)
    }

    /// Forgets the form, so the next project's defaults are read again.
    pub fn reset(&mut self) {
        if self.running.is_none() {
            *self = Self::default();
        }
    }
}

/// What the panel reads and starts jobs with.
pub struct GenerateContext<'a> {
    pub view: &'a mut GenerateView,
    pub backend: &'a Arc<dyn Backend>,
    pub jobs: &'a mut Jobs,
    pub config: &'a RunConfig,
}

/// Draws the panel.
pub fn generate_ui(ctx: &mut GenerateContext, ui: &mut Ui) {
    ui.heading("Try the LoRA");
    if ctx.view.settings.is_none() {
        if !ctx.view.asked_defaults {
            ctx.view.asked_defaults = true;
            let (backend, config) = (ctx.backend.clone(), ctx.config.clone());
            ctx.jobs.spawn("generate defaults", move || {
                JobResult::GenerateDefaults(Box::new(backend.generate_defaults(&config)))
            });
        }
        ui.label(RichText::new("Reading the run's settings…").color(theme::MUTED));
        return;
    }
    form_ui(ctx.view, ui);
    ui.horizontal(|ui| {
        let ready = !ctx.view.lora_text.trim().is_empty()
            && ctx
                .view
                .settings
                .as_ref()
                .is_some_and(|s| !s.prompt.trim().is_empty());
        if ctx.view.running.is_none() {
            if ui
                .add_enabled(ready, egui::Button::new("Generate"))
                .clicked()
            {
                start(ctx);
            }
        } else if ui.button("Cancel").clicked() {
            if let Some(running) = &ctx.view.running {
                running.cancel.store(true, Ordering::SeqCst);
            }
        }
        status_ui(ctx.view, ui);
    });
    for line in ctx.view.log.iter().rev().take(3).rev() {
        ui.label(RichText::new(line).small().color(theme::MUTED));
    }
}

/// The form's fields.
fn form_ui(view: &mut GenerateView, ui: &mut Ui) {
    let running = view.running.is_some();
    let Some(s) = view.settings.as_mut() else {
        return;
    };
    ui.add_enabled_ui(!running, |ui| {
        egui::Grid::new("generate form")
            .num_columns(2)
            .show(ui, |ui| {
                ui.label("LoRA file");
                ui.text_edit_singleline(&mut view.lora_text);
                ui.end_row();
                ui.label("Strength");
                ui.add(
                    egui::DragValue::new(&mut s.strength)
                        .speed(0.05)
                        .range(-4.0..=4.0),
                );
                ui.end_row();
                ui.label("Prompt");
                ui.text_edit_singleline(&mut s.prompt);
                ui.end_row();
                ui.label("Start image");
                ui.text_edit_singleline(&mut view.image_text);
                ui.end_row();
                ui.label("Seed");
                ui.add(egui::DragValue::new(&mut s.seed));
                ui.end_row();
                ui.label("Steps");
                ui.add(egui::DragValue::new(&mut s.steps).range(1..=200));
                ui.end_row();
                ui.label("Size");
                ui.horizontal(|ui| {
                    ui.add(
                        egui::DragValue::new(&mut s.width)
                            .range(16..=4096)
                            .speed(16),
                    );
                    ui.label("×");
                    ui.add(
                        egui::DragValue::new(&mut s.height)
                            .range(16..=4096)
                            .speed(16),
                    );
                });
                ui.end_row();
                ui.label("Frames");
                ui.add(egui::DragValue::new(&mut s.frames).range(1..=257));
                ui.end_row();
            });
    });
}

/// The progress of the generation running, or how the last one ended.
fn status_ui(view: &GenerateView, ui: &mut Ui) {
    if let Some(running) = &view.running {
        let (step, steps) = (
            running.step.load(Ordering::SeqCst),
            running.steps.load(Ordering::SeqCst),
        );
        let fraction = step as f32 / steps.max(1) as f32;
        ui.add(
            egui::ProgressBar::new(fraction)
                .desired_width(200.0)
                .text(format!("step {step}/{steps}")),
        );
        ui.ctx().request_repaint_after(PROGRESS_POLL);
        return;
    }
    match &view.outcome {
        Some(Ok(clip)) => {
            ui.label(format!("Wrote {}", clip.file.display()));
        }
        Some(Err(err)) => {
            ui.colored_label(theme::ERROR, err);
        }
        None => {}
    }
}

/// Starts the queued prompt's generation ([`GenerateView::queue`]) once the form has the project's defaults.
pub fn start_queued(ctx: &mut GenerateContext) {
    if ctx.view.settings.is_none() || ctx.view.running.is_some() {
        return;
    }
    let Some(prompt) = ctx.view.queued.take() else {
        return;
    };
    if let Some(settings) = ctx.view.settings.as_mut() {
        settings.prompt = prompt;
    }
    start(ctx);
}

/// Starts the generation of the form's settings on a job thread.
fn start(ctx: &mut GenerateContext) {
    let Some(mut settings) = ctx.view.settings() else {
        return;
    };
    settings.out = settings
        .out
        .with_file_name(format!("try-seed{}", settings.seed));
    let running = Running {
        cancel: Arc::new(AtomicBool::new(false)),
        step: Arc::new(AtomicUsize::new(0)),
        steps: Arc::new(AtomicUsize::new(settings.steps)),
    };
    let (cancel, step, steps) = (
        running.cancel.clone(),
        running.step.clone(),
        running.steps.clone(),
    );
    ctx.view.running = Some(running);
    ctx.view.outcome = None;
    let (backend, config) = (ctx.backend.clone(), ctx.config.clone());
    ctx.jobs.spawn("generate", move || {
        let mut log = Vec::new();
        let mut updates = |update| match update {
            GenerateUpdate::Step {
                step: at,
                steps: of,
            } => {
                step.store(at, Ordering::SeqCst);
                steps.store(of, Ordering::SeqCst);
            }
            GenerateUpdate::Log(line) => log.push(line),
        };
        let result = backend.generate(&config, &settings, &mut updates, &|| {
            cancel.load(Ordering::SeqCst)
        });
        JobResult::Generated { result, log }
    });
}
