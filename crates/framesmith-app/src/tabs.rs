//! The window's layout: the tab bar with a one-line run status, and the current tab in a scroll area.

use egui::{RichText, Ui};

use super::config_panel::{config_ui, ConfigContext};
use super::generate_panel::{generate_ui, GenerateContext};
use super::gpu_panel::{seen_gpus, GpuPicker};
use super::lora_panel::{lora_tools_ui, LoraToolsContext};
use super::monitor_panel::monitor_ui;
use super::project_panel::{project_ui, ProjectContext};
use super::run_view::{state_name, RunView};
use super::samples_panel::samples_ui;
use super::settings::Tab;
use super::theme;
use super::train_panel::{train_ui, TrainContext};
use super::window::FramesmithApp;

/// Draws the whole window.
pub(super) fn tabs_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    egui::Panel::top("tabs").show(ui, |ui| {
        ui.horizontal(|ui| {
            ui.heading("Framesmith");
            ui.separator();
            for tab in Tab::ALL {
                ui.selectable_value(&mut app.settings.tab, tab, tab.label());
            }
            ui.separator();
            status_ui(&app.run, app.spill.is_some(), ui);
        });
    });
    egui::CentralPanel::default().show(ui, |ui| {
        if ui.ctx().input(|i| !i.raw.hovered_files.is_empty()) {
            ui.label(
                RichText::new(
                    "Drop folders for the dataset, model files for the models, or a config TOML",
                )
                .color(theme::ACCENT)
                .strong(),
            );
        }
        let tab = app.settings.tab;
        egui::ScrollArea::vertical()
            .id_salt(tab.label())
            .auto_shrink(false)
            .show(ui, |ui| tab_ui(app, tab, ui));
    });
}

/// Draws one tab's contents.
fn tab_ui(app: &mut FramesmithApp, tab: Tab, ui: &mut Ui) {
    match tab {
        Tab::Project => project_ui(
            &mut ProjectContext {
                editor: &mut app.editor,
                models: &app.models,
                dataset: &mut app.dataset,
                dataset_thumbnails: &mut app.dataset_thumbnails,
                backend: &app.backend,
                jobs: &mut app.jobs,
            },
            ui,
        ),
        Tab::Config => config_ui(
            &mut ConfigContext {
                editor: &mut app.editor,
                presets: &app.presets,
                backend: app.backend.as_ref(),
                jobs: &mut app.jobs,
                run: &mut app.run,
            },
            ui,
        ),
        Tab::Train => train_tab_ui(app, ui),
        Tab::Monitor => monitor_ui(
            ui,
            &mut app.system_check,
            app.telemetry.as_ref(),
            app.spill.as_ref(),
        ),
        Tab::Samples => {
            generate_ui(
                &mut GenerateContext {
                    view: &mut app.generate,
                    backend: &app.backend,
                    jobs: &mut app.jobs,
                    config: app.editor.config(),
                },
                ui,
            );
            ui.separator();
            lora_tools_ui(
                &mut LoraToolsContext {
                    view: &mut app.lora_tools,
                    backend: &app.backend,
                    jobs: &mut app.jobs,
                },
                ui,
            );
            ui.separator();
            samples_ui(&mut app.samples, &app.run.samples, ui);
        }
    }
}

/// The Train tab, and the run it asks for.
fn train_tab_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    let (seen, status) = seen_gpus(app.telemetry.as_ref());
    let request = train_ui(
        &mut TrainContext {
            run: &mut app.run,
            run_name: app.run_name.as_deref(),
            preparing: app.preparing,
            fit: &app.fit,
            output_folder: &app.output_folder,
            spill: app.spill.as_ref(),
            editor: &app.editor,
            smoothed_only: &mut app.settings.smoothed_only,
            gpus: GpuPicker {
                seen: &seen,
                status,
            },
            chosen_gpus: &mut app.settings.gpus,
            queue: &mut app.queue,
            jobs: &mut app.jobs,
        },
        ui,
    );
    if let Some(request) = request {
        app.train_request(request);
    }
}

/// "training · 42%" beside the tabs, so the run is visible from every tab; `spilling` adds the shared-memory
/// warning.
fn status_ui(run: &RunView, spilling: bool, ui: &mut Ui) {
    let mut text = state_name(run.state).to_owned();
    if run.progress.is_some() {
        text += &format!(" · {:.0}%", run.fraction_done() * 100.0);
    }
    let color = if run.failure.is_some() {
        theme::ERROR
    } else {
        theme::MUTED
    };
    ui.label(RichText::new(text).color(color));
    if spilling {
        ui.label(RichText::new("spilling into shared memory").color(theme::WARNING));
    }
}
