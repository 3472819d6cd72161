//! "LoRA tools", on the Samples tab: the finished run's LoRA (or a picked one) inspected, converted to another
//! key layout, resized or merged into a base model. Layout only; the state and the jobs are `lora_tools.rs`'.

use std::sync::Arc;

use egui::{RichText, Ui};

use super::backend::{Backend, LoraLayout, LoraReport};
use super::jobs::{JobResult, Jobs, PickPurpose};
use super::lora_tools::{LoraAction, LoraToolsView, MergeBase};
use super::theme;

/// Rows of the norms table shown before it scrolls.
const NORMS_HEIGHT: f32 = 220.0;

/// What the panel reads and starts jobs with.
pub struct LoraToolsContext<'a> {
    pub view: &'a mut LoraToolsView,
    pub backend: &'a Arc<dyn Backend>,
    pub jobs: &'a mut Jobs,
}

/// Draws the panel.
pub fn lora_tools_ui(ctx: &mut LoraToolsContext, ui: &mut Ui) {
    ui.heading("LoRA tools");
    file_ui(ctx, ui);
    if ctx.view.file().is_none() {
        ui.label(
            RichText::new(
                "Finish a run, or choose a LoRA file, to inspect, convert, resize or merge it",
            )
            .color(theme::MUTED),
        );
        return;
    }
    let mut action = None;
    ui.add_enabled_ui(ctx.view.can_run(), |ui| {
        action = actions_ui(ctx, ui);
    });
    if let Some(action) = action {
        ctx.view.start(action, ctx.backend, ctx.jobs);
    }
    outcome_ui(ctx.view, ui);
}

/// The file the tools work on: one of the run's LoRAs, or a picked one.
fn file_ui(ctx: &mut LoraToolsContext, ui: &mut Ui) {
    ui.horizontal(|ui| {
        ui.label("File");
        let shown = ctx
            .view
            .file()
            .map_or_else(|| "none".to_owned(), |p| p.display().to_string());
        let mut chosen = None;
        egui::ComboBox::from_id_salt("lora tools file")
            .selected_text(shown)
            .show_ui(ui, |ui| {
                for path in ctx.view.choices() {
                    let selected = ctx.view.file() == Some(path.as_path());
                    if ui
                        .selectable_label(selected, path.display().to_string())
                        .clicked()
                    {
                        chosen = Some(path.clone());
                    }
                }
            });
        if let Some(path) = chosen {
            ctx.view.choose_file(path);
        }
        if ui.button("Choose…").clicked() {
            ctx.jobs.pick(PickPurpose::LoraFile);
        }
    });
}

/// The action buttons with their settings; returns the one clicked.
fn actions_ui(ctx: &mut LoraToolsContext, ui: &mut Ui) -> Option<LoraAction> {
    let view = &mut *ctx.view;
    let mut action = None;
    egui::Grid::new("lora tools").num_columns(2).show(ui, |ui| {
        if ui.button("Inspect").clicked() {
            action = Some(LoraAction::Inspect);
        }
        ui.label(
            RichText::new("Kind, rank, targets, metadata and the weight change per block")
                .color(theme::MUTED),
        );
        ui.end_row();
        if ui.button("Convert").clicked() {
            action = Some(LoraAction::Convert(view.layout));
        }
        ui.horizontal(|ui| {
            ui.label("to");
            for layout in LoraLayout::ALL {
                ui.selectable_value(&mut view.layout, layout, layout.label());
            }
        });
        ui.end_row();
        if ui.button("Resize").clicked() {
            action = Some(LoraAction::Resize(view.rank));
        }
        ui.horizontal(|ui| {
            ui.label("to rank");
            ui.add(egui::DragValue::new(&mut view.rank).range(1..=1024));
        });
        ui.end_row();
        let merge = view.merge_action();
        if ui
            .add_enabled(merge.is_some(), egui::Button::new("Merge"))
            .clicked()
        {
            action = merge;
        }
        ui.horizontal(|ui| {
            if ui.button("Base model…").clicked() {
                pick_base(ctx.jobs);
            }
            if let Some(base) = view.base() {
                ui.label(base.path.display().to_string());
            }
            ui.label("strength");
            ui.add(
                egui::DragValue::new(&mut view.strength)
                    .speed(0.05)
                    .range(-4.0..=4.0),
            );
        });
        ui.end_row();
    });
    if let Some(warning) = view.merge_warning() {
        ui.label(RichText::new(warning).color(theme::WARNING));
    }
    action
}

/// Opens the base model dialog on a job thread and reads the chosen file's size there.
fn pick_base(jobs: &mut Jobs) {
    jobs.spawn("choose base model", || {
        let path = super::dialogs::pick(&PickPurpose::MergeBase)
            .into_iter()
            .next();
        JobResult::MergeBaseChosen(path.map(|path| MergeBase {
            bytes: std::fs::metadata(&path).ok().map(|m| m.len()),
            path,
        }))
    });
}

/// The status line, the report's lines and the norms table.
fn outcome_ui(view: &LoraToolsView, ui: &mut Ui) {
    if let Some(status) = view.status() {
        let failed = view.outcome().is_some_and(|o| o.result.is_err());
        let color = if failed { theme::ERROR } else { theme::MUTED };
        ui.label(RichText::new(status).color(color));
    }
    if view.running().is_some() {
        ui.spinner();
        return;
    }
    let Some(Ok(report)) = view.outcome().map(|o| o.result.as_ref()) else {
        return;
    };
    for line in &report.lines {
        ui.label(RichText::new(line).monospace());
    }
    norms_ui(report, ui);
}

fn norms_ui(report: &LoraReport, ui: &mut Ui) {
    if report.norms.is_empty() {
        return;
    }
    egui::ScrollArea::vertical()
        .id_salt("lora norms")
        .max_height(NORMS_HEIGHT)
        .show(ui, |ui| {
            egui::Grid::new("lora norms grid")
                .num_columns(3)
                .striped(true)
                .show(ui, |ui| {
                    ui.strong("Group");
                    ui.strong("Block");
                    // The default fonts have no "‖" (egui refuses a glyph it cannot draw).
                    ui.strong("Weight change norm");
                    ui.end_row();
                    for (group, blocks) in &report.norms {
                        for (block, norm) in blocks {
                            ui.label(group);
                            ui.label(block.to_string());
                            ui.label(format!("{norm:.4}"));
                            ui.end_row();
                        }
                    }
                });
        });
}
