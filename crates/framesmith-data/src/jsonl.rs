//! musubi-tuner's metadata JSONL files: one `{"image_path" | "video_path": ..., "caption": ...}` object per line,
//! each bad line reported with its line number.

use std::path::{Path, PathBuf};

use framesmith_config::file_read::{read_bounded, ReadLimit};
use serde_json::Value;

use super::config::{resolve_path, DatasetKind};
use super::entries::unusable_reason;
use super::problem::Problem;
use super::scan::{groups, Entry};

/// One line of a metadata JSONL file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonlItem {
    /// 1-based line number.
    pub line: usize,
    /// The media path as written (relative paths are resolved later).
    pub path: String,
    /// The caption, used as written (musubi-tuner does not trim JSONL captions).
    pub caption: String,
    /// The control images as written (`control_path`, or `control_path_0`, `control_path_1`, … in the order of
    /// their numbers, as musubi-tuner renumbers them); empty when the line names none.
    pub controls: Vec<String>,
}

/// The control paths of a JSONL object in musubi-tuner's order: `control_path` first (it becomes
/// `control_path_0`), then every `control_path_N` by its number.
fn control_paths(object: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut numbered: Vec<(u64, String)> = object
        .iter()
        .filter_map(|(k, v)| {
            let n = k.strip_prefix("control_path_")?.parse().ok()?;
            Some((n, v.as_str()?.to_string()))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| *n);
    let first = object
        .get("control_path")
        .and_then(Value::as_str)
        .map(str::to_string);
    first
        .into_iter()
        .chain(numbered.into_iter().map(|(_, p)| p))
        .collect()
}

/// Parses JSONL text: one item per non-blank line, one problem per bad line (naming `file` and the line).
pub fn parse_jsonl(text: &str, kind: DatasetKind, file: &Path) -> (Vec<JsonlItem>, Vec<Problem>) {
    let path_keys: &[&str] = match kind {
        DatasetKind::Image => &["image_path", "image_path_0"],
        DatasetKind::Video => &["video_path"],
    };
    let mut items = Vec::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| {
            Problem::error(file, format!("line {line_no}: {why}")).grouped(groups::BAD_JSONL_LINES)
        };
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                problems.push(bad(format!("not valid JSON ({e})")));
                continue;
            }
        };
        let Some(object) = value.as_object() else {
            problems.push(bad("is not a JSON object".into()));
            continue;
        };
        let path = path_keys
            .iter()
            .find_map(|k| object.get(*k).and_then(Value::as_str));
        let caption = object.get("caption").and_then(Value::as_str);
        match (path, caption) {
            (Some(path), Some(caption)) => items.push(JsonlItem {
                line: line_no,
                path: path.to_string(),
                caption: caption.to_string(),
                controls: control_paths(object),
            }),
            (None, _) => problems.push(bad(format!("has no \"{}\" string", path_keys[0]))),
            (_, None) => problems.push(bad("has no \"caption\" string".into())),
        }
    }
    (items, problems)
}

/// Reads a JSONL file into scan entries, media paths resolved against the file's folder, and reports media that
/// do not exist.
pub(crate) fn read_jsonl(
    file: &Path,
    kind: DatasetKind,
    problems: &mut Vec<Problem>,
) -> Vec<Entry> {
    let bytes = match read_bounded(file, ReadLimit::JSONL) {
        Ok(b) => b,
        Err(e) => {
            problems.push(Problem::error(
                file,
                format!("cannot read the JSONL file ({e})"),
            ));
            return Vec::new();
        }
    };
    let Ok(text) = String::from_utf8(bytes) else {
        problems.push(Problem::error(
            file,
            "the JSONL file is not UTF-8 text; save it as UTF-8",
        ));
        return Vec::new();
    };
    let (items, mut line_problems) = parse_jsonl(&text, kind, file);
    problems.append(&mut line_problems);
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let name = file
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    items
        .into_iter()
        .filter_map(|item| {
            let media: PathBuf = resolve_path(&base, Path::new(&item.path));
            // A dangling symbolic link is there but leads nowhere: it is reported as a link, below.
            if std::fs::symlink_metadata(&media).is_err() {
                problems.push(
                    Problem::error(
                        &media,
                        format!(
                            "is listed on line {} of {name} but does not exist",
                            item.line
                        ),
                    )
                    .grouped(groups::MISSING_LISTED_MEDIA),
                );
                return None;
            }
            // A video may be a folder of frames.
            let unusable = unusable_reason(&media, kind, kind == DatasetKind::Video);
            Some(Entry {
                media,
                caption: Some(item.caption),
                unusable,
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn documented_lines_parse() {
        let text = r#"{"image_path": "/path/to/image1.jpg", "caption": "A caption for image1"}
{"image_path": "/path/to/image2.jpg", "caption": "A caption for image2"}
"#;
        let (items, problems) = parse_jsonl(text, DatasetKind::Image, Path::new("m.jsonl"));
        assert!(problems.is_empty());
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].path, "/path/to/image2.jpg");
        assert_eq!(items[1].caption, "A caption for image2");
        let video = r#"{"video_path": "/v/1.mp4", "control_path": "/c/1.mp4", "caption": "x"}"#;
        let (items, _) = parse_jsonl(video, DatasetKind::Video, Path::new("m.jsonl"));
        assert_eq!(items[0].path, "/v/1.mp4");
    }

    #[test]
    fn control_paths_come_in_musubi_tuners_order() {
        let text = r#"{"image_path": "a.png", "control_path_10": "c10.png", "control_path_2": "c2.png", "caption": "x"}
{"image_path": "b.png", "control_path": "c.png", "caption": "y"}
{"image_path": "d.png", "caption": "z"}"#;
        let (items, problems) = parse_jsonl(text, DatasetKind::Image, Path::new("m.jsonl"));
        assert!(problems.is_empty());
        assert_eq!(items[0].controls, ["c2.png", "c10.png"]);
        assert_eq!(items[1].controls, ["c.png"]);
        assert!(items[2].controls.is_empty());
    }

    #[test]
    fn every_bad_line_is_reported_with_its_number() {
        let text = "{\"image_path\": \"a.png\"}\n\nnot json\n[1]\n{\"caption\": \"c\"}\n{\"image_path_0\": \"b.png\", \"caption\": \"ok\"}\n";
        let (items, problems) = parse_jsonl(text, DatasetKind::Image, Path::new("/d/m.jsonl"));
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].line, 6);
        let msgs: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(msgs.len(), 4, "{msgs:#?}");
        assert!(msgs[0].contains("line 1: has no \"caption\""), "{msgs:#?}");
        assert!(msgs[1].contains("line 3: not valid JSON"), "{msgs:#?}");
        assert!(
            msgs[2].contains("line 4: is not a JSON object"),
            "{msgs:#?}"
        );
        assert!(
            msgs[3].contains("line 5: has no \"image_path\""),
            "{msgs:#?}"
        );
        assert!(msgs.iter().all(|m| m.ends_with("/d/m.jsonl")));
    }
}
