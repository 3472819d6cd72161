//! Dotted-key operations on TOML tables that presets are applied with: deep merge, removing a leaf, and the
//! leaves' dotted keys and values.

use std::collections::BTreeMap;

/// Deep merge: tables merge key by key, any other value in `overlay` replaces the one in `base`.
pub(crate) fn merge(base: &mut toml::Table, overlay: &toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Removes the leaf at dotted `key` (and tables left empty by it).
pub(super) fn remove_key(table: &mut toml::Table, key: &str) {
    match key.split_once('.') {
        None => {
            table.remove(key);
        }
        Some((head, rest)) => {
            if let Some(toml::Value::Table(inner)) = table.get_mut(head) {
                remove_key(inner, rest);
                if inner.is_empty() {
                    table.remove(head);
                }
            }
        }
    }
}

/// Leaf values by dotted key (arrays are leaves).
pub(crate) fn flatten(table: &toml::Table) -> BTreeMap<String, toml::Value> {
    let mut out = BTreeMap::new();
    flatten_into(table, "", &mut out);
    out
}

fn flatten_into(table: &toml::Table, prefix: &str, out: &mut BTreeMap<String, toml::Value>) {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(t) => flatten_into(t, &full, out),
            v => {
                out.insert(full, v.clone());
            }
        }
    }
}

pub(super) fn leaf_keys(table: &toml::Table) -> Vec<String> {
    flatten(table).into_keys().collect()
}
