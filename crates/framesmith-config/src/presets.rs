//! Presets (DESIGN.md §6): small TOML overlays on a `RunConfig`, built into the binary. Each file holds the
//! settings it changes plus a `[preset]` table with a title, a summary and a one-line `why` per setting, so the
//! GUI can show "field → new value — why" for every field a preset changes.

mod builtin;
mod table;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::plan::ModelFamily;
use super::run::RunConfig;
use builtin::BUILTIN;
pub(crate) use table::{flatten, merge};
use table::{leaf_keys, remove_key};

/// Names of the built-in presets, in display order.
pub fn builtin_names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(name, _)| *name).collect()
}

/// A built-in preset by name.
pub fn builtin(name: &str) -> Result<Preset, ConfigError> {
    let Some((name, text)) = BUILTIN.iter().find(|(n, _)| *n == name) else {
        return Err(ConfigError::UnknownPreset {
            name: name.to_string(),
            available: builtin_names().iter().map(|s| s.to_string()).collect(),
        });
    };
    Preset::parse(
        name,
        text,
        &Path::new("presets").join(format!("{name}.toml")),
    )
}

/// Every built-in preset.
pub fn builtins() -> Result<Vec<Preset>, ConfigError> {
    builtin_names().into_iter().map(builtin).collect()
}

/// The `[preset]` table of a preset file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PresetMeta {
    title: String,
    summary: String,
    /// Dotted key → one line saying why the preset sets it.
    #[serde(default)]
    why: BTreeMap<String, String>,
    /// The model family the preset is made for; none: any.
    #[serde(default)]
    family: Option<ModelFamily>,
}

/// A parsed preset.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: String,
    /// Short title for the GUI.
    pub title: String,
    /// One paragraph: who it is for.
    pub summary: String,
    /// The file it came from (named in messages).
    pub origin: PathBuf,
    /// The model family it is made for (`family` in its `[preset]` table); `None`: any.
    pub family: Option<ModelFamily>,
    overlay: toml::Table,
    why: BTreeMap<String, String>,
}

/// One setting a preset writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetSetting {
    /// Dotted key, e.g. `memory.streaming`.
    pub key: String,
    /// The value as TOML, e.g. `"staged"` or `16`.
    pub value: String,
    pub why: String,
}

/// One field a preset changed in a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    /// Dotted key, e.g. `memory.streaming`.
    pub key: String,
    /// The value before, as TOML; `None` when it was unset.
    pub old: Option<String>,
    /// The value after, as TOML.
    pub new: String,
    /// Why the preset sets it (one line).
    pub why: String,
}

impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {} — {}", self.key, self.new, self.why)
    }
}

/// A config with a preset applied, and what changed.
#[derive(Debug, Clone, PartialEq)]
pub struct PresetApplied {
    pub config: RunConfig,
    /// Fields whose value differs from the config the preset was applied to, in key order.
    pub changes: Vec<FieldChange>,
    /// Settings of the preset not applied because the user's config sets them (`old`: the user's value, which
    /// stays; `new`: the preset's), in key order.
    pub kept: Vec<FieldChange>,
}

impl FieldChange {
    /// The line saying that the user's value of a kept setting stays.
    pub fn kept_line(&self) -> String {
        format!(
            "{} stays {}: your config sets it (the preset would set {})",
            self.key,
            self.old.as_deref().unwrap_or("unset"),
            self.new
        )
    }
}

impl Preset {
    /// Parses preset text. `origin` names the file in messages. Unknown keys and bad values are errors that
    /// name the key and the file, as for run configs.
    pub fn parse(name: &str, text: &str, origin: &Path) -> Result<Self, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e| ConfigError::syntax(&e, text, origin))?;
        let meta = match table.remove("preset") {
            Some(value) => PresetMeta::deserialize(value).map_err(|e| ConfigError::PresetMeta {
                path: origin.to_path_buf(),
                message: e.to_string().trim().to_string(),
            })?,
            None => PresetMeta::default(),
        };
        // Reading the overlay alone as a RunConfig checks every key and value it sets.
        RunConfig::deserialize(table.clone())
            .map_err(|e| ConfigError::from_toml(&e, None, origin))?;
        let keys = leaf_keys(&table);
        if let Some(stray) = meta.why.keys().find(|k| !keys.contains(k)) {
            return Err(ConfigError::PresetMeta {
                path: origin.to_path_buf(),
                message: format!("`why` explains `{stray}`, which the preset does not set"),
            });
        }
        Ok(Self {
            name: name.to_string(),
            title: meta.title,
            summary: meta.summary,
            origin: origin.to_path_buf(),
            family: meta.family,
            overlay: table,
            why: meta.why,
        })
    }

    /// Reads a preset file from disk (a user's own preset); its name is the file stem.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::io::read_toml_text(path)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::parse(&name, &text, path)
    }

    /// Every setting the preset writes, whatever it is applied to, in key order.
    pub fn settings(&self) -> Vec<PresetSetting> {
        flatten(&self.overlay)
            .into_iter()
            .map(|(key, value)| PresetSetting {
                why: self.why_for(&key),
                key,
                value: value.to_string(),
            })
            .collect()
    }

    /// Applies the preset to `base`: a deep merge of TOML tables (the preset's values win, arrays are replaced
    /// whole), read back as a `RunConfig`, with the fields that changed.
    pub fn apply(&self, base: &RunConfig) -> Result<PresetApplied, ConfigError> {
        self.apply_keeping(base, &BTreeSet::new())
    }

    /// Applies the preset to `base` except the settings in `keep` (dotted keys the user wrote in their config
    /// file: an explicit setting wins over a preset's), which are listed in `kept`.
    pub fn apply_keeping(
        &self,
        base: &RunConfig,
        keep: &BTreeSet<String>,
    ) -> Result<PresetApplied, ConfigError> {
        let base_table = toml::Table::try_from(base).map_err(|e| ConfigError::Serialize {
            message: e.to_string(),
        })?;
        let before = flatten(&base_table);
        let mut overlay = self.overlay.clone();
        let mut kept = Vec::new();
        for (key, value) in flatten(&self.overlay) {
            if keep.contains(&key) {
                remove_key(&mut overlay, &key);
                kept.push(FieldChange {
                    old: before.get(&key).map(|v| v.to_string()),
                    new: value.to_string(),
                    why: self.why_for(&key),
                    key,
                });
            }
        }
        let mut merged = base_table.clone();
        merge(&mut merged, &overlay);
        let config = RunConfig::deserialize(merged.clone())
            .map_err(|e| ConfigError::from_toml(&e, None, &self.origin))?;
        let changes = flatten(&merged)
            .into_iter()
            .filter(|(key, value)| before.get(key) != Some(value))
            .map(|(key, value)| FieldChange {
                old: before.get(&key).map(|v| v.to_string()),
                new: value.to_string(),
                why: self.why_for(&key),
                key,
            })
            .collect();
        Ok(PresetApplied {
            config,
            changes,
            kept,
        })
    }

    /// Refuses the preset for a run of another model `family` than it is made for (a FLUX.1 preset's
    /// resolution and timesteps on a Wan run), naming the preset and both families.
    pub fn check_family(&self, family: ModelFamily) -> Result<(), ConfigError> {
        match self.family {
            Some(made_for) if made_for != family => Err(ConfigError::PresetFamily {
                name: self.name.clone(),
                preset_family: made_for,
                run_family: family,
            }),
            _ => Ok(()),
        }
    }

    fn why_for(&self, key: &str) -> String {
        self.why
            .get(key)
            .cloned()
            .unwrap_or_else(|| format!("set by the {} preset", self.name))
    }
}

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::plan::{FloatDtype, HostInfo, PlanDevice};
    use crate::run::{
        AutoKeyword, BlocksToSwap, Fp8ScaleMode, ResidualDtype, SaveDtype, StreamingMode,
    };
    use crate::validate::validate;

    /// Keys that hold machine paths: presets must never set them.
    const PATH_KEYS: &[&str] = &[
        "model.dit",
        "model.vae",
        "model.text_encoder",
        "model.clip",
        "dataset.config",
        "lora.init_from",
        "output.output_dir",
        "sampling.prompts",
    ];

    /// A base config whose paths point at real (empty) files, as a user's would.
    fn base_with_files(dir: &Path) -> RunConfig {
        let dit = dir.join("dit.safetensors");
        let dataset = dir.join("dataset.toml");
        std::fs::write(&dit, b"").unwrap();
        std::fs::write(&dataset, b"").unwrap();
        let mut cfg = RunConfig::default();
        cfg.model.dit = dit;
        cfg.dataset.config = dataset;
        cfg
    }

    #[test]
    fn every_builtin_parses_explains_itself_and_sets_no_paths() {
        let presets = builtins().unwrap();
        assert_eq!(presets.len(), 16);
        for p in &presets {
            assert!(!p.title.is_empty() && !p.summary.is_empty(), "{}", p.name);
            let settings = p.settings();
            assert!(!settings.is_empty(), "{}", p.name);
            for s in &settings {
                assert!(
                    !s.why.starts_with("set by the"),
                    "{}: no why for {}",
                    p.name,
                    s.key
                );
                assert!(
                    !PATH_KEYS.contains(&s.key.as_str()),
                    "{} sets {}",
                    p.name,
                    s.key
                );
            }
        }
    }

    #[test]
    fn every_builtin_applies_over_defaults_and_validates() {
        let dir = tempfile::tempdir().unwrap();
        for p in builtins().unwrap() {
            let base = if p.name == "demo-cpu" {
                RunConfig::default()
            } else {
                base_with_files(dir.path())
            };
            let applied = p.apply(&base).unwrap();
            // Every change is one of the preset's settings, and afterwards every setting holds.
            let keys: Vec<String> = p.settings().into_iter().map(|s| s.key).collect();
            assert!(
                applied.changes.iter().all(|c| keys.contains(&c.key)),
                "{}",
                p.name
            );
            assert!(
                p.apply(&applied.config).unwrap().changes.is_empty(),
                "{}",
                p.name
            );
            for host in [HostInfo::new(1), HostInfo::cpu_only()] {
                if let Err(e) = validate(&applied.config, &host) {
                    panic!("{} on {host:?}: {e}", p.name);
                }
            }
        }
    }

    #[test]
    fn full_speed_undoes_streaming() {
        let low = builtin("low-vram-windows")
            .unwrap()
            .apply(&RunConfig::default())
            .unwrap();
        let full = builtin("full-speed-80gb")
            .unwrap()
            .apply(&low.config)
            .unwrap();
        let keys: Vec<&str> = full.changes.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "memory.activations",
                "memory.blocks_to_swap",
                "memory.streaming",
                "model.base_dtype"
            ]
        );
        let swap = &full.changes[1];
        assert_eq!(
            (swap.old.as_deref(), swap.new.as_str()),
            (Some("\"auto\""), "0")
        );
    }

    #[test]
    fn demo_cpu_plan_is_a_cpu_run_of_the_tiny_model() {
        let applied = builtin("demo-cpu")
            .unwrap()
            .apply(&RunConfig::default())
            .unwrap();
        let plan = validate(&applied.config, &HostInfo::new(2)).unwrap();
        assert_eq!(plan.device, PlanDevice::Cpu);
        assert_eq!(plan.model.source, crate::plan::ModelSource::Demo);
        assert_eq!(plan.model.compute_dtype, FloatDtype::F32);
        assert!(!plan.memory.applies);
        assert_eq!(plan.output.save_every_n_epochs, None);
        assert_eq!(plan.output.save_every_n_steps, Some(100));
        assert!(plan.training.total_steps(1) <= 1000);
    }

    #[test]
    fn low_vram_reports_exactly_what_it_changed() {
        let applied = builtin("low-vram-windows")
            .unwrap()
            .apply(&RunConfig::default())
            .unwrap();
        let keys: Vec<&str> = applied.changes.iter().map(|c| c.key.as_str()).collect();
        // staging_slots = 4 is already the default, so it is not a change.
        assert_eq!(
            keys,
            [
                "dataset.resolution",
                "dataset.target_frames",
                "lora.alpha",
                "lora.rank",
                "memory.activations",
                "memory.blocks_to_swap",
                "memory.shared_memory_guard",
                "memory.streaming",
                "model.base_dtype",
            ]
        );
        let streaming = applied
            .changes
            .iter()
            .find(|c| c.key == "memory.streaming")
            .unwrap();
        assert_eq!(streaming.old.as_deref(), Some("\"off\""));
        assert_eq!(streaming.new, "\"staged\"");
        assert!(streaming.why.contains("Windows"), "{}", streaming.why);
        assert_eq!(
            streaming.to_string(),
            format!("memory.streaming → \"staged\" — {}", streaming.why)
        );
        let resolution = applied
            .changes
            .iter()
            .find(|c| c.key == "dataset.resolution")
            .unwrap();
        assert_eq!(resolution.old, None);
        assert_eq!(resolution.new, "[832, 480]");
        assert_eq!(applied.config.memory.streaming, StreamingMode::Staged);
        assert_eq!(applied.config.lora.rank, 16);
    }

    #[test]
    fn a_setting_in_the_users_file_wins_over_the_presets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(
            &path,
            "[memory]\nblocks_to_swap = 21\nstreaming = \"off\"\n\n[lora]\nrank = 8\n",
        )
        .unwrap();
        let (base, explicit) = RunConfig::load_explicit(&path).unwrap();
        assert_eq!(
            explicit.iter().map(String::as_str).collect::<Vec<_>>(),
            ["lora.rank", "memory.blocks_to_swap"]
        );
        let preset = builtin("balanced-24gb").unwrap();
        let applied = preset.apply_keeping(&base, &explicit).unwrap();
        assert_eq!(
            applied.config.memory.blocks_to_swap,
            BlocksToSwap::Count(21)
        );
        // The rest of the preset applies, also over a key the file spells out at its default value (as configs
        // the app saves whole do).
        assert_eq!(applied.config.memory.streaming, StreamingMode::Pinned);
        let kept: Vec<&str> = applied.kept.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(kept, ["memory.blocks_to_swap"]);
        assert_eq!(
            applied.kept[0].kept_line(),
            "memory.blocks_to_swap stays 21: your config sets it (the preset would set \"auto\")"
        );
        assert!(!applied
            .changes
            .iter()
            .any(|c| c.key == "memory.blocks_to_swap"));
        // Without the file's keys the preset wins, as the app's preset buttons want.
        let overridden = preset.apply(&base).unwrap();
        assert_eq!(
            overridden.config.memory.blocks_to_swap,
            BlocksToSwap::Auto(AutoKeyword::Auto)
        );
        assert!(overridden.kept.is_empty());
    }

    #[test]
    fn changes_are_relative_to_the_base() {
        let preset = builtin("low-vram-windows").unwrap();
        let once = preset.apply(&RunConfig::default()).unwrap();
        let twice = preset.apply(&once.config).unwrap();
        assert!(twice.changes.is_empty(), "{:?}", twice.changes);
        assert_eq!(twice.config, once.config);

        let mut base = RunConfig::default();
        base.lora.rank = 16;
        base.optimizer.learning_rate = 3e-5;
        let applied = preset.apply(&base).unwrap();
        assert!(applied.changes.iter().all(|c| c.key != "lora.rank"));
        // Settings the preset does not touch are kept.
        assert_eq!(applied.config.optimizer.learning_rate, 3e-5);
    }

    #[test]
    fn e7adb86_sets_the_v0_2_8_numerics() {
        let dir = tempfile::tempdir().unwrap();
        let applied = builtin("e7adb86-compatible")
            .unwrap()
            .apply(&base_with_files(dir.path()))
            .unwrap();
        let cfg = &applied.config;
        assert_eq!(cfg.model.residual_dtype, ResidualDtype::F32);
        assert_eq!(cfg.model.fp8_scale, Fp8ScaleMode::Tensor);
        assert_eq!(cfg.memory.streaming, StreamingMode::Pinned);
        assert_eq!(
            cfg.memory.blocks_to_swap,
            BlocksToSwap::Auto(AutoKeyword::Auto)
        );
        assert_eq!(cfg.output.save_dtype, SaveDtype::Dit);
        let plan = validate(cfg, &HostInfo::new(1)).unwrap();
        assert_eq!(
            plan.output.save_dtype,
            FloatDtype::Bf16,
            "the DiT dtype of an FP8 base is bf16"
        );
        assert_eq!(plan.model.fp8_scale, Some(Fp8ScaleMode::Tensor));
    }

    #[test]
    fn unknown_keys_in_a_preset_name_key_and_file() {
        let text = "[memory]\nstreamin = \"staged\"\n\n[preset]\ntitle = \"t\"\nsummary = \"s\"\n";
        let err = Preset::parse("mine", text, Path::new("/home/me/mine.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
        assert_eq!(err.key(), Some("memory.streamin"));
        assert!(err.to_string().ends_with("/home/me/mine.toml"), "{err}");

        let err =
            Preset::parse("mine", "[lora]\nrank = \"big\"\n", Path::new("mine.toml")).unwrap_err();
        assert_eq!(err.key(), Some("lora.rank"), "{err}");

        let text = "[lora]\nrank = 4\n[preset]\ntitle = \"t\"\nsummary = \"s\"\n[preset.why]\n\"lora.alpha\" = \"x\"\n";
        let err = Preset::parse("mine", text, Path::new("mine.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::PresetMeta { .. }), "{err:?}");
        assert!(err.to_string().contains("lora.alpha"), "{err}");

        let err = Preset::parse(
            "mine",
            "[preset]\ntitle = \"t\"\nsumary = \"s\"\n",
            Path::new("m.toml"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("sumary"), "{err}");
    }

    #[test]
    fn user_presets_load_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("my-style.toml");
        std::fs::write(&path, "[lora]\nrank = 4\n").unwrap();
        let preset = Preset::load(&path).unwrap();
        assert_eq!(preset.name, "my-style");
        let applied = preset.apply(&RunConfig::default()).unwrap();
        assert_eq!(applied.changes.len(), 1);
        assert_eq!(applied.changes[0].why, "set by the my-style preset");
    }

    #[test]
    fn unknown_preset_lists_the_names() {
        let err = builtin("fast").unwrap_err();
        assert!(err.to_string().contains("low-vram-windows"), "{err}");
    }
}
