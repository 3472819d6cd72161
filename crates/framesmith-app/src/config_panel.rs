//! The Config tab: presets (one click, with what changed and why), every run-config field with its validation
//! marks, and loading / saving the resolved config as TOML.

use egui::{RichText, Ui};

use framesmith_config::protocol::LogLevel;

use super::backend::{Backend, PresetView};
use super::config_editor::ConfigEditor;
use super::fields::{kind_of_value, run_field, section_fields, RUN_SECTIONS};
use super::form::{self, field_ui, FieldSpec};
use super::jobs::{Jobs, PickPurpose};
use super::run_view::RunView;
use super::theme;

/// What the Config tab reads and writes.
pub(super) struct ConfigContext<'a> {
    pub editor: &'a mut ConfigEditor,
    pub presets: &'a [PresetView],
    /// Makes the demo project and applies presets.
    pub backend: &'a dyn Backend,
    pub jobs: &'a mut Jobs,
    /// The run log, where a preset that cannot be applied is reported.
    pub run: &'a mut RunView,
}

impl ConfigContext<'_> {
    fn apply_preset(&mut self, name: &str) {
        let Some(preset) = self.presets.iter().find(|p| p.name == name) else {
            return;
        };
        match self.backend.apply_preset(name, self.editor.config()) {
            Ok(config) => self.editor.apply_preset(name, config, &preset.reasons),
            Err(err) => self
                .run
                .note(LogLevel::Error, format!("Preset {name}: {err}")),
        }
    }
}

/// Draws the Config tab.
pub(super) fn config_ui(ctx: &mut ConfigContext, ui: &mut Ui) {
    presets_ui(ctx, ui);
    ui.separator();
    ui.horizontal(|ui| {
        if ui.button("Load config…").clicked() {
            ctx.jobs.pick(PickPurpose::LoadConfig);
        }
        if ui.button("Save config…").clicked() {
            ctx.jobs.pick(PickPurpose::SaveConfig);
        }
        if ui.button("Open demo project").clicked() {
            let demo = ctx.backend.demo_project();
            ctx.editor.replace(demo);
        }
    });
    problems_ui(ctx, ui);
    for section in RUN_SECTIONS {
        egui::CollapsingHeader::new(section.title)
            .default_open(true)
            .show(ui, |ui| {
                egui::Grid::new(section.title)
                    .num_columns(3)
                    .spacing([12.0, 4.0])
                    .show(ui, |ui| {
                        for spec in section_fields(section) {
                            field_row_ui(ctx, ui, spec);
                        }
                    });
            });
    }
    other_settings_ui(ctx, ui);
}

fn field_row_ui(ctx: &mut ConfigContext, ui: &mut Ui, spec: &FieldSpec<'_>) {
    let editor = &mut ctx.editor;
    let outcome = field_ui(
        ui,
        spec,
        spec.key,
        &mut editor.table,
        &mut editor.drafts,
        &editor.marks,
    );
    if outcome.changed {
        editor.edited(spec.key);
    }
    if outcome.browse {
        ctx.jobs.pick(PickPurpose::ConfigPath(spec.key.to_owned()));
    }
}

fn presets_ui(ctx: &mut ConfigContext, ui: &mut Ui) {
    ui.horizontal_wrapped(|ui| {
        ui.label(RichText::new("Presets").strong());
        if ctx.presets.is_empty() {
            ui.label(RichText::new("No presets in this build").color(theme::MUTED));
        }
        let mut clicked = None;
        for preset in ctx.presets {
            if ui
                .button(preset.name.as_str())
                .on_hover_text(preset.summary.as_str())
                .clicked()
            {
                clicked = Some(preset.name.clone());
            }
        }
        if let Some(name) = clicked {
            ctx.apply_preset(&name);
        }
    });
    let Some((name, changes)) = &ctx.editor.preset else {
        return;
    };
    egui::Frame::group(ui.style()).show(ui, |ui| {
        if changes.is_empty() {
            ui.label(format!(
                "Preset {name} changed nothing: the config already matched it"
            ));
            return;
        }
        let fields = if changes.len() == 1 {
            "field"
        } else {
            "fields"
        };
        ui.label(
            RichText::new(format!("Preset {name} changed {} {fields}", changes.len()))
                .color(theme::ACCENT),
        );
        for change in changes {
            ui.label(format!(
                "{} = {}: {}",
                change.label, change.value, change.reason
            ));
        }
    });
}

fn problems_ui(ctx: &ConfigContext, ui: &mut Ui) {
    let editor = &ctx.editor;
    if let Some(err) = &editor.table_error {
        ui.label(RichText::new(err).color(theme::ERROR));
    }
    for issue in &editor.general_issues {
        let color = match issue.severity {
            super::backend::Severity::Error => theme::ERROR,
            super::backend::Severity::Warning => theme::WARNING,
        };
        ui.label(RichText::new(&issue.message).color(color));
    }
}

/// Keys in the config that no section lists (added to `RunConfig` after this form was written).
fn other_settings_ui(ctx: &mut ConfigContext, ui: &mut Ui) {
    let extra: Vec<(String, toml::Value)> = form::flatten(&ctx.editor.table)
        .into_iter()
        .filter(|(key, _)| key != "schema_version" && run_field(key).is_none())
        .collect();
    if extra.is_empty() {
        return;
    }
    egui::CollapsingHeader::new("Other settings").show(ui, |ui| {
        egui::Grid::new("other settings")
            .num_columns(3)
            .show(ui, |ui| {
                for (key, value) in &extra {
                    let spec = FieldSpec {
                        key,
                        label: key,
                        kind: kind_of_value(value),
                        optional: false,
                        help: "",
                    };
                    field_row_ui(ctx, ui, &spec);
                }
            });
    });
}
