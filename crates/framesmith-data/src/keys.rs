//! Key-by-key check of a dataset config's TOML table, so that every unknown, misplaced or badly typed key is
//! reported (serde alone stops at the first) and removed before the typed read.

use std::path::Path;

use framesmith_config::file_read::excerpt;
use serde::de::DeserializeOwned;

use super::config::{
    DatasetSection, GeneralSection, GENERAL_KEYS, IMAGE_ONLY_KEYS, SHARED_DATASET_KEYS,
    VIDEO_ONLY_KEYS,
};
use super::problem::Problem;

/// Removes from `table` every key that [`super::config::DatasetConfig`] would reject, with one problem each.
pub(crate) fn strip_bad_keys(table: &mut toml::Table, file: &Path, problems: &mut Vec<Problem>) {
    let mut bad = Vec::new();
    for (key, value) in table.iter_mut() {
        match key.as_str() {
            "general" => match value.as_table_mut() {
                Some(general) => strip_section::<GeneralSection>(
                    general,
                    "general",
                    general_allows,
                    file,
                    problems,
                ),
                None => {
                    problems.push(Problem::key_error(
                        file,
                        "general",
                        "must be a table: write it as [general]",
                    ));
                    bad.push(key.clone());
                }
            },
            list @ ("datasets" | "validation_datasets") => {
                if !strip_datasets(value, list, file, problems) {
                    bad.push(key.clone());
                }
            }
            other => {
                let hint = suggestion(other, &["general", "datasets", "validation_datasets"]);
                problems.push(Problem::key_error(
                    file,
                    other,
                    format!(
                        "unknown key; a dataset config has only [general], [[datasets]] and \
                         [[validation_datasets]]{hint}"
                    ),
                ));
                bad.push(key.clone());
            }
        }
    }
    for key in bad {
        table.remove(&key);
    }
}

/// Returns false when `list` (`datasets` or `validation_datasets`) is not an array of tables at all.
fn strip_datasets(
    value: &mut toml::Value,
    list: &str,
    file: &Path,
    problems: &mut Vec<Problem>,
) -> bool {
    let Some(array) = value.as_array_mut() else {
        problems.push(Problem::key_error(
            file,
            list,
            format!("must be written as [[{list}]] tables"),
        ));
        return false;
    };
    let mut keep = Vec::with_capacity(array.len());
    for (i, item) in array.iter_mut().enumerate() {
        let section = format!("{list}[{i}]");
        match item.as_table_mut() {
            Some(ds) => {
                let is_video =
                    ds.contains_key("video_directory") || ds.contains_key("video_jsonl_file");
                let allows = if is_video { video_allows } else { image_allows };
                strip_section::<DatasetSection>(ds, &section, allows, file, problems);
                keep.push(true);
            }
            None => {
                problems.push(Problem::key_error(
                    file,
                    section,
                    format!("must be a table: write it as [[{list}]]"),
                ));
                keep.push(false);
            }
        }
    }
    let mut flags = keep.into_iter();
    array.retain(|_| flags.next().unwrap_or(false));
    true
}

/// Why a key is not allowed in a section, or `None` when it is.
type Allows = fn(&str) -> Option<String>;

fn general_allows(key: &str) -> Option<String> {
    if GENERAL_KEYS.contains(&key) {
        None
    } else if VIDEO_ONLY_KEYS.contains(&key)
        || IMAGE_ONLY_KEYS.contains(&key)
        || SHARED_DATASET_KEYS.contains(&key)
    {
        Some("cannot be set in [general]; set it in each [[datasets]] section".into())
    } else {
        Some(format!(
            "unknown key in [general]{}",
            suggestion(key, GENERAL_KEYS)
        ))
    }
}

fn image_allows(key: &str) -> Option<String> {
    if GENERAL_KEYS.contains(&key)
        || SHARED_DATASET_KEYS.contains(&key)
        || IMAGE_ONLY_KEYS.contains(&key)
    {
        None
    } else if VIDEO_ONLY_KEYS.contains(&key) {
        Some("applies only to video datasets; this is an image dataset (no video_directory or video_jsonl_file)".into())
    } else {
        let known: Vec<&str> = [
            GENERAL_KEYS,
            SHARED_DATASET_KEYS,
            IMAGE_ONLY_KEYS,
            VIDEO_ONLY_KEYS,
        ]
        .concat();
        Some(format!("unknown key{}", suggestion(key, &known)))
    }
}

fn video_allows(key: &str) -> Option<String> {
    if GENERAL_KEYS.contains(&key)
        || SHARED_DATASET_KEYS.contains(&key)
        || VIDEO_ONLY_KEYS.contains(&key)
    {
        None
    } else if IMAGE_ONLY_KEYS.contains(&key) {
        Some("applies only to image datasets; this is a video dataset".into())
    } else {
        let known: Vec<&str> = [
            GENERAL_KEYS,
            SHARED_DATASET_KEYS,
            VIDEO_ONLY_KEYS,
            IMAGE_ONLY_KEYS,
        ]
        .concat();
        Some(format!("unknown key{}", suggestion(key, &known)))
    }
}

/// Checks each key of one section: allowed here, and its value reads as the section's type.
fn strip_section<T: DeserializeOwned>(
    table: &mut toml::Table,
    section: &str,
    allows: Allows,
    file: &Path,
    problems: &mut Vec<Problem>,
) {
    let mut bad = Vec::new();
    for (key, value) in table.iter() {
        let key_path = format!("{section}.{key}");
        if let Some(why) = allows(key) {
            problems.push(Problem::key_error(file, key_path, why));
            bad.push(key.clone());
            continue;
        }
        let mut single = toml::Table::new();
        single.insert(key.clone(), value.clone());
        if let Err(e) = single.try_into::<T>() {
            // serde names Rust types; say what a user would write instead.
            let why = expected_form(key, value).unwrap_or_else(|| {
                e.message()
                    .trim()
                    .replace("expected u32", "expected a whole number, 0 or more")
            });
            let shown = value.to_string();
            let message = format!("bad value {}: {why}", excerpt(&shown, 200));
            problems.push(Problem::key_error(file, key_path, message));
            bad.push(key.clone());
        }
    }
    for key in bad {
        table.remove(&key);
    }
}

/// What the value of `key` must be, with an example built from the value given where one can be (`"17"` for
/// `target_frames` gives `target_frames = [17]`). `None` for a key with no known form.
fn expected_form(key: &str, value: &toml::Value) -> Option<String> {
    use toml::Value;
    let number = match value {
        Value::Integer(n) => Some(*n),
        Value::String(s) => s.trim().parse().ok(),
        Value::Float(f) if f.fract() == 0.0 => Some(*f as i64),
        Value::Array(items) => match items.as_slice() {
            [Value::Integer(n)] => Some(*n),
            [Value::String(s)] => s.trim().parse().ok(),
            _ => None,
        },
        _ => None,
    }
    .filter(|n| *n >= 0);
    let form = match key {
        "target_frames" | "fp_1f_clean_indices" => format!(
            "expected a list of whole numbers; write it as {key} = [{}]",
            number.unwrap_or(1)
        ),
        "resolution" | "control_resolution" | "qwen_image_edit_control_resolution" => format!(
            "expected [width, height] (or one number for a square); write it as {key} = [960, 544]"
        ),
        "frame_extraction" => {
            "expected one of \"head\", \"chunk\", \"slide\", \"uniform\" or \"full\"; \
                               write it as frame_extraction = \"head\""
                .into()
        }
        "source_fps" => {
            "expected a number of frames per second; write it as source_fps = 30.0".into()
        }
        k if k.ends_with("_directory") || k.ends_with("_file") || k == "caption_extension" => {
            format!("expected text in quotes; write it as {key} = \"…\"")
        }
        k if k.starts_with("enable")
            || k.starts_with("bucket")
            || k.contains("no_")
            || k == "multiple_target" =>
        {
            format!("expected true or false; write it as {key} = true")
        }
        _ => format!(
            "expected a whole number, 0 or more; write it as {key} = {}",
            number.unwrap_or(1)
        ),
    };
    Some(form)
}

/// Problems of `validated` that only follow from a key `parsed` already reported and removed (a badly typed
/// `target_frames` is dropped, and validation would then say it is not set): each bad key is reported once.
pub(crate) fn without_follow_ups(parsed: &[Problem], validated: Vec<Problem>) -> Vec<Problem> {
    let rejected: Vec<&str> = parsed.iter().filter_map(|p| p.key.as_deref()).collect();
    let follows = |key: &str| {
        rejected.iter().any(|r| {
            *r == key
                || r.strip_prefix("general.")
                    .is_some_and(|field| key.ends_with(&format!(".{field}")))
        })
    };
    validated
        .into_iter()
        .filter(|p| !p.key.as_deref().is_some_and(follows))
        .collect()
}

/// `"; did you mean `x`?"` when a known key is one or two edits away.
fn suggestion(key: &str, known: &[&str]) -> String {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| format!("; did you mean `{k}`?"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("batch_siz", "batch_size"), 1);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("taget_frame", "target_frames"), 2);
        assert_eq!(
            suggestion("resolutin", GENERAL_KEYS),
            "; did you mean `resolution`?"
        );
        assert_eq!(suggestion("zzzz", GENERAL_KEYS), "");
    }

    #[test]
    fn a_badly_typed_key_says_what_to_write() {
        let file = Path::new("/d/dataset.toml");
        let mut table: toml::Table =
            "[[datasets]]\nvideo_directory = \"v\"\ntarget_frames = \"17\"\nbatch_size = \"two\"\n"
                .parse()
                .unwrap();
        let mut problems = Vec::new();
        strip_bad_keys(&mut table, file, &mut problems);
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:#?}");
        assert!(
            text.iter().any(
                |t| t.contains("datasets[0].target_frames: bad value \"17\"")
                    && t.contains("write it as target_frames = [17]")
            ),
            "{text:#?}"
        );
        assert!(
            text.iter().any(|t| t.contains("datasets[0].batch_size")
                && t.contains("write it as batch_size = 1")),
            "{text:#?}"
        );
    }

    #[test]
    fn every_listed_key_is_a_field_of_its_section() {
        for key in GENERAL_KEYS {
            let mut t = toml::Table::new();
            t.insert((*key).into(), sample_value(key));
            assert!(
                t.clone().try_into::<GeneralSection>().is_ok(),
                "{key} in general"
            );
            assert!(t.try_into::<DatasetSection>().is_ok(), "{key} in datasets");
        }
        for key in [IMAGE_ONLY_KEYS, VIDEO_ONLY_KEYS, SHARED_DATASET_KEYS].concat() {
            let mut t = toml::Table::new();
            t.insert(key.into(), sample_value(key));
            assert!(t.try_into::<DatasetSection>().is_ok(), "{key} in datasets");
        }
        let mut t = toml::Table::new();
        t.insert("no_such_key".into(), toml::Value::Integer(1));
        assert!(t.try_into::<DatasetSection>().is_err());
    }

    fn sample_value(key: &str) -> toml::Value {
        use toml::Value;
        match key {
            "resolution" | "control_resolution" | "qwen_image_edit_control_resolution" => {
                Value::Array(vec![Value::Integer(960), Value::Integer(544)])
            }
            "target_frames" | "fp_1f_clean_indices" => Value::Array(vec![Value::Integer(1)]),
            "frame_extraction" => Value::String("head".into()),
            "source_fps" => Value::Float(30.0),
            k if k.ends_with("_directory") || k.ends_with("_file") || k == "caption_extension" => {
                Value::String("x".into())
            }
            k if k.starts_with("enable")
                || k.starts_with("bucket")
                || k.contains("no_")
                || k == "multiple_target" =>
            {
                Value::Boolean(true)
            }
            _ => Value::Integer(1),
        }
    }
}
