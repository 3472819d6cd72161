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
}

impl Problem {
    /// An error about a file.
    pub fn error(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            key: None,
            file: Some(file.into()),
            message: message.into(),
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
        }
    }

    /// A warning about a config key in `file`.
    pub fn key_warning(file: &Path, key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::key_error(file, key, message)
        }
    }

    /// Whether this problem stops a run.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
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
}
