//! The run config being edited: the typed `RunConfig`, its TOML table for the form, drafts, preset marks and
//! validation findings. No egui here.

use std::collections::BTreeMap;

use framesmith_config::RunConfig;

use super::backend::{FieldIssue, Severity};
use super::fields;
use super::form::{self, Drafts, FieldMarks};

/// One field a preset changed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetChange {
    pub key: String,
    pub label: String,
    pub value: String,
    pub reason: String,
}

/// The config form's state.
#[derive(Debug, Clone)]
pub struct ConfigEditor {
    config: RunConfig,
    pub table: toml::Table,
    pub drafts: Drafts,
    pub marks: FieldMarks,
    /// The last preset applied and what it changed.
    pub preset: Option<(String, Vec<PresetChange>)>,
    /// Set when the table no longer reads as a `RunConfig` (a value of the wrong type).
    pub table_error: Option<String>,
    /// Findings that name no field the form shows.
    pub general_issues: Vec<FieldIssue>,
    generation: u64,
    validated: u64,
}

impl ConfigEditor {
    pub fn new(config: RunConfig) -> Self {
        let table = to_table(&config);
        Self {
            config,
            table,
            drafts: Drafts::default(),
            marks: FieldMarks::default(),
            preset: None,
            table_error: None,
            general_issues: Vec::new(),
            generation: 1,
            validated: 0,
        }
    }

    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// Bumped on every change; validation results and memory plans carry the generation they checked.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The generation to validate next, if the last result is stale.
    pub fn needs_validation(&self) -> Option<u64> {
        (self.validated != self.generation).then_some(self.generation)
    }

    /// Replaces the whole config (loaded, demo, queue); clears marks and drafts.
    pub fn replace(&mut self, config: RunConfig) {
        self.table = to_table(&config);
        self.config = config;
        self.drafts.clear();
        self.marks.preset.clear();
        self.preset = None;
        self.table_error = None;
        self.generation += 1;
    }

    /// Applies a preset's result and marks each field it changed with the preset's reason.
    pub fn apply_preset(
        &mut self,
        name: &str,
        result: RunConfig,
        reasons: &BTreeMap<String, String>,
    ) {
        let before = self.table.clone();
        self.replace(result);
        let changes: Vec<PresetChange> = form::changed_keys(&before, &self.table)
            .into_iter()
            .map(|key| {
                let reason = reasons
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| format!("set by {name}"));
                PresetChange {
                    label: fields::run_field(&key)
                        .map_or_else(|| key.clone(), |f| f.label.to_owned()),
                    value: form::get(&self.table, &key)
                        .map_or_else(|| "default".into(), form::value_text),
                    key,
                    reason,
                }
            })
            .collect();
        self.marks.preset = changes
            .iter()
            .map(|c| (c.key.clone(), c.reason.clone()))
            .collect();
        self.preset = Some((name.to_owned(), changes));
    }

    /// Sets one key (model paths from the Project tab); the user's own edit drops its preset mark.
    pub fn set(&mut self, key: &str, value: Option<toml::Value>) {
        form::set(&mut self.table, key, value);
        self.drafts.clear();
        self.edited(key);
    }

    /// Call after the form wrote into `table` at `key`: re-reads the typed config.
    pub fn edited(&mut self, key: &str) {
        self.marks.preset.remove(key);
        match toml::Value::Table(self.table.clone()).try_into::<RunConfig>() {
            Ok(config) => {
                self.table_error = None;
                if config != self.config {
                    self.config = config;
                    self.generation += 1;
                }
            }
            Err(err) => self.table_error = Some(format!("{key}: {err}")),
        }
    }

    /// Takes validation findings for `generation` (older ones are dropped).
    pub fn set_issues(&mut self, generation: u64, issues: Vec<FieldIssue>) {
        if generation != self.generation {
            return;
        }
        self.validated = generation;
        self.marks.errors.clear();
        self.marks.warnings.clear();
        self.general_issues.clear();
        for issue in issues {
            if issue.key.is_empty()
                || form::get(&self.table, &issue.key).is_none()
                    && fields::run_field(&issue.key).is_none()
            {
                self.general_issues.push(issue);
                continue;
            }
            let target = match issue.severity {
                Severity::Error => &mut self.marks.errors,
                Severity::Warning => &mut self.marks.warnings,
            };
            target.entry(issue.key).or_default().push(issue.message);
        }
    }

    /// Whatever stops a run from starting, one line each (empty: good to go).
    pub fn blocking_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(err) = &self.table_error {
            problems.push(err.clone());
        }
        let spec_of = |key: &str| fields::run_field(key).map(|f| (f.kind, f.optional));
        for (key, err) in self.drafts.invalid(&spec_of) {
            problems.push(format!("{key}: {err}"));
        }
        for (key, messages) in &self.marks.errors {
            problems.extend(messages.iter().map(|m| format!("{key}: {m}")));
        }
        problems.extend(
            self.general_issues
                .iter()
                .filter(|i| i.severity == Severity::Error)
                .map(|i| i.message.clone()),
        );
        problems
    }

    /// The config as TOML (what Save config… writes).
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string_pretty(&self.config)
            .map_err(|err| format!("cannot write the config as TOML: {err}"))
    }
}

/// The config as a TOML table for the form.
pub fn to_table(config: &RunConfig) -> toml::Table {
    // A RunConfig always serializes to a table (plain data, string keys); an empty table is a safe fallback.
    match toml::Value::try_from(config) {
        Ok(toml::Value::Table(table)) => table,
        _ => toml::Table::new(),
    }
}

/// Parses a run config TOML.
pub fn parse_config(text: &str) -> Result<RunConfig, String> {
    toml::from_str(text).map_err(|err| format!("not a valid run config: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_marks_changed_fields_and_an_edit_clears_its_mark() {
        let mut editor = ConfigEditor::new(RunConfig::default());
        let mut preset = RunConfig::default();
        preset.lora.rank = 16;
        preset.memory.shared_memory_guard = true;
        let reasons = BTreeMap::from([("lora.rank".to_owned(), "fits 16 GB".to_owned())]);
        editor.apply_preset("low-vram-windows", preset, &reasons);
        let (name, changes) = editor.preset.clone().unwrap();
        assert_eq!(name, "low-vram-windows");
        let keys: Vec<&str> = changes.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, vec!["lora.rank", "memory.shared_memory_guard"]);
        assert_eq!(changes[0].reason, "fits 16 GB");
        assert_eq!(changes[0].value, "16");
        assert_eq!(changes[1].reason, "set by low-vram-windows");
        assert_eq!(editor.config().lora.rank, 16);
        form::set(&mut editor.table, "lora.rank", Some(8.into()));
        editor.edited("lora.rank");
        assert_eq!(editor.config().lora.rank, 8);
        assert!(!editor.marks.preset.contains_key("lora.rank"));
        assert!(editor
            .marks
            .preset
            .contains_key("memory.shared_memory_guard"));
    }

    #[test]
    fn wrong_type_is_reported_and_blocks_start() {
        let mut editor = ConfigEditor::new(RunConfig::default());
        let generation = editor.generation();
        form::set(&mut editor.table, "lora.rank", Some((-3).into()));
        editor.edited("lora.rank");
        assert!(editor
            .table_error
            .as_deref()
            .unwrap()
            .starts_with("lora.rank"));
        assert_eq!(
            editor.generation(),
            generation,
            "the typed config is unchanged"
        );
        assert_eq!(editor.blocking_problems().len(), 1);
    }

    #[test]
    fn emptied_optional_field_is_not_a_problem() {
        let mut editor = ConfigEditor::new(RunConfig::default());
        editor.drafts.set("output.save_every_n_steps", "");
        editor.drafts.set("lora.rank", "");
        assert_eq!(
            editor.blocking_problems(),
            vec!["lora.rank: Enter a whole number (not \"\")".to_owned()]
        );
    }

    #[test]
    fn issues_attach_to_keys_and_stale_ones_are_dropped() {
        let mut editor = ConfigEditor::new(RunConfig::default());
        let issue = |key: &str, severity| FieldIssue {
            key: key.into(),
            message: "bad".into(),
            severity,
        };
        editor.set_issues(
            editor.generation() + 1,
            vec![issue("lora.rank", Severity::Error)],
        );
        assert!(editor.marks.errors.is_empty());
        assert_eq!(editor.needs_validation(), Some(editor.generation()));
        editor.set_issues(
            editor.generation(),
            vec![
                issue("lora.rank", Severity::Error),
                issue("memory.streaming", Severity::Warning),
                issue("", Severity::Error),
            ],
        );
        assert_eq!(editor.needs_validation(), None);
        assert_eq!(editor.marks.errors["lora.rank"], vec!["bad"]);
        assert_eq!(editor.marks.warnings["memory.streaming"], vec!["bad"]);
        assert_eq!(editor.blocking_problems().len(), 2);
    }

    #[test]
    fn config_round_trips_through_toml() {
        let mut config = RunConfig::default();
        config.optimizer.learning_rate = 1e-4;
        let editor = ConfigEditor::new(config.clone());
        assert_eq!(parse_config(&editor.to_toml().unwrap()).unwrap(), config);
        assert!(parse_config("[lora]\nrnak = 3")
            .unwrap_err()
            .contains("rnak"));
    }
}
