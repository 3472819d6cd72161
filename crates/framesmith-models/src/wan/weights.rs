//! Checkpoint reader for the Wan DiT. Finds the safetensors files behind a path (official Wan-AI shards with or
//! without index, single files, ComfyUI files with `model.diffusion_model.` keys, FP8 files with scales), says
//! what they are ([`inspect`]) and loads their tensors under the official names ([`load`]). Headers are read and
//! validated here without touching data; data is read from the opened files as it is asked for. Knows nothing of run configs or logging.

mod detect;
mod error;
mod file_tensors;
mod header;
mod identify;
mod keys;
mod pickle;
mod report;
mod source;
mod whole;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

pub use detect::{heads_for_dim, variant_name};
pub use error::{ForeignModel, ModelFormatError, NotSafetensors};
pub use file_tensors::MappedTensors;
pub(crate) use header::{
    hex_prefix, read_head, read_header, read_tensor_data, safetensors_header_len, sniff_kind,
    TensorInfo,
};
pub use identify::{identify, ComponentReport, ModelFile};
pub use keys::official_shapes;
pub use pickle::pickle_reason;
pub use report::{Fp8Info, Fp8Scaling, HeadsSource, Layout, ModelReport, ScaleNaming};
pub use whole::{read_whole_file, weights_file_in, WeightsFileError};

use super::config::Expert;
use super::WanConfig;
use detect::{DetectError, Detected, Mismatch};
pub(crate) use file_tensors::Entry;
use header::Header;
use keys::Foreign;
pub(crate) use pickle::pth_listing;
pub(crate) use report::{dtype_label, write_size_lines};

/// Dtypes the DiT can be built from; anything else is refused by [`load`] with a message naming the tensor.
const LOADABLE_DTYPES: [&str; 6] = ["BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"];

/// A loaded checkpoint: what to build and the tensors to build it from (`T`: a map of tensors already read, or
/// the [`MappedTensors`] of an opened file, read as the model asks for them).
pub struct LoadedCheckpoint<T = HashMap<String, Tensor>> {
    /// The configuration to build: the caller's expected one when it matches the file, else the detected one.
    pub config: WanConfig,
    /// The Wan2.2 A14B expert, when the path names one.
    pub expert: Option<Expert>,
    pub report: ModelReport,
    /// Tensors under official names (`blocks.0.self_attn.q.weight`), dtypes as stored: FP8 weights stay FP8, with
    /// their scales under `<module>.scale_weight` whatever the file called them.
    pub tensors: T,
}

/// Says what the checkpoint at `path` (a file, a folder or a shard index) is, reading only headers.
pub fn inspect(path: &Path) -> Result<ModelReport, ModelFormatError> {
    Ok(scan(path)?.report)
}

/// Loads every tensor of the Wan DiT at `path` onto `device` at once (small models and tests; a run builds its
/// model from [`open`], reading one tensor at a time). Checks as [`open`] does.
pub fn load(
    path: &Path,
    expected: Option<&WanConfig>,
    device: &Device,
) -> Result<LoadedCheckpoint, ModelFormatError> {
    let opened = open(path, expected)?;
    Ok(LoadedCheckpoint {
        tensors: opened.tensors.load_all(device)?,
        config: opened.config,
        expert: opened.expert,
        report: opened.report,
    })
}

/// Opens the Wan DiT at `path`: reads and checks its headers and maps its files, reading no tensor data. With
/// `expected`, refuses a file of another task (I2V for T2V …) or size, and returns `expected` as the
/// configuration when the tensors match it (the weights cannot record `text_len`, `eps`, the heads or, for
/// T2V-14B, the generation).
pub fn open(
    path: &Path,
    expected: Option<&WanConfig>,
) -> Result<LoadedCheckpoint<MappedTensors>, ModelFormatError> {
    let scan = scan(path)?;
    let config = match expected {
        None => scan.detected.config.clone(),
        Some(expected) => {
            detect::check_expected(&scan.detected, expected).map_err(|m| mismatch_error(m, path))?
        }
    };
    if let Some(entry) = scan
        .entries
        .iter()
        .find(|e| !LOADABLE_DTYPES.contains(&e.dtype.as_str()))
    {
        return Err(ModelFormatError::UnsupportedDtype {
            tensor: entry.name.clone(),
            dtype: dtype_label(&entry.dtype),
            path: scan
                .files
                .get(entry.file)
                .cloned()
                .unwrap_or_else(|| path.to_path_buf()),
        });
    }
    // e5m2 weights widen to f16 as they are; scales beside them would be lost, so such a file is refused.
    let e5m2 = scan.entries.iter().find(|e| e.dtype == "F8_E5M2");
    if let (Some(entry), true) = (e5m2, scan.entries.iter().any(|e| keys::is_scale(&e.name))) {
        return Err(ModelFormatError::UnsupportedDtype {
            tensor: entry.name.clone(),
            dtype: "float8_e5m2 with scale tensors".into(),
            path: scan
                .files
                .get(entry.file)
                .cloned()
                .unwrap_or_else(|| path.to_path_buf()),
        });
    }
    let tensors = MappedTensors::open(&scan.files, &scan.entries)?;
    Ok(LoadedCheckpoint {
        config,
        expert: scan.detected.expert,
        report: scan.report,
        tensors,
    })
}

/// Everything learnt from the headers.
struct Scan {
    report: ModelReport,
    detected: Detected,
    files: Vec<PathBuf>,
    entries: Vec<Entry>,
}

/// The DiT tensors of a checkpoint under official names, and what was set aside.
struct Sorted<'a> {
    prefix: Option<&'static str>,
    entries: Vec<Entry>,
    official: BTreeMap<String, &'a TensorInfo>,
    has_marker: bool,
    weight_scale_names: bool,
    ignored: usize,
}

fn scan(path: &Path) -> Result<Scan, ModelFormatError> {
    let source = source::resolve(path)?;
    let headers = source
        .files
        .iter()
        .map(|f| header::read_header(f))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((index_path, weight_map)) = &source.index {
        check_index(index_path, weight_map, &source.files, &headers)?;
    }
    let stored = merge(&source.files, &headers)?;
    let sorted = sort_tensors(&stored, path)?;
    let shapes: detect::Shapes = sorted
        .official
        .iter()
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .collect();
    let hints = hints(&source, &headers);
    let config_json = source.config_json.as_ref().map(|(_, t)| t.as_str());
    let detected =
        detect::detect(&shapes, hints, config_json).map_err(|e| detect_error(e, path))?;
    let report = build_report(path, &source, &headers, &sorted, &detected);
    Ok(Scan {
        report,
        detected,
        files: source.files,
        entries: sorted.entries,
    })
}

/// Every tensor of every file by stored name; a name stored twice is an error.
fn merge<'a>(
    files: &[PathBuf],
    headers: &'a [Header],
) -> Result<BTreeMap<&'a str, (usize, &'a TensorInfo)>, ModelFormatError> {
    let mut stored: BTreeMap<&str, (usize, &TensorInfo)> = BTreeMap::new();
    for (file, header) in headers.iter().enumerate() {
        for info in &header.tensors {
            if let Some((other, _)) = stored.insert(&info.name, (file, info)) {
                let other_name = files
                    .get(other)
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                return Err(ModelFormatError::BadHeader {
                    reason: format!("tensor `{}` is also stored in `{other_name}`", info.name),
                    path: files.get(file).cloned().unwrap_or_default(),
                });
            }
        }
    }
    Ok(stored)
}

/// Recognises other models, strips the key prefix and normalises names.
fn sort_tensors<'a>(
    stored: &BTreeMap<&'a str, (usize, &'a TensorInfo)>,
    path: &Path,
) -> Result<Sorted<'a>, ModelFormatError> {
    let names: Vec<&str> = stored.keys().copied().collect();
    let prefix = keys::dit_prefix(&names);
    let stripped: Vec<&str> = names
        .iter()
        .filter_map(|n| match prefix {
            Some(p) => n.strip_prefix(p),
            None => Some(n),
        })
        .collect();
    if let Some(foreign) = keys::classify_foreign(&stripped) {
        return Err(match foreign {
            Foreign::DiffusersWan => ModelFormatError::DiffusersTransformer {
                path: path.to_path_buf(),
            },
            Foreign::Model(what) => ModelFormatError::NotTheDit {
                what,
                path: path.to_path_buf(),
            },
        });
    }
    let mut sorted = Sorted {
        prefix,
        entries: Vec::new(),
        official: BTreeMap::new(),
        has_marker: false,
        weight_scale_names: false,
        ignored: 0,
    };
    for (&stored_name, &(file, info)) in stored {
        let bare = prefix
            .and_then(|p| stored_name.strip_prefix(p))
            .unwrap_or(stored_name);
        if bare == keys::SCALED_FP8_MARKER {
            sorted.has_marker = true;
            continue;
        }
        let Some(name) = keys::normalise(stored_name, prefix) else {
            sorted.ignored += 1;
            continue;
        };
        if sorted.official.contains_key(&name) {
            continue;
        }
        sorted.weight_scale_names |= stored_name.ends_with(".weight_scale");
        sorted.entries.push(Entry {
            file,
            stored: stored_name.to_string(),
            name: name.clone(),
            dtype: info.dtype.clone(),
        });
        sorted.official.insert(name, info);
    }
    Ok(sorted)
}

/// Checks that every tensor the index places in a shard is there.
fn check_index(
    index_path: &Path,
    weight_map: &BTreeMap<String, String>,
    files: &[PathBuf],
    headers: &[Header],
) -> Result<(), ModelFormatError> {
    for (tensor, shard) in weight_map {
        let held = files
            .iter()
            .position(|f| f.file_name().and_then(|n| n.to_str()) == Some(shard.as_str()))
            .and_then(|i| headers.get(i))
            .is_some_and(|h| {
                h.tensors
                    .binary_search_by(|t| t.name.as_str().cmp(tensor))
                    .is_ok()
            });
        if !held {
            return Err(ModelFormatError::BadIndex {
                reason: format!("it places `{tensor}` in `{shard}`, which does not hold it"),
                path: index_path.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Hints from the path, the `config.json`'s `source` and the files' `modelspec.*` metadata.
fn hints(source: &source::Source, headers: &[Header]) -> source::NameHints {
    let mut hints = source.hints;
    if let Some((_, text)) = &source.config_json {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
            if let Some(s) = value.get("source").and_then(|v| v.as_str()) {
                hints = hints.or(source::hints_from_text(s));
            }
        }
    }
    for header in headers {
        for (key, value) in &header.metadata {
            if key.starts_with("modelspec.") {
                hints = hints.or(source::hints_from_text(value));
            }
        }
    }
    hints
}

fn build_report(
    path: &Path,
    source: &source::Source,
    headers: &[Header],
    sorted: &Sorted<'_>,
    detected: &Detected,
) -> ModelReport {
    let mut dtypes = BTreeMap::new();
    let mut parameter_count = 0u64;
    for (name, info) in &sorted.official {
        *dtypes.entry(info.dtype.clone()).or_insert(0) += 1;
        if !keys::is_scale(name) {
            parameter_count = parameter_count.saturating_add(info.numel());
        }
    }
    let fp8 = detect::fp8_info(
        &sorted.official,
        sorted.has_marker,
        sorted.weight_scale_names,
    );
    let mut notes = detected.notes.clone();
    if source.sharded && path.is_file() {
        notes.push("a single shard was given; the whole shard set in its folder was read".into());
    }
    if let (Some(prefix), n @ 1..) = (sorted.prefix, sorted.ignored) {
        notes.push(format!(
            "{n} tensors outside `{prefix}` (a bundled VAE or text encoder) are ignored"
        ));
    }
    if fp8.as_ref().is_some_and(|f| f.format.contains("e5m2")) {
        notes.push(
            "float8_e5m2 weights are widened to float16 on load (exactly), then converted or quantised to the \
             run's model.base_dtype"
                .into(),
        );
    }
    let layout = if source.sharded {
        Layout::Sharded {
            shards: source.files.len(),
            indexed: source.index.is_some(),
        }
    } else {
        Layout::SingleFile
    };
    ModelReport {
        path: path.to_path_buf(),
        variants: detected.names.clone(),
        config: detected.config.clone(),
        expert: detected.expert,
        heads_source: detected.heads,
        layout,
        key_prefix: sorted.prefix.map(str::to_string),
        files: source.files.clone(),
        dtypes,
        fp8,
        parameter_count,
        tensor_count: sorted.official.len(),
        bytes_on_disk: headers.iter().map(|h| h.file_bytes).sum(),
        notes,
    }
}

fn detect_error(e: DetectError, path: &Path) -> ModelFormatError {
    match e {
        DetectError::Unknown(reason) => ModelFormatError::UnknownModel {
            reason,
            path: path.to_path_buf(),
        },
        DetectError::Incomplete { variant, problem } => ModelFormatError::Incomplete {
            variant,
            problem,
            path: path.to_path_buf(),
        },
    }
}

fn mismatch_error(m: Mismatch, path: &Path) -> ModelFormatError {
    match m {
        Mismatch::Task {
            found,
            expected,
            found_kind,
        } => ModelFormatError::WrongTask {
            found,
            expected,
            found_kind,
            path: path.to_path_buf(),
        },
        Mismatch::Variant { found, expected } => ModelFormatError::WrongVariant {
            found,
            expected,
            path: path.to_path_buf(),
        },
    }
}
