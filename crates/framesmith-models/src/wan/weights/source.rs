//! Resolves a checkpoint path (a file, a folder, a shard index) to the safetensors files that make up one Wan DiT,
//! with what surrounds them: a `config.json` beside the weights and names that say Wan 2.2 or which expert.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::error::ModelFormatError;
use super::header::io_error;
use crate::wan::config::Expert;

/// The index file name of the official Wan-AI layout.
const OFFICIAL_INDEX: &str = "diffusion_pytorch_model.safetensors.index.json";

/// Largest `config.json` / index read; real ones are a few kilobytes to a few hundred.
const MAX_JSON_BYTES: u64 = 64 << 20;

/// Names in the path that tell what the weights are when the tensor shapes cannot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NameHints {
    pub wan21: bool,
    pub wan22: bool,
    pub expert: Option<Expert>,
}

/// The files of one checkpoint.
#[derive(Debug)]
pub(crate) struct Source {
    /// The safetensors files, in shard order.
    pub files: Vec<PathBuf>,
    /// Whether the files are shards of one model (`…-0000N-of-0000M.safetensors`).
    pub sharded: bool,
    /// The shard index and its `weight_map` (tensor name → shard file name), when there is one.
    pub index: Option<(PathBuf, BTreeMap<String, String>)>,
    /// A `config.json` beside the weights: its path and text.
    pub config_json: Option<(PathBuf, String)>,
    pub hints: NameHints,
}

/// Finds the files behind `path`.
pub(crate) fn resolve(path: &Path) -> Result<Source, ModelFormatError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(e, path))?;
    if !meta.is_dir() && !meta.is_file() {
        // A pipe or device would block or never end; weights are always plain files.
        return Err(ModelFormatError::NotAFile {
            what: framesmith_nn::file::special_kind(&meta.file_type()),
            path: path.to_path_buf(),
        });
    }
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let mut source = if meta.is_dir() {
        resolve_dir(path, None)?
    } else if file_name.ends_with(".safetensors.index.json") {
        resolve_dir(parent_of(path), Some(path.to_path_buf()))?
    } else if shard_name(file_name).is_some_and(|(_, _, total)| total > 1) {
        // One shard of a set was given: the model is the whole set.
        resolve_dir(parent_of(path), None)?
    } else {
        Source {
            files: vec![path.to_path_buf()],
            sharded: false,
            index: None,
            config_json: None,
            hints: NameHints::default(),
        }
    };
    let folder = if meta.is_dir() { path } else { parent_of(path) };
    source.config_json =
        read_small(&folder.join("config.json")).map(|t| (folder.join("config.json"), t));
    source.hints = hints_from_path(path);
    Ok(source)
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn read_small(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_JSON_BYTES {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

fn resolve_dir(dir: &Path, index: Option<PathBuf>) -> Result<Source, ModelFormatError> {
    if dir.join("model_index.json").is_file() || dir.join("transformer").is_dir() {
        return Err(ModelFormatError::DiffusersFolder {
            path: dir.to_path_buf(),
        });
    }
    let listing = list_dir(dir)?;
    let index = index.or_else(|| pick_index(dir, &listing));
    if let Some(index_path) = index {
        return resolve_indexed(dir, index_path);
    }
    let weights: Vec<&String> = listing
        .iter()
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    if weights.is_empty() {
        if dir.join("high_noise_model").is_dir() && dir.join("low_noise_model").is_dir() {
            return Err(ModelFormatError::TwoExperts {
                path: dir.to_path_buf(),
            });
        }
        let others: Vec<&str> = listing.iter().take(4).map(String::as_str).collect();
        let found = if others.is_empty() {
            String::new()
        } else {
            format!(
                " (it has {}{})",
                others.join(", "),
                if listing.len() > 4 { ", …" } else { "" }
            )
        };
        return Err(ModelFormatError::NoWeights {
            found,
            path: dir.to_path_buf(),
        });
    }
    if let [single] = weights.as_slice() {
        if shard_name(single).is_none_or(|(_, _, total)| total == 1) {
            return Ok(plain_source(vec![dir.join(single)], false, None));
        }
    }
    resolve_unindexed_shards(dir, &weights)
}

fn plain_source(
    files: Vec<PathBuf>,
    sharded: bool,
    index: Option<(PathBuf, BTreeMap<String, String>)>,
) -> Source {
    Source {
        files,
        sharded,
        index,
        config_json: None,
        hints: NameHints::default(),
    }
}

fn list_dir(dir: &Path) -> Result<Vec<String>, ModelFormatError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(e, dir))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(e, dir))?;
        if let Some(name) = entry.file_name().to_str() {
            if entry.path().is_file() {
                names.push(name.to_string());
            }
        }
    }
    names.sort();
    Ok(names)
}

fn pick_index(dir: &Path, listing: &[String]) -> Option<PathBuf> {
    if listing.iter().any(|n| n == OFFICIAL_INDEX) {
        return Some(dir.join(OFFICIAL_INDEX));
    }
    listing
        .iter()
        .find(|n| n.ends_with(".safetensors.index.json"))
        .map(|n| dir.join(n))
}

/// Splits `stem-0000N-of-0000M.safetensors` into (stem, N, M).
pub(crate) fn shard_name(name: &str) -> Option<(&str, u32, u32)> {
    let base = name.strip_suffix(".safetensors")?;
    let (left, total) = base.rsplit_once("-of-")?;
    let (stem, number) = left.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(number) || !digits(total) {
        return None;
    }
    Some((stem, number.parse().ok()?, total.parse().ok()?))
}

fn resolve_indexed(dir: &Path, index_path: PathBuf) -> Result<Source, ModelFormatError> {
    let bad = |reason: String| ModelFormatError::BadIndex {
        reason,
        path: index_path.clone(),
    };
    let text = read_small(&index_path)
        .ok_or_else(|| bad("it cannot be read as a small text file".into()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("it is not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("it has no `weight_map` object".into()))?;
    let mut weight_map = BTreeMap::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("the shard of `{tensor}` is not a file name")))?;
        // Shards live in the index's folder; a name with a path in it is not an index we wrote or downloaded.
        if Path::new(shard).file_name().and_then(|n| n.to_str()) != Some(shard) {
            return Err(bad(format!(
                "it names `{shard}`, which is not a plain file name"
            )));
        }
        weight_map.insert(tensor.clone(), shard.to_string());
    }
    if weight_map.is_empty() {
        return Err(bad("its `weight_map` is empty".into()));
    }
    let shards: BTreeSet<&String> = weight_map.values().collect();
    for shard in &shards {
        if !dir.join(shard).is_file() {
            return Err(ModelFormatError::MissingShard {
                shard: shard.to_string(),
                detail: format!("the index names {} shards", shards.len()),
                path: dir.to_path_buf(),
            });
        }
    }
    let files = shards.iter().map(|s| dir.join(s)).collect();
    Ok(plain_source(files, true, Some((index_path, weight_map))))
}

fn resolve_unindexed_shards(dir: &Path, weights: &[&String]) -> Result<Source, ModelFormatError> {
    let parsed: Vec<Option<(&str, u32, u32)>> = weights.iter().map(|n| shard_name(n)).collect();
    let first = parsed.first().copied().flatten();
    let one_set = first.is_some_and(|(stem, _, total)| {
        parsed
            .iter()
            .all(|p| p.is_some_and(|(s, _, t)| s == stem && t == total))
    });
    let Some((stem, _, total)) = first.filter(|_| one_set) else {
        let names: Vec<&str> = weights.iter().map(|s| s.as_str()).collect();
        return Err(ModelFormatError::SeveralCheckpoints {
            files: names.join(", "),
            path: dir.to_path_buf(),
        });
    };
    let present: BTreeSet<u32> = parsed.iter().flatten().map(|&(_, n, _)| n).collect();
    let width = weights
        .first()
        .and_then(|n| n.rsplit_once("-of-"))
        .map_or(5, |(_, t)| t.len().saturating_sub(".safetensors".len()));
    for n in 1..=total {
        if !present.contains(&n) {
            return Err(ModelFormatError::MissingShard {
                shard: format!("{stem}-{n:0width$}-of-{total:0width$}.safetensors"),
                detail: format!("found {} of {total} shards", present.len()),
                path: dir.to_path_buf(),
            });
        }
    }
    let files = weights.iter().map(|n| dir.join(n)).collect();
    Ok(plain_source(files, true, None))
}

/// Reads hints from the file name and the two folders above it (`Wan2.2-T2V-A14B/high_noise_model/…`).
pub(crate) fn hints_from_path(path: &Path) -> NameHints {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let tail: Vec<String> = absolute
        .components()
        .rev()
        .take(3)
        .map(|c| c.as_os_str().to_string_lossy().to_ascii_lowercase())
        .collect();
    hints_from_text(&tail.join("/"))
}

/// Hints from any text: a path, a `config.json` `source`, safetensors metadata.
pub(crate) fn hints_from_text(text: &str) -> NameHints {
    let lower = text.to_ascii_lowercase();
    let any = |pats: &[&str]| pats.iter().any(|p| lower.contains(p));
    let wan22 = any(&[
        "wan2.2", "wan2_2", "wan22", "wan-2.2", "wan_2.2", "wan 2.2", "wan2-2",
    ]);
    let wan21 = any(&[
        "wan2.1", "wan2_1", "wan21", "wan-2.1", "wan_2.1", "wan 2.1", "wan2-1",
    ]);
    let high = any(&["high_noise", "high-noise", "highnoise"]);
    let low = any(&["low_noise", "low-noise", "lownoise"]);
    let expert = match (high, low) {
        (true, false) => Some(Expert::HighNoise),
        (false, true) => Some(Expert::LowNoise),
        _ => None,
    };
    NameHints {
        wan21,
        wan22: wan22 || expert.is_some(),
        expert,
    }
}

impl NameHints {
    /// Combines two sets of hints (either may say Wan 2.2 or name the expert).
    pub fn or(self, other: NameHints) -> NameHints {
        NameHints {
            wan21: self.wan21 || other.wan21,
            wan22: self.wan22 || other.wan22,
            expert: self.expert.or(other.expert),
        }
    }
}
