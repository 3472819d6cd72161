//! The Project tab: the model files (picked or dropped, each inspected in the background) and the dataset.

use egui::{RichText, Ui};

use super::backend::ModelRole;
use super::dataset_panel::dataset_ui;
use super::jobs::PickPurpose;
use super::theme;
use super::window::{FramesmithApp, ModelStatus};

/// Draws the Project tab.
pub(super) fn project_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    ui.heading("Models");
    let mut demo = app.editor.config().model.demo;
    let toggle = ui
        .checkbox(&mut demo, "Demo model")
        .on_hover_text("Train the built-in tiny model on synthetic clips: no downloads, no GPU");
    if toggle.changed() {
        app.editor
            .set("model.demo", Some(toml::Value::Boolean(demo)));
    }
    if demo {
        ui.label(
            RichText::new("The demo model needs no files; the ones below are used when it is off")
                .color(theme::MUTED),
        );
    }
    egui::Grid::new("models")
        .num_columns(3)
        .spacing([12.0, 6.0])
        .show(ui, |ui| {
            for role in ModelRole::ALL {
                model_row_ui(app, ui, role);
            }
        });
    ui.label(
        RichText::new("Drop .safetensors or .pth files anywhere in the window to fill these")
            .color(theme::MUTED),
    );
    ui.separator();
    dataset_ui(app, ui);
}

fn model_row_ui(app: &mut FramesmithApp, ui: &mut Ui, role: ModelRole) {
    ui.label(role.label());
    if ui.button(format!("Choose {}…", role.label())).clicked() {
        app.jobs.pick(PickPurpose::Model(role));
    }
    ui.vertical(|ui| match app.models.get(&role) {
        None => {
            ui.label(RichText::new("No file").color(theme::MUTED));
        }
        Some((path, status)) => {
            ui.label(RichText::new(path.display().to_string()).monospace());
            match status {
                ModelStatus::Inspecting => {
                    ui.horizontal(|ui| {
                        ui.spinner();
                        ui.label("Inspecting…");
                    });
                }
                ModelStatus::Ready(summary) => {
                    ui.label(RichText::new(summary).color(theme::GOOD));
                }
                ModelStatus::Error(err) => {
                    ui.label(RichText::new(err).color(theme::ERROR));
                }
            }
        }
    });
    ui.end_row();
}
