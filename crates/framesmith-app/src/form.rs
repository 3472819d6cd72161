//! Generic form fields over a TOML table: one row per key (label, widget, marks). The run config and the musubi
//! dataset config are both edited through this, so a key added to either shows up without new widget code.

use std::collections::{BTreeMap, HashMap};

use egui::{Response, RichText, Ui};

use super::theme;

/// What kind of widget a key gets and how its text is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    Text,
    /// Text plus a Browse… button.
    Path,
    /// A folder: text plus a Browse… button that picks a folder.
    Folder,
    Int,
    Float,
    Bool,
    Choice(&'static [&'static str]),
    /// Comma-separated strings.
    Strings,
    /// Comma-separated whole numbers.
    Ints,
    /// Comma-separated numbers.
    Floats,
    /// A whole number or `auto`.
    IntOrAuto,
}

/// One editable key.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec<'a> {
    /// Dotted path inside the table (`lora.rank`).
    pub key: &'a str,
    pub label: &'a str,
    pub kind: FieldKind,
    /// Empty text (or "default" for choices) removes the key.
    pub optional: bool,
    /// Shown on hover.
    pub help: &'a str,
}

/// Marks shown beside fields: preset changes and validation findings, by full dotted key.
#[derive(Debug, Clone, Default)]
pub struct FieldMarks {
    pub preset: BTreeMap<String, String>,
    pub errors: BTreeMap<String, Vec<String>>,
    pub warnings: BTreeMap<String, Vec<String>>,
}

/// Text the user is typing, kept until it parses and the field loses focus.
#[derive(Debug, Clone, Default)]
pub struct Drafts {
    text: HashMap<String, String>,
}

impl Drafts {
    /// Holds `text` as the draft of `key` (what the field shows until it parses and loses focus).
    pub fn set(&mut self, key: &str, text: &str) {
        self.text.insert(key.to_owned(), text.to_owned());
    }

    /// Forgets every draft (after the table is replaced from elsewhere).
    pub fn clear(&mut self) {
        self.text.clear();
    }

    /// Keys whose draft does not parse, with the reason. `spec_of` gives a key's kind and whether it is optional.
    pub fn invalid(
        &self,
        spec_of: &dyn Fn(&str) -> Option<(FieldKind, bool)>,
    ) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .text
            .iter()
            .filter_map(|(key, text)| {
                let (kind, optional) = spec_of(key)?;
                parse(kind, optional, text).err().map(|e| (key.clone(), e))
            })
            .collect();
        out.sort();
        out
    }
}

/// What a field asks of its owner after this frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FieldOutcome {
    pub changed: bool,
    pub browse: bool,
}

/// Draws one field as a row of a 3-column grid and writes a valid edit into `table`.
pub fn field_ui(
    ui: &mut Ui,
    spec: &FieldSpec<'_>,
    full_key: &str,
    table: &mut toml::Table,
    drafts: &mut Drafts,
    marks: &FieldMarks,
) -> FieldOutcome {
    let mut label = ui.label(spec.label);
    if !spec.help.is_empty() {
        label = label.on_hover_text(spec.help);
    }
    let current = get(table, spec.key).cloned();
    let mut outcome = FieldOutcome::default();
    let mut draft_error = None;
    ui.horizontal(|ui| match spec.kind {
        FieldKind::Bool => {
            let mut value = current
                .as_ref()
                .and_then(toml::Value::as_bool)
                .unwrap_or(false);
            if ui.checkbox(&mut value, "").labelled_by(label.id).changed() {
                set(table, spec.key, Some(toml::Value::Boolean(value)));
                outcome.changed = true;
            }
        }
        FieldKind::Choice(choices) => {
            outcome.changed = choice_ui(ui, spec, full_key, choices, table, &label);
        }
        _ => {
            let (changed, error) = text_ui(ui, spec, full_key, table, drafts, &label);
            outcome.changed = changed;
            draft_error = error;
            if matches!(spec.kind, FieldKind::Path | FieldKind::Folder) {
                let button = ui
                    .button("…")
                    .on_hover_text(format!("Browse for {}", spec.label));
                outcome.browse = button.clicked();
            }
        }
    });
    marks_ui(ui, full_key, marks, draft_error);
    ui.end_row();
    outcome
}

fn choice_ui(
    ui: &mut Ui,
    spec: &FieldSpec<'_>,
    full_key: &str,
    choices: &[&str],
    table: &mut toml::Table,
    label: &Response,
) -> bool {
    let shown = get(table, spec.key)
        .and_then(toml::Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let mut picked = None;
    let combo = egui::ComboBox::from_id_salt(full_key)
        .selected_text(shown.clone())
        .show_ui(ui, |ui| {
            if spec.optional && ui.selectable_label(shown == "default", "default").clicked() {
                picked = Some(None);
            }
            for &choice in choices {
                if ui.selectable_label(shown == choice, choice).clicked() {
                    picked = Some(Some(choice));
                }
            }
        });
    combo.response.labelled_by(label.id);
    match picked {
        Some(choice) if choice != Some(shown.as_str()) => {
            set(
                table,
                spec.key,
                choice.map(|c| toml::Value::String(c.into())),
            );
            true
        }
        _ => false,
    }
}

fn text_ui(
    ui: &mut Ui,
    spec: &FieldSpec<'_>,
    full_key: &str,
    table: &mut toml::Table,
    drafts: &mut Drafts,
    label: &Response,
) -> (bool, Option<String>) {
    let mut text = drafts
        .text
        .get(full_key)
        .cloned()
        .unwrap_or_else(|| get(table, spec.key).map(value_text).unwrap_or_default());
    let width = if matches!(
        spec.kind,
        FieldKind::Path | FieldKind::Folder | FieldKind::Strings
    ) {
        320.0
    } else {
        140.0
    };
    let response = ui
        .add(egui::TextEdit::singleline(&mut text).desired_width(width))
        .labelled_by(label.id);
    let mut changed = false;
    if response.changed() {
        drafts.set(full_key, &text);
        if let Ok(value) = parse(spec.kind, spec.optional, &text) {
            if get(table, spec.key) != value.as_ref() {
                set(table, spec.key, value);
                changed = true;
            }
        }
    }
    let error = drafts
        .text
        .get(full_key)
        .and_then(|t| parse(spec.kind, spec.optional, t).err());
    if response.lost_focus() && error.is_none() {
        drafts.text.remove(full_key);
    }
    (changed, error)
}

fn marks_ui(ui: &mut Ui, full_key: &str, marks: &FieldMarks, draft_error: Option<String>) {
    ui.vertical(|ui| {
        ui.set_max_width(theme::MARK_WIDTH);
        if let Some(error) = draft_error {
            ui.label(RichText::new(error).color(theme::ERROR));
        }
        for error in marks.errors.get(full_key).into_iter().flatten() {
            ui.label(RichText::new(error).color(theme::ERROR));
        }
        for warning in marks.warnings.get(full_key).into_iter().flatten() {
            ui.label(RichText::new(warning).color(theme::WARNING));
        }
        if let Some(reason) = marks.preset.get(full_key) {
            ui.label(RichText::new(format!("Preset: {reason}")).color(theme::ACCENT));
        }
    });
}

/// The text a value shows in a text field.
pub fn value_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => float_text(*f),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Array(items) => items.iter().map(value_text).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// Short, exact text for a float: `0.0002` reads worse than `2e-4` in a learning-rate field.
fn float_text(f: f64) -> String {
    if f != 0.0 && f.abs() < 1e-3 {
        format!("{f:e}")
    } else {
        let text = f.to_string();
        if text.contains('.') || text.contains('e') || text.contains("inf") || text.contains("NaN")
        {
            text
        } else {
            format!("{text}.0")
        }
    }
}

/// Parses field text into a value; `Ok(None)` removes an optional key.
pub fn parse(kind: FieldKind, optional: bool, text: &str) -> Result<Option<toml::Value>, String> {
    let text = text.trim();
    if text.is_empty() && (optional || kind_allows_empty(kind)) {
        return Ok(if optional {
            None
        } else {
            Some(empty_value(kind))
        });
    }
    let value = match kind {
        FieldKind::Text | FieldKind::Path | FieldKind::Folder => toml::Value::String(text.into()),
        FieldKind::Int => toml::Value::Integer(parse_int(text)?),
        FieldKind::Float => toml::Value::Float(parse_float(text)?),
        FieldKind::Bool => {
            toml::Value::Boolean(text.parse().map_err(|_| "Enter true or false".to_owned())?)
        }
        FieldKind::Choice(_) => toml::Value::String(text.into()),
        FieldKind::IntOrAuto if text.eq_ignore_ascii_case("auto") => {
            toml::Value::String("auto".into())
        }
        FieldKind::IntOrAuto => toml::Value::Integer(
            parse_int(text).map_err(|_| "Enter a whole number or auto".to_owned())?,
        ),
        FieldKind::Strings => toml::Value::Array(
            split_list(text)
                .map(|s| toml::Value::String(s.into()))
                .collect(),
        ),
        FieldKind::Ints => toml::Value::Array(
            split_list(text)
                .map(|s| parse_int(s).map(toml::Value::Integer))
                .collect::<Result<_, _>>()?,
        ),
        FieldKind::Floats => toml::Value::Array(
            split_list(text)
                .map(|s| parse_float(s).map(toml::Value::Float))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(Some(value))
}

fn kind_allows_empty(kind: FieldKind) -> bool {
    matches!(
        kind,
        FieldKind::Text | FieldKind::Path | FieldKind::Folder | FieldKind::Strings
    )
}

fn empty_value(kind: FieldKind) -> toml::Value {
    match kind {
        FieldKind::Strings => toml::Value::Array(Vec::new()),
        _ => toml::Value::String(String::new()),
    }
}

fn split_list(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn parse_int(text: &str) -> Result<i64, String> {
    text.parse()
        .map_err(|_| format!("Enter a whole number (not {text:?})"))
}

fn parse_float(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(f),
        _ => Err(format!("Enter a number like 2e-4 (not {text:?})")),
    }
}

/// The value at a dotted key.
pub fn get<'t>(table: &'t toml::Table, key: &str) -> Option<&'t toml::Value> {
    let mut parts = key.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

/// Sets (or with `None` removes) the value at a dotted key, creating tables on the way.
pub fn set(table: &mut toml::Table, key: &str, value: Option<toml::Value>) {
    let Some((head, rest)) = key.split_once('.') else {
        match value {
            Some(v) => table.insert(key.to_owned(), v),
            None => table.remove(key),
        };
        return;
    };
    let child = table
        .entry(head.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(child) = child.as_table_mut() {
        set(child, rest, value);
    }
}

/// Every leaf of a table as dotted key → value (arrays are leaves).
pub fn flatten(table: &toml::Table) -> BTreeMap<String, toml::Value> {
    let mut out = BTreeMap::new();
    flatten_into("", table, &mut out);
    out
}

fn flatten_into(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(child) => flatten_into(&full, child, out),
            other => {
                out.insert(full, other.clone());
            }
        }
    }
}

/// Keys whose value differs between two tables (present in either).
pub fn changed_keys(before: &toml::Table, after: &toml::Table) -> Vec<String> {
    let (before, after) = (flatten(before), flatten(after));
    let mut keys: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_each_kind_and_rejects_junk() {
        let some = |k, t| parse(k, false, t).unwrap().unwrap();
        assert_eq!(some(FieldKind::Int, " 32 "), toml::Value::Integer(32));
        assert_eq!(some(FieldKind::Float, "2e-4"), toml::Value::Float(2e-4));
        assert_eq!(
            some(FieldKind::IntOrAuto, "Auto"),
            toml::Value::String("auto".into())
        );
        assert_eq!(
            some(FieldKind::Ints, "1, 25,45"),
            toml::Value::Array(vec![1.into(), 25.into(), 45.into()])
        );
        assert_eq!(some(FieldKind::Strings, ""), toml::Value::Array(Vec::new()));
        assert!(parse(FieldKind::Int, false, "3.5").is_err());
        assert!(parse(FieldKind::Float, false, "inf").is_err());
        assert!(parse(FieldKind::Int, false, "").is_err());
        assert_eq!(parse(FieldKind::Int, true, "").unwrap(), None);
    }

    #[test]
    fn float_text_round_trips() {
        for f in [2e-4, 1e-8, 0.9, 3.0, 1000.0, 0.0] {
            let text = float_text(f);
            assert_eq!(text.parse::<f64>().unwrap(), f, "{text}");
        }
        assert_eq!(float_text(2e-4), "2e-4");
        assert_eq!(float_text(3.0), "3.0");
    }

    #[test]
    fn dotted_get_set_and_diff() {
        let mut table: toml::Table =
            toml::from_str("[lora]\nrank = 32\n[memory]\nstreaming = \"off\"").unwrap();
        let before = table.clone();
        set(&mut table, "memory.streaming", Some("staged".into()));
        set(&mut table, "memory.staging_slots", Some(4.into()));
        set(&mut table, "lora.rank", None);
        assert_eq!(
            get(&table, "memory.streaming").and_then(|v| v.as_str()),
            Some("staged")
        );
        assert_eq!(
            changed_keys(&before, &table),
            vec!["lora.rank", "memory.staging_slots", "memory.streaming"]
        );
    }
}
