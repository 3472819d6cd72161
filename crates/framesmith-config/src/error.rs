//! `ConfigError`: file-level problems with a run config or preset (unreadable, TOML syntax, unknown key, wrong
//! value type), each naming the key and the file, with line and column where the text gives them.

use std::fmt;
use std::path::{Path, PathBuf};

/// A line and column in a TOML file, both counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// Formats an optional location as `" at line L, column C"` (or nothing).
struct At(Option<Location>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(loc) => write!(f, " at {loc}"),
            None => Ok(()),
        }
    }
}

/// Why a config or preset file could not be read, parsed or written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "this is not a TOML file: it looks like {looks_like}; give a run config, a TOML text file such as \
         run.toml: {}",
        path.display()
    )]
    NotToml {
        path: PathBuf,
        /// What the file looks like (`a video (MP4/MOV)`).
        looks_like: &'static str,
    },
    #[error("cannot write the config file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TOML syntax error{}: {message}; fix the TOML in {}", At(Some(*location)), path.display())]
    Syntax {
        path: PathBuf,
        location: Location,
        message: String,
    },
    #[error(
        "unknown key `{key}`{} ({expected}); remove it or fix its spelling or section in {}",
        At(*location),
        path.display()
    )]
    UnknownKey {
        path: PathBuf,
        /// Full dotted key, e.g. `optimizer.learnin_rate`.
        key: String,
        location: Option<Location>,
        /// The keys its section accepts, as serde words them.
        expected: String,
    },
    #[error("bad value for `{key}`{}: {message} in {}", At(*location), path.display())]
    InvalidValue {
        path: PathBuf,
        /// Full dotted key (empty when the error is not tied to one).
        key: String,
        location: Option<Location>,
        message: String,
    },
    #[error(
        "schema_version {found} is newer than this Framesmith reads ({supported}); update Framesmith or write \
         the file again from the app in {}",
        path.display()
    )]
    SchemaTooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("cannot write the config as TOML: {message}")]
    Serialize { message: String },
    #[error("unknown preset `{name}`; the presets are: {}", available.join(", "))]
    UnknownPreset {
        name: String,
        available: Vec<String>,
    },
    #[error("bad preset metadata (the `[preset]` table): {message} in {}", path.display())]
    PresetMeta { path: PathBuf, message: String },
    #[error(
        "the preset `{name}` is made for {preset_family} runs, and this run trains a {run_family} model: its \
         settings (resolution, timesteps, memory) would not suit it; pick a {run_family} preset (`framesmith \
         presets` lists them) or leave this one out"
    )]
    PresetFamily {
        name: String,
        preset_family: crate::plan::ModelFamily,
        run_family: crate::plan::ModelFamily,
    },
}

impl ConfigError {
    /// A TOML syntax error (from parsing the text into a table).
    pub fn syntax(err: &toml::de::Error, text: &str, path: &Path) -> Self {
        Self::Syntax {
            path: path.to_path_buf(),
            location: location_of(text, err.span().map_or(0, |s| s.start)),
            message: shown(err.message().trim()),
        }
    }

    /// Translates an error of deserializing well-formed TOML into the config types, given the text it came from
    /// when there is one (for line and column) and the file it was read from.
    pub fn from_toml(err: &toml::de::Error, text: Option<&str>, path: &Path) -> Self {
        let location = match (text, err.span()) {
            (Some(text), Some(span)) => Some(location_of(text, span.start)),
            _ => None,
        };
        let section = key_path(err);
        let message = shown(&friendly(err.message().trim()));
        if let Some(rest) = message.strip_prefix("unknown field `") {
            if let Some((field, tail)) = rest.split_once('`') {
                return Self::UnknownKey {
                    path: path.to_path_buf(),
                    key: shown(&join_key(&section, field)),
                    location,
                    expected: tail.trim_start_matches(',').trim().to_string(),
                };
            }
        }
        Self::InvalidValue {
            path: path.to_path_buf(),
            key: shown(&section),
            location,
            message,
        }
    }

    /// The dotted key the error is about, when it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::UnknownKey { key, .. } | Self::InvalidValue { key, .. } if !key.is_empty() => {
                Some(key)
            }
            _ => None,
        }
    }
}

/// The dotted path of tables the error happened in. `toml` keeps it privately and prints it as a trailing
/// "in `a.b`" line when it has no source text to point into, so that is where it is read from.
fn key_path(err: &toml::de::Error) -> String {
    let mut bare = err.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    shown
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("in `").and_then(|l| l.strip_suffix('`')))
        .unwrap_or_default()
        .to_string()
}

/// Longest message or key quoted from a file into an error: toml's messages quote the offending key or value,
/// which in a damaged or hostile file can be megabytes long.
const MAX_QUOTED_CHARS: usize = 300;

fn shown(text: &str) -> String {
    crate::file_read::excerpt(text, MAX_QUOTED_CHARS).into_owned()
}

/// Rewords serde messages that name Rust types instead of what to write.
fn friendly(message: &str) -> String {
    if message.contains("untagged enum BlocksToSwap") {
        return "expected a number of blocks or \"auto\"".to_string();
    }
    message.to_string()
}

fn join_key(section: &str, field: &str) -> String {
    if section.is_empty() {
        field.to_string()
    } else {
        format!("{section}.{field}")
    }
}

/// Line and column (from 1; the column counts characters) of a byte offset.
pub fn location_of(text: &str, offset: usize) -> Location {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    Location { line, column }
}
