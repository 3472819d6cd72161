//! The dataset being built in the Project tab: dropped folders, their scan, and the musubi-tuner dataset TOML
//! (`[general]` + `[[datasets]]`) that the form edits, imports and exports. No egui here.

use std::path::{Path, PathBuf};

use super::backend::DatasetSummary;
use super::form::Drafts;

/// Defaults for a new dataset config: a 480p video bucket and musubi-tuner's example video cuts.
const DEFAULT_RESOLUTION: [i64; 2] = [832, 480];
const DEFAULT_TARGET_FRAMES: [i64; 3] = [1, 25, 45];

/// Dataset folders, their scan and the dataset TOML.
#[derive(Debug, Clone, Default)]
pub struct DatasetEditor {
    pub table: toml::Table,
    pub drafts: Drafts,
    pub summary: Option<DatasetSummary>,
    pub scan_error: Option<String>,
    /// Generation of the scan whose result is awaited, if any.
    pub scanning: Option<u64>,
    scan_generation: u64,
}

impl DatasetEditor {
    /// Loads a saved dataset TOML (from settings); a bad one starts empty.
    pub fn from_toml(text: &str) -> Self {
        let mut editor = Self::default();
        if !text.trim().is_empty() {
            let _ = editor.import(text);
        }
        editor
    }

    /// The folders named by `[[datasets]]` entries, in order.
    pub fn folders(&self) -> Vec<PathBuf> {
        self.entries()
            .iter()
            .filter_map(|entry| {
                let entry = entry.as_table()?;
                entry
                    .get("video_directory")
                    .or_else(|| entry.get("image_directory"))
                    .and_then(toml::Value::as_str)
                    .map(PathBuf::from)
            })
            .collect()
    }

    pub fn entries(&self) -> &[toml::Value] {
        self.table
            .get("datasets")
            .and_then(toml::Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// Mutable `[[datasets]]` entry `index`.
    pub fn entry_mut(&mut self, index: usize) -> Option<&mut toml::Table> {
        self.table
            .get_mut("datasets")?
            .as_array_mut()?
            .get_mut(index)?
            .as_table_mut()
    }

    pub fn general_mut(&mut self) -> &mut toml::Table {
        let general = self
            .table
            .entry("general")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !general.is_table() {
            *general = toml::Value::Table(toml::Table::new());
        }
        match general.as_table_mut() {
            Some(table) => table,
            None => unreachable!("just made a table"),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// Starts a scan of every folder; returns the folders and the generation to hand back with the result.
    pub fn begin_scan(&mut self) -> (Vec<PathBuf>, u64) {
        self.scan_generation += 1;
        self.scanning = Some(self.scan_generation);
        (self.folders(), self.scan_generation)
    }

    /// Adds dropped folders as new `[[datasets]]` entries (image folders until a scan says otherwise).
    pub fn add_folders(&mut self, folders: &[PathBuf]) {
        let known = self.folders();
        for folder in folders.iter().filter(|f| !known.contains(f)) {
            let mut entry = toml::Table::new();
            entry.insert("image_directory".into(), path_value(folder));
            self.push_entry(entry);
        }
        if !self.table.contains_key("general") {
            let general = self.general_mut();
            general.insert(
                "resolution".into(),
                toml::Value::Array(DEFAULT_RESOLUTION.iter().map(|&v| v.into()).collect()),
            );
            general.insert("caption_extension".into(), ".txt".into());
            general.insert("batch_size".into(), 1.into());
            general.insert("enable_bucket".into(), true.into());
            general.insert("bucket_no_upscale".into(), false.into());
        }
        self.drafts.clear();
    }

    fn push_entry(&mut self, entry: toml::Table) {
        let datasets = self
            .table
            .entry("datasets")
            .or_insert_with(|| toml::Value::Array(Vec::new()));
        if let Some(list) = datasets.as_array_mut() {
            list.push(toml::Value::Table(entry));
        }
    }

    pub fn remove_entry(&mut self, index: usize) {
        if let Some(list) = self
            .table
            .get_mut("datasets")
            .and_then(toml::Value::as_array_mut)
        {
            if index < list.len() {
                list.remove(index);
            }
        }
        self.drafts.clear();
    }

    /// Takes a scan result (ignored when a newer scan is under way). Folders the scan found to hold videos
    /// become `video_directory` entries with frame cuts.
    pub fn finish_scan(&mut self, generation: u64, result: Result<DatasetSummary, String>) {
        if self.scanning != Some(generation) {
            return;
        }
        self.scanning = None;
        match result {
            Ok(summary) => {
                for folder in &summary.video_folders {
                    self.mark_video_folder(folder);
                }
                self.scan_error = None;
                self.summary = Some(summary);
            }
            Err(err) => {
                self.scan_error = Some(err);
                self.summary = None;
            }
        }
    }

    fn mark_video_folder(&mut self, folder: &Path) {
        let Some(list) = self
            .table
            .get_mut("datasets")
            .and_then(toml::Value::as_array_mut)
        else {
            return;
        };
        for entry in list.iter_mut().filter_map(toml::Value::as_table_mut) {
            let is_folder = entry.get("image_directory").and_then(toml::Value::as_str)
                == Some(&*folder.to_string_lossy());
            if is_folder {
                entry.remove("image_directory");
                entry.insert("video_directory".into(), path_value(folder));
                entry.insert(
                    "target_frames".into(),
                    toml::Value::Array(DEFAULT_TARGET_FRAMES.iter().map(|&v| v.into()).collect()),
                );
                entry.insert("frame_extraction".into(), "head".into());
            }
        }
    }

    /// The dataset TOML as musubi-tuner reads it.
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string_pretty(&self.table)
            .map_err(|err| format!("cannot write the dataset TOML: {err}"))
    }

    /// Replaces the form with a dataset TOML. It must have at least one `[[datasets]]` entry.
    pub fn import(&mut self, text: &str) -> Result<(), String> {
        let table: toml::Table =
            toml::from_str(text).map_err(|err| format!("not a valid TOML file: {err}"))?;
        let count = table
            .get("datasets")
            .and_then(toml::Value::as_array)
            .map_or(0, Vec::len);
        if count == 0 {
            return Err("not a dataset config: it has no [[datasets]] entries".into());
        }
        self.table = table;
        self.drafts.clear();
        self.summary = None;
        Ok(())
    }
}

fn path_value(path: &Path) -> toml::Value {
    toml::Value::String(path.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_folders_become_entries_and_scan_marks_video_folders() {
        let mut editor = DatasetEditor::default();
        editor.add_folders(&[PathBuf::from("/data/stills"), PathBuf::from("/data/clips")]);
        editor.add_folders(&[PathBuf::from("/data/clips")]);
        assert_eq!(editor.entries().len(), 2);
        let (folders, generation) = editor.begin_scan();
        assert_eq!(folders.len(), 2);
        editor.finish_scan(
            generation,
            Ok(DatasetSummary {
                video_folders: vec![PathBuf::from("/data/clips")],
                videos: 3,
                ..DatasetSummary::default()
            }),
        );
        let text = editor.to_toml().unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let datasets = parsed["datasets"].as_array().unwrap();
        assert_eq!(
            datasets[0]["image_directory"].as_str(),
            Some("/data/stills")
        );
        assert_eq!(datasets[1]["video_directory"].as_str(), Some("/data/clips"));
        assert_eq!(datasets[1]["frame_extraction"].as_str(), Some("head"));
        assert_eq!(parsed["general"]["resolution"].as_array().unwrap().len(), 2);
        assert_eq!(editor.summary.as_ref().map(|s| s.videos), Some(3));
    }

    #[test]
    fn stale_scan_results_are_ignored() {
        let mut editor = DatasetEditor::default();
        editor.add_folders(&[PathBuf::from("/a")]);
        let (_, old) = editor.begin_scan();
        let (_, new) = editor.begin_scan();
        editor.finish_scan(old, Err("old".into()));
        assert!(editor.scan_error.is_none() && editor.scanning == Some(new));
        editor.finish_scan(new, Err("cannot read /a".into()));
        assert_eq!(editor.scan_error.as_deref(), Some("cannot read /a"));
    }

    #[test]
    fn import_export_round_trip_keeps_musubi_keys() {
        let text = r#"
[general]
resolution = [960, 544]
caption_extension = ".txt"
batch_size = 1
enable_bucket = true

[[datasets]]
video_directory = "/v"
cache_directory = "/v/cache"
target_frames = [1, 25, 45]
frame_extraction = "uniform"
frame_sample = 4
"#;
        let mut editor = DatasetEditor::default();
        editor.import(text).unwrap();
        assert_eq!(editor.folders(), vec![PathBuf::from("/v")]);
        let again: toml::Table = toml::from_str(&editor.to_toml().unwrap()).unwrap();
        let original: toml::Table = toml::from_str(text).unwrap();
        assert_eq!(again, original);
        assert!(editor.import("[general]\nbatch_size = 1").is_err());
        assert!(editor.import("not toml [").is_err());
        assert_eq!(editor.folders(), vec![PathBuf::from("/v")]);
    }
}
