//! One problem found in a dataset config or its media: what is wrong, how bad it is, and which key or file.

use std::fmt;
use std::path::{Path, PathBuf};

use framesmith_config::file_read::excerpt;

/// How bad a [`Problem`] is. Errors stop a training run; warnings are shown and the run goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The run would fail or train on something the user did not mean.
    Error,
    /// Worth knowing (musubi-tuner would silently do something), but training can go on.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// A problem with a dataset: the config key (`datasets[1].target_frames`) and/or the file it concerns.
///
/// Displayed as `error: datasets[1].target_frames: 27 is not N*4+1 ...: /data/dataset.toml`, file path last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Error or warning.
    pub severity: Severity,
    /// Config key path, `general.resolution` or `datasets[0].frame_extraction`, when the problem is in the config.
    pub key: Option<String>,
    /// The file the problem is about: the config file, a media file, a caption or a JSONL file.
    pub file: Option<PathBuf>,
    /// What is wrong and, where there is one, the fix.
    pub message: String,
    /// For a problem that can repeat for every file of a dataset: what many of them are called together
    /// (`unreadable images`), so that thousands print as one line ([`summary_lines`]).
    pub group: Option<&'static str>,
}

impl Problem {
    /// An error about a file.
    pub fn error(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            key: None,
            file: Some(file.into()),
            message: message.into(),
            group: None,
        }
    }

    /// A warning about a file.
    pub fn warning(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(file, message)
        }
    }

    /// An error about a config key in `file`.
    pub fn key_error(file: &Path, key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            key: Some(key.into()),
            file: Some(file.to_path_buf()),
            message: message.into(),
            group: None,
        }
    }

    /// A warning about a config key in `file`.
    pub fn key_warning(file: &Path, key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::key_error(file, key, message)
        }
    }

    /// The problem as one of many of its kind (see [`Problem::group`]).
    pub fn grouped(self, group: &'static str) -> Self {
        Self {
            group: Some(group),
            ..self
        }
    }

    /// Whether this problem stops a run.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// What becomes of dataset entries that cannot be read (a dangling link, a FIFO, a file that does not decode, an
/// unreadable caption): by default each is an error and nothing trains until it is fixed or removed; with
/// `skip_unreadable` (the run config's `[dataset]`, or `--skip-unreadable`) each is a counted warning and the entry is
/// left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unreadable {
    /// Each unreadable entry is an error.
    #[default]
    Refuse,
    /// Each unreadable entry is a warning, and the entry is left out.
    Skip,
}

impl Unreadable {
    /// `Skip` when `skip` is set.
    pub fn skip_if(skip: bool) -> Self {
        if skip {
            Self::Skip
        } else {
            Self::Refuse
        }
    }

    /// `problems` with the errors about entries that cannot be read made warnings when skipping, each saying the
    /// entry is left out; refusing, each such error says how to leave it out instead. Other problems are kept.
    pub fn apply(self, problems: Vec<Problem>) -> Vec<Problem> {
        problems
            .into_iter()
            .map(|p| {
                if !p.is_error() || !p.group.is_some_and(is_unreadable_group) {
                    return p;
                }
                match self {
                    Self::Skip => Problem {
                        severity: Severity::Warning,
                        message: format!("{}; left out (skip_unreadable)", p.message),
                        ..p
                    },
                    Self::Refuse => Problem {
                        message: format!("{}{SKIP_HINT}", p.message),
                        ..p
                    },
                }
            })
            .collect()
    }
}

/// How to train on the rest when some entries cannot be read.
const SKIP_HINT: &str =
    " (or set skip_unreadable = true under [dataset] in the run config, or pass \
                         --skip-unreadable, to leave such entries out with a warning)";

/// Groups of problems about an entry that cannot be read at all.
fn is_unreadable_group(group: &str) -> bool {
    use crate::scan::groups;
    [
        groups::UNUSABLE_ENTRIES,
        groups::UNREADABLE_MEDIA,
        groups::UNREADABLE_CAPTIONS,
        groups::MISSING_LISTED_MEDIA,
    ]
    .contains(&group)
}

/// Longest key and message shown: both can quote a file (an unknown key, a bad value, a JSONL line), which in a
/// damaged or hostile file can be megabytes long.
const MAX_SHOWN_KEY_CHARS: usize = 200;
const MAX_SHOWN_MESSAGE_CHARS: usize = 1000;

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.severity)?;
        if let Some(key) = &self.key {
            write!(f, "{}: ", excerpt(key, MAX_SHOWN_KEY_CHARS))?;
        }
        f.write_str(&excerpt(&self.message, MAX_SHOWN_MESSAGE_CHARS))?;
        if let Some(file) = &self.file {
            write!(f, ": {}", file.display())?;
        }
        Ok(())
    }
}

/// Files of a group named one by one before the rest are counted.
const GROUP_SHOWN_FILES: usize = 3;
/// Problems of a group listed one per line; more than this share one line.
const GROUP_LISTED_MAX: usize = 5;

/// Problems share a line when they have the same severity and group.
type GroupKey = (Severity, &'static str);

/// `problems` as lines to print: each on its own, except that more than a handful of one group (and severity) become
/// one line with their count, the first in full and the next few files, so 10,000 unreadable files print as one
/// line, not 10,000. Lines keep the order in which each problem or group first appears.
pub fn summary_lines(problems: &[Problem]) -> Vec<String> {
    let mut groups: Vec<(Option<GroupKey>, Vec<&Problem>)> = Vec::new();
    for p in problems {
        let key = p.group.map(|g| (p.severity, g));
        match groups.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, members)) => members.push(p),
            None => groups.push((key, vec![p])),
        }
    }
    let mut lines = Vec::new();
    for (key, members) in groups {
        match key {
            Some((severity, group)) if members.len() > GROUP_LISTED_MAX => {
                lines.push(group_line(severity, group, &members));
            }
            _ => lines.extend(members.iter().map(ToString::to_string)),
        }
    }
    lines
}

fn group_line(severity: Severity, group: &str, members: &[&Problem]) -> String {
    let files: Vec<String> = members
        .iter()
        .skip(1)
        .take(GROUP_SHOWN_FILES - 1)
        .filter_map(|p| p.file.as_ref().map(|f| f.display().to_string()))
        .collect();
    let rest = members.len() - 1 - files.len();
    format!(
        "{severity}: {} {group}; the first: {}; also {} and {rest} more",
        members.len(),
        members[0]
            .to_string()
            .trim_start_matches(&format!("{severity}: ")),
        files.join(", ")
    )
}

/// Number of errors in `problems`.
pub fn error_count(problems: &[Problem]) -> usize {
    problems.iter().filter(|p| p.is_error()).count()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn display_puts_key_first_and_file_last() {
        let p = Problem::key_error(
            Path::new("/d/ds.toml"),
            "datasets[0].batch_size",
            "must be at least 1",
        );
        assert_eq!(
            p.to_string(),
            "error: datasets[0].batch_size: must be at least 1: /d/ds.toml"
        );
        let w = Problem::warning("/d/a.png", "no caption");
        assert_eq!(w.to_string(), "warning: no caption: /d/a.png");
        assert_eq!(error_count(&[p, w]), 1);
    }

    #[test]
    fn many_problems_of_one_group_print_as_one_line() {
        let mut problems = vec![Problem::key_error(Path::new("/d/ds.toml"), "k", "bad")];
        for i in 0..10_000 {
            problems.push(
                Problem::error(
                    format!("/d/{i}.png"),
                    format!("cannot read the image (bad {i})"),
                )
                .grouped("unreadable images"),
            );
            problems
                .push(Problem::warning(format!("/d/{i}.png"), "no caption").grouped("uncaptioned"));
        }
        problems.push(Problem::warning("/d/x.mp4", "one of a kind").grouped("rare"));
        let lines = summary_lines(&problems);
        assert_eq!(
            lines,
            [
                "error: k: bad: /d/ds.toml",
                "error: 10000 unreadable images; the first: cannot read the image (bad 0): /d/0.png; also /d/1.png, \
                 /d/2.png and 9997 more",
                "warning: 10000 uncaptioned; the first: no caption: /d/0.png; also /d/1.png, /d/2.png and 9997 more",
                "warning: one of a kind: /d/x.mp4",
            ]
        );
    }

    #[test]
    fn huge_quoted_text_is_cut_short() {
        let p = Problem::key_error(
            Path::new("/d/ds.toml"),
            "k".repeat(5000),
            "v".repeat(1 << 20),
        );
        assert!(p.to_string().len() < 2000, "{}", p.to_string().len());
        assert!(p.to_string().ends_with("/d/ds.toml"));
    }
}
