//! The dataset half of the Project tab: folders, the scan summary with thumbnails, and the musubi-tuner dataset
//! form with import and export.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use egui::{RichText, TextureHandle, TextureOptions, Ui};

use super::backend::{Backend, DatasetSummary};
use super::dataset_config::DatasetEditor;
use super::fields::{DATASET_ENTRY, DATASET_GENERAL};
use super::form::{field_ui, FieldMarks};
use super::jobs::{JobResult, Jobs, PickPurpose};
use super::standalone::resolution_spread;
use super::theme;

/// What the dataset section reads and writes.
pub(super) struct DatasetContext<'a> {
    pub dataset: &'a mut DatasetEditor,
    /// Textures of the scan's thumbnails, by file.
    pub thumbnails: &'a mut HashMap<PathBuf, TextureHandle>,
    /// The run trains the demo model (the dataset is not used).
    pub demo: bool,
    /// Scans the folders.
    pub backend: &'a Arc<dyn Backend>,
    pub jobs: &'a mut Jobs,
}

impl DatasetContext<'_> {
    fn scan(&mut self) {
        scan_dataset(self.dataset, self.backend, self.jobs);
    }
}

/// Scans `dataset`'s folders through `backend` off the UI thread (`JobResult::DatasetScanned`).
pub(super) fn scan_dataset(
    dataset: &mut DatasetEditor,
    backend: &Arc<dyn Backend>,
    jobs: &mut Jobs,
) {
    let (folders, generation) = dataset.begin_scan();
    let backend = Arc::clone(backend);
    jobs.spawn("scan dataset", move || JobResult::DatasetScanned {
        result: backend.scan_dataset(&folders),
        generation,
    });
}

/// Draws the dataset section.
pub(super) fn dataset_ui(ctx: &mut DatasetContext, ui: &mut Ui) {
    ui.heading("Dataset");
    if ctx.demo {
        ui.label(
            RichText::new(
                "The demo model trains on synthetic clips; turn it off to train on this dataset",
            )
            .color(theme::MUTED),
        );
    }
    ui.horizontal(|ui| {
        if ui.button("Add folders…").clicked() {
            ctx.jobs.pick(PickPurpose::DatasetFolders);
        }
        if ui.button("Import TOML…").clicked() {
            ctx.jobs.pick(PickPurpose::ImportDataset);
        }
        let has_entries = !ctx.dataset.is_empty();
        if ui
            .add_enabled(has_entries, egui::Button::new("Export TOML…"))
            .clicked()
        {
            ctx.jobs.pick(PickPurpose::ExportDataset);
        }
        if ui
            .add_enabled(has_entries, egui::Button::new("Rescan"))
            .clicked()
        {
            ctx.scan();
        }
    });
    ui.label(RichText::new("Drop dataset folders anywhere in the window").color(theme::MUTED));
    if ctx.dataset.scanning.is_some() {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label("Scanning…");
        });
    }
    if let Some(err) = &ctx.dataset.scan_error {
        ui.label(RichText::new(err).color(theme::ERROR));
    }
    if let Some(summary) = &ctx.dataset.summary {
        summary_ui(ctx.thumbnails, ui, summary);
    }
    if !ctx.dataset.is_empty() {
        ui.separator();
        form_ui(ctx, ui);
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn summary_ui(
    thumbnails: &mut HashMap<PathBuf, TextureHandle>,
    ui: &mut Ui,
    summary: &DatasetSummary,
) {
    ui.horizontal(|ui| {
        ui.label(plural(summary.videos, "video", "videos"));
        ui.separator();
        ui.label(plural(summary.images, "image", "images"));
        ui.separator();
        ui.label(plural(summary.captions, "caption", "captions"));
    });
    if !summary.missing_captions.is_empty() {
        let n = summary.missing_captions.len();
        let title = plural(n, "item missing a caption", "items missing captions");
        egui::CollapsingHeader::new(RichText::new(title).color(theme::WARNING))
            .id_salt("missing captions")
            .show(ui, |ui| {
                for path in &summary.missing_captions {
                    ui.label(RichText::new(path.display().to_string()).monospace());
                }
            });
    }
    if !summary.unreadable.is_empty() {
        let title = plural(
            summary.unreadable.len(),
            "unreadable file",
            "unreadable files",
        );
        egui::CollapsingHeader::new(RichText::new(title).color(theme::ERROR))
            .id_salt("unreadable")
            .show(ui, |ui| {
                for (path, why) in &summary.unreadable {
                    ui.label(format!("{why}: {}", path.display()));
                }
            });
    }
    if let Some(spread) = resolution_spread(&summary.resolutions) {
        ui.label(format!("Resolution {spread}"));
    }
    frames_ui(ui, summary);
    problems_ui(ui, summary);
    thumbnails_ui(thumbnails, ui, summary);
}

fn frames_ui(ui: &mut Ui, summary: &DatasetSummary) {
    match summary.frame_range {
        Some((least, most)) if least == most => {
            ui.label(format!("Frames {least}"));
        }
        Some((least, most)) => {
            ui.label(format!("Frames {least} to {most}"));
        }
        None if summary.videos > 0 => {
            ui.label(RichText::new("Frame counts are not known yet").color(theme::MUTED));
        }
        None => {}
    }
}

fn problems_ui(ui: &mut Ui, summary: &DatasetSummary) {
    if summary.problems.is_empty() {
        return;
    }
    let title = plural(summary.problems.len(), "problem", "problems");
    egui::CollapsingHeader::new(RichText::new(title).color(theme::WARNING))
        .id_salt("dataset problems")
        .show(ui, |ui| {
            for problem in &summary.problems {
                ui.label(problem);
            }
        });
}

fn thumbnails_ui(
    textures: &mut HashMap<PathBuf, TextureHandle>,
    ui: &mut Ui,
    summary: &DatasetSummary,
) {
    if summary.thumbnails.is_empty() {
        return;
    }
    ui.horizontal_wrapped(|ui| {
        for thumbnail in &summary.thumbnails {
            let texture = textures.entry(thumbnail.path.clone()).or_insert_with(|| {
                let size = [thumbnail.width as usize, thumbnail.height as usize];
                let image = egui::ColorImage::from_rgba_unmultiplied(size, &thumbnail.rgba);
                ui.ctx().load_texture(
                    thumbnail.path.display().to_string(),
                    image,
                    TextureOptions::LINEAR,
                )
            });
            ui.add(egui::Image::new((texture.id(), texture.size_vec2())))
                .on_hover_text(thumbnail.path.display().to_string());
        }
    });
}

fn form_ui(ctx: &mut DatasetContext, ui: &mut Ui) {
    let marks = FieldMarks::default();
    ui.label(RichText::new("Dataset config (musubi-tuner format)").strong());
    let mut rescan = false;
    let mut general = std::mem::take(ctx.dataset.general_mut());
    egui::Grid::new("dataset general")
        .num_columns(3)
        .show(ui, |ui| {
            for spec in DATASET_GENERAL {
                let key = format!("general.{}", spec.key);
                field_ui(
                    ui,
                    spec,
                    &key,
                    &mut general,
                    &mut ctx.dataset.drafts,
                    &marks,
                );
            }
        });
    *ctx.dataset.general_mut() = general;
    let mut remove = None;
    let mut browse = None;
    for index in 0..ctx.dataset.entries().len() {
        let folder = ctx
            .dataset
            .entries()
            .get(index)
            .map(entry_folder)
            .unwrap_or_default();
        egui::CollapsingHeader::new(format!("Dataset {}: {folder}", index + 1))
            .id_salt(("dataset entry", index))
            .default_open(true)
            .show(ui, |ui| {
                let mut entry = ctx
                    .dataset
                    .entry_mut(index)
                    .map(std::mem::take)
                    .unwrap_or_default();
                egui::Grid::new(("dataset entry grid", index))
                    .num_columns(3)
                    .show(ui, |ui| {
                        for spec in DATASET_ENTRY {
                            let key = format!("datasets.{index}.{}", spec.key);
                            let outcome = field_ui(
                                ui,
                                spec,
                                &key,
                                &mut entry,
                                &mut ctx.dataset.drafts,
                                &marks,
                            );
                            rescan |= outcome.changed && spec.key.ends_with("directory");
                            if outcome.browse {
                                browse = Some((index, spec.key.to_owned()));
                            }
                        }
                    });
                unknown_keys_ui(ui, &entry);
                if let Some(slot) = ctx.dataset.entry_mut(index) {
                    *slot = entry;
                }
                if ui.button(format!("Remove dataset {}", index + 1)).clicked() {
                    remove = Some(index);
                }
            });
    }
    if let Some(index) = remove {
        ctx.dataset.remove_entry(index);
        rescan = true;
    }
    if let Some((index, key)) = browse {
        ctx.jobs.pick(PickPurpose::DatasetPath(index, key));
    }
    if rescan && !ctx.dataset.is_empty() {
        ctx.scan();
    }
}

fn entry_folder(entry: &toml::Value) -> String {
    [
        "video_directory",
        "image_directory",
        "video_jsonl_file",
        "image_jsonl_file",
    ]
    .iter()
    .find_map(|key| entry.get(key).and_then(toml::Value::as_str))
    .unwrap_or("no folder")
    .to_owned()
}

/// Keys the form has no widget for are shown read-only, so an imported file hides nothing.
fn unknown_keys_ui(ui: &mut Ui, entry: &toml::Table) {
    let known: Vec<&str> = DATASET_ENTRY.iter().map(|f| f.key).collect();
    let unknown: BTreeMap<&String, &toml::Value> = entry
        .iter()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .collect();
    for (key, value) in unknown {
        ui.label(
            RichText::new(format!("{key} = {value}"))
                .monospace()
                .color(theme::MUTED),
        );
    }
}
