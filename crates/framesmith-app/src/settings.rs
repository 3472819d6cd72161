//! What the app remembers between runs (through eframe storage). Runtime handles never go here.

use serde::{Deserialize, Serialize};

/// The eframe storage key.
pub const STORAGE_KEY: &str = "framesmith";

/// The tabs of the main window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Tab {
    Project,
    Config,
    #[default]
    Train,
    Monitor,
    Samples,
}

impl Tab {
    pub const ALL: [Self; 5] = [
        Self::Project,
        Self::Config,
        Self::Train,
        Self::Monitor,
        Self::Samples,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Project => "Project",
            Self::Config => "Config",
            Self::Train => "Train",
            Self::Monitor => "Monitor",
            Self::Samples => "Samples",
        }
    }
}

/// A queued run as saved: its name, config TOML, dataset TOML and GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SavedRun {
    pub name: String,
    pub config_toml: String,
    pub dataset_toml: Option<String>,
    pub gpus: Vec<usize>,
}

/// Persisted UI state. Configs are kept as TOML text so that a config format change never loses the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub tab: Tab,
    /// `None` on first start: the demo project opens.
    pub config_toml: Option<String>,
    pub dataset_toml: String,
    pub queue: Vec<SavedRun>,
    /// Hide the raw loss and show only the smoothed one.
    pub smoothed_only: bool,
    /// The GPUs chosen in the Train tab's picker (empty: the config's `training.device`).
    pub gpus: Vec<usize>,
    /// Sample clips play without their sound.
    pub sound_muted: bool,
}

impl Settings {
    /// Reads settings from eframe storage; missing or unreadable settings give the defaults.
    pub fn load(storage: Option<&dyn eframe::Storage>) -> Self {
        storage
            .and_then(|s| eframe::get_value(s, STORAGE_KEY))
            .unwrap_or_default()
    }

    pub fn save(&self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, STORAGE_KEY, self);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use eframe::Storage as _;

    use super::*;

    #[derive(Default)]
    struct MemoryStorage(HashMap<String, String>);

    impl eframe::Storage for MemoryStorage {
        fn get_string(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
        fn set_string(&mut self, key: &str, value: String) {
            self.0.insert(key.into(), value);
        }
        fn remove_string(&mut self, key: &str) {
            self.0.remove(key);
        }
        fn flush(&mut self) {}
    }

    #[test]
    fn settings_survive_storage_and_bad_storage_gives_defaults() {
        let settings = Settings {
            tab: Tab::Monitor,
            config_toml: Some("[lora]\nrank = 8\n".into()),
            dataset_toml: "[[datasets]]\nimage_directory = \"/d\"\n".into(),
            queue: vec![SavedRun {
                name: "night".into(),
                config_toml: String::new(),
                dataset_toml: None,
                gpus: vec![0, 1],
            }],
            smoothed_only: true,
            gpus: vec![2, 3],
            sound_muted: true,
        };
        let mut storage = MemoryStorage::default();
        settings.save(&mut storage);
        assert_eq!(Settings::load(Some(&storage)), settings);
        storage.set_string(STORAGE_KEY, "garbage (".into());
        assert_eq!(Settings::load(Some(&storage)), Settings::default());
        assert_eq!(Settings::load(None).tab, Tab::Train);
    }
}
