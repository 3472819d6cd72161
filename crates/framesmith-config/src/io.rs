//! Reading and writing run configs as TOML files; writes are atomic (temporary file, fsync, rename), so a crash
//! never leaves a half-written config.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::error::ConfigError;
use super::run::{RunConfig, SCHEMA_VERSION};
use super::text_file::{read_text, TextFileError};

impl RunConfig {
    /// Reads and parses a run config file. Unknown keys, wrong types and syntax errors name the key and the file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_explicit(path).map(|(config, _)| config)
    }

    /// Reads a run config file as [`RunConfig::load`] does, with the dotted keys the file sets to something other
    /// than the default: the settings a preset applied on top must leave alone. (A file that spells out a default,
    /// as configs saved whole by the app do, leaves that key to presets.)
    pub fn load_explicit(path: &Path) -> Result<(Self, BTreeSet<String>), ConfigError> {
        let text = read_toml_text(path)?;
        let config = Self::from_toml_str(&text, path)?;
        let table: toml::Table = parse_toml(&text, path)?;
        let defaults =
            toml::Table::try_from(Self::default()).map_err(|e| ConfigError::Serialize {
                message: e.to_string(),
            })?;
        let defaults = crate::presets::flatten(&defaults);
        let explicit = crate::presets::flatten(&table)
            .into_iter()
            .filter(|(key, value)| defaults.get(key) != Some(value))
            .map(|(key, _)| key)
            .collect();
        Ok((config, explicit))
    }

    /// Parses run config text; `origin` is the file name used in messages.
    pub fn from_toml_str(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        let config: Self = parse_toml(text, origin)?;
        if config.schema_version > SCHEMA_VERSION {
            return Err(ConfigError::SchemaTooNew {
                path: origin.to_path_buf(),
                found: config.schema_version,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(config)
    }

    /// The config as TOML text (every field written, so the file documents the run).
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(self).map_err(|e| ConfigError::Serialize {
            message: e.to_string(),
        })
    }

    /// Writes the config atomically: a temporary file beside `path`, fsynced, then renamed over it.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let text = self.to_toml_string()?;
        write_atomic(path, text.as_bytes()).map_err(|source| ConfigError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Reads a run config or preset file as text: special files and files over [`ReadLimit::TOML`] are refused
/// without reading them, and a binary file is named by what it looks like.
///
/// [`ReadLimit::TOML`]: crate::file_read::ReadLimit::TOML
pub(crate) fn read_toml_text(path: &Path) -> Result<String, ConfigError> {
    read_text(path).map_err(|e| match e {
        TextFileError::NotText(looks_like) => ConfigError::NotToml {
            path: path.to_path_buf(),
            looks_like,
        },
        TextFileError::Io(source) => ConfigError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// Parses TOML text into `T`: first as a plain table (syntax errors with line and column), then into `T` (unknown
/// keys and bad values, named by their dotted key).
pub(crate) fn parse_toml<T: DeserializeOwned>(text: &str, origin: &Path) -> Result<T, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::syntax(&e, text, origin))?;
    toml::from_str(text).map_err(|e| ConfigError::from_toml(&e, Some(text), origin))
}

/// Writes `bytes` to `path` through a temporary file in the same folder, fsynced before the rename (and the
/// folder fsynced after it where the platform allows), so readers see the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name")
    })?;
    // Unique per write, not only per process: two threads writing the same file must not share a temporary.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}-{write}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        // Best effort: the temporary file is ours and useless after a failure.
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_dir(&dir);
    Ok(())
}

/// Makes the rename durable. Directories cannot be opened for syncing on Windows, where the rename is already
/// journaled; elsewhere a failure here only weakens durability, not correctness.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::run::{BlocksToSwap, DeviceSpec, LrScheduler, StreamingMode};

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        let mut cfg = RunConfig::default();
        cfg.optimizer.lr_scheduler = LrScheduler::CosineWithRestarts;
        cfg.memory.streaming = StreamingMode::Staged;
        cfg.memory.blocks_to_swap = BlocksToSwap::Auto(crate::run::AutoKeyword::Auto);
        cfg.memory.vram_budget_gb = Some(20.5);
        cfg.memory.checkpointing = crate::run::Checkpointing::Attention;
        cfg.training.device = DeviceSpec::Cuda(1);
        cfg.training.max_train_epochs = Some(3);
        cfg.dataset.target_frames = Some(vec![1, 17]);
        cfg.lora.include_patterns = vec!["blocks\\.\\d+\\.self_attn".into()];
        cfg.save(&path).unwrap();
        assert_eq!(RunConfig::load(&path).unwrap(), cfg);
        // Saving again replaces the file and leaves no temporary behind.
        cfg.lora.rank = 8;
        cfg.save(&path).unwrap();
        assert_eq!(RunConfig::load(&path).unwrap().lora.rank, 8);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("run.toml")]);
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let cfg = RunConfig::from_toml_str("", Path::new("empty.toml")).unwrap();
        assert_eq!(cfg, RunConfig::default());
    }

    #[test]
    fn unknown_key_names_key_file_and_line() {
        let text = "[lora]\nrank = 8\n\n[optimizer]\nlearning_rate = 1e-4\nlearnin_rate = 2e-4\n";
        let err = RunConfig::from_toml_str(text, Path::new("/tmp/my run.toml")).unwrap_err();
        match &err {
            ConfigError::UnknownKey { key, location, .. } => {
                assert_eq!(key, "optimizer.learnin_rate");
                assert_eq!(location.map(|l| l.line), Some(6));
            }
            other => panic!("{other:?}"),
        }
        let shown = err.to_string();
        assert!(shown.contains("optimizer.learnin_rate"), "{shown}");
        assert!(shown.ends_with("/tmp/my run.toml"), "{shown}");
        assert!(
            shown.contains("learning_rate"),
            "lists the accepted keys: {shown}"
        );
    }

    #[test]
    fn unknown_top_level_key_and_section() {
        let err = RunConfig::from_toml_str("seed = 3\n", Path::new("a.toml")).unwrap_err();
        assert_eq!(err.key(), Some("seed"));
        let err =
            RunConfig::from_toml_str("[optimiser]\nlr = 1\n", Path::new("a.toml")).unwrap_err();
        assert_eq!(err.key(), Some("optimiser"));
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            (
                "[optimizer]\nlearning_rate = \"fast\"\n",
                "optimizer.learning_rate",
            ),
            (
                "[optimizer]\nlr_scheduler = \"cosin\"\n",
                "optimizer.lr_scheduler",
            ),
            ("[training]\ndevice = \"tpu\"\n", "training.device"),
            (
                "[memory]\nblocks_to_swap = \"many\"\n",
                "memory.blocks_to_swap",
            ),
            (
                "[memory]\ncheckpointing = \"none\"\n",
                "memory.checkpointing",
            ),
        ];
        for (text, key) in cases {
            let err = RunConfig::from_toml_str(text, Path::new("a.toml")).unwrap_err();
            assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
            assert_eq!(err.key(), Some(key), "{err}");
            assert!(err.to_string().ends_with("a.toml"), "{err}");
        }
        let err = RunConfig::from_toml_str(cases[3].0, Path::new("a.toml")).unwrap_err();
        assert!(
            err.to_string().contains("a number of blocks or \"auto\""),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let err =
            RunConfig::from_toml_str("[lora]\nrank = = 4\n", Path::new("b.toml")).unwrap_err();
        match err {
            ConfigError::Syntax { location, .. } => assert_eq!(location.line, 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn newer_schema_is_refused() {
        let err =
            RunConfig::from_toml_str("schema_version = 99\n", Path::new("c.toml")).unwrap_err();
        assert!(
            matches!(err, ConfigError::SchemaTooNew { found: 99, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let err = RunConfig::load(Path::new("/nonexistent/run.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains("/nonexistent/run.toml"));
    }

    #[test]
    fn qinglong_flux_is_an_alias() {
        let cfg = RunConfig::from_toml_str(
            "[training]\ntimestep_sampling = \"qinglong_flux\"\n",
            Path::new("d.toml"),
        )
        .unwrap();
        assert_eq!(
            cfg.training.timestep_sampling,
            crate::run::TimestepSampling::Qinglong
        );
    }
}
