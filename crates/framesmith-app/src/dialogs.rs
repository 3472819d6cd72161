//! Native file dialogs (rfd). Called only from job threads: a dialog blocks the thread that opens it.

use std::path::PathBuf;

use super::fields::run_field;
use super::form::FieldKind;
use super::jobs::PickPurpose;

const MODEL_EXTENSIONS: [&str; 5] = ["safetensors", "pth", "pt", "bin", "gguf"];

/// Opens the dialog for `purpose`; empty when cancelled.
pub(super) fn pick(purpose: &PickPurpose) -> Vec<PathBuf> {
    let dialog = rfd::FileDialog::new();
    let toml = |d: rfd::FileDialog| d.add_filter("TOML", &["toml"]);
    let one = |p: Option<PathBuf>| p.into_iter().collect();
    match purpose {
        PickPurpose::Model(role) => one(dialog
            .set_title(format!("Choose the {} file", role.label()))
            .add_filter("Model weights", &MODEL_EXTENSIONS)
            .pick_file()),
        PickPurpose::DatasetFolders => dialog
            .set_title("Choose dataset folders")
            .pick_folders()
            .unwrap_or_default(),
        PickPurpose::ConfigPath(key) => {
            let folder = run_field(key).is_some_and(|f| f.kind == FieldKind::Folder);
            one(if folder {
                dialog.pick_folder()
            } else {
                dialog.pick_file()
            })
        }
        PickPurpose::DatasetPath(_, _) | PickPurpose::ResumeState => one(dialog.pick_folder()),
        PickPurpose::LoraFile => one(dialog
            .set_title("Choose a LoRA file")
            .add_filter("LoRA", &["safetensors"])
            .pick_file()),
        PickPurpose::MergeBase => one(dialog
            .set_title("Choose the base model to merge the LoRA into")
            .add_filter("Model weights", &["safetensors"])
            .pick_file()),
        PickPurpose::LoadConfig | PickPurpose::ImportDataset => one(toml(dialog).pick_file()),
        PickPurpose::SaveConfig => one(toml(dialog).set_file_name("run.toml").save_file()),
        PickPurpose::ExportDataset => one(toml(dialog).set_file_name("dataset.toml").save_file()),
    }
}
