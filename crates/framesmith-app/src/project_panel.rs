//! The Project tab: the model files (picked or dropped, each inspected in the background) and the dataset.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use egui::{RichText, TextureHandle, Ui};

use super::backend::{Backend, ModelRole};
use super::config_editor::ConfigEditor;
use super::dataset_config::DatasetEditor;
use super::dataset_panel::{dataset_ui, DatasetContext};
use super::jobs::{Jobs, PickPurpose};
use super::theme;
use super::window::ModelStatus;

/// What the Project tab reads and writes.
pub(super) struct ProjectContext<'a> {
    /// The run config (`model.demo`).
    pub editor: &'a mut ConfigEditor,
    /// Each model file and what its inspection found.
    pub models: &'a BTreeMap<ModelRole, (PathBuf, ModelStatus)>,
    pub dataset: &'a mut DatasetEditor,
    pub dataset_thumbnails: &'a mut HashMap<PathBuf, TextureHandle>,
    pub backend: &'a Arc<dyn Backend>,
    pub jobs: &'a mut Jobs,
}

/// Draws the Project tab.
pub(super) fn project_ui(ctx: &mut ProjectContext, ui: &mut Ui) {
    ui.heading("Models");
    let mut demo = ctx.editor.config().model.demo;
    let toggle = ui
        .checkbox(&mut demo, "Demo model")
        .on_hover_text("Train the built-in tiny model on synthetic clips: no downloads, no GPU");
    if toggle.changed() {
        ctx.editor
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
                model_row_ui(ctx, ui, role);
            }
        });
    ui.label(
        RichText::new("Drop .safetensors or .pth files anywhere in the window to fill these")
            .color(theme::MUTED),
    );
    ui.separator();
    let mut dataset = DatasetContext {
        demo: ctx.editor.config().model.demo,
        dataset: ctx.dataset,
        thumbnails: ctx.dataset_thumbnails,
        backend: ctx.backend,
        jobs: ctx.jobs,
    };
    dataset_ui(&mut dataset, ui);
}

fn model_row_ui(ctx: &mut ProjectContext, ui: &mut Ui, role: ModelRole) {
    ui.label(role.label());
    if ui.button(format!("Choose {}…", role.label())).clicked() {
        ctx.jobs.pick(PickPurpose::Model(role));
    }
    ui.vertical(|ui| match ctx.models.get(&role) {
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
