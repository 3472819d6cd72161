//! Memory-maps safetensors files and copies the named tensors out, all at once to a device ([`load_tensors`])
//! or one at a time into host memory as a model asks for them ([`MappedTensors`]). The one `unsafe` of the
//! checkpoint reader lives here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{Device, Tensor};
use framesmith_nn::vb::TensorSource;

use super::error::ModelFormatError;

/// One tensor to load: which file, its stored name, and the official name it is returned under.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub file: usize,
    pub stored: String,
    pub name: String,
    pub dtype: String,
}

/// Maps a file into memory so tensors are copied straight from the page cache to their device, without reading
/// tens of gigabytes through an intermediate buffer.
///
/// Mapping is `unsafe` because another process could shrink or rewrite the file while it is mapped, turning
/// reads into a bus error or into changing data. Checkpoints are read-only inputs that nothing writes during a
/// load, and the header has already been validated against the file size by `header::read_header`.
#[allow(unsafe_code)]
fn map_file(path: &Path) -> candle_core::Result<MmapedSafetensors> {
    // SAFETY: see above; the mapping lives only as long as the returned value and is only read.
    unsafe { MmapedSafetensors::new(path) }
}

fn load_error(e: candle_core::Error, path: &Path) -> ModelFormatError {
    ModelFormatError::Load {
        reason: e.to_string(),
        path: path.to_path_buf(),
    }
}

/// The tensors of a checkpoint under their official names, read from the mapped files only when asked for: a
/// model built from them holds one tensor at a time in host memory on its way to where the model keeps it.
pub struct MappedTensors {
    files: Vec<PathBuf>,
    maps: Vec<MmapedSafetensors>,
    entries: HashMap<String, Entry>,
}

impl MappedTensors {
    /// Maps `files`; reads nothing yet.
    pub(crate) fn open(files: &[PathBuf], entries: &[Entry]) -> Result<Self, ModelFormatError> {
        let maps = files
            .iter()
            .map(|f| map_file(f).map_err(|e| load_error(e, f)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            files: files.to_vec(),
            maps,
            entries: entries
                .iter()
                .map(|e| (e.name.clone(), e.clone()))
                .collect(),
        })
    }

    /// Tensors in the checkpoint.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The official names, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    fn load(&self, entry: &Entry, device: &Device) -> Result<Tensor, ModelFormatError> {
        let (Some(map), Some(path)) = (self.maps.get(entry.file), self.files.get(entry.file))
        else {
            return Err(ModelFormatError::Load {
                reason: format!("no file for tensor `{}`", entry.name),
                path: self.files.first().cloned().unwrap_or_default(),
            });
        };
        if entry.dtype == "F8_E5M2" {
            return widen_e5m2(map, &entry.stored, device).map_err(|e| load_error(e, path));
        }
        map.load(&entry.stored, device)
            .map_err(|e| load_error(e, path))
    }

    /// Every tensor, on `device`, keyed by its official name.
    pub fn load_all(&self, device: &Device) -> Result<HashMap<String, Tensor>, ModelFormatError> {
        self.entries
            .iter()
            .map(|(name, entry)| Ok((name.clone(), self.load(entry, device)?)))
            .collect()
    }
}

/// A `float8_e5m2` tensor as float16, exactly: e5m2 is float16's top byte (same sign and 5-bit exponent, 2 of
/// its 10 mantissa bits), so each value widens by appending a zero byte. Candle has no e5m2 type; the run then
/// converts or quantises the f16 weights to the base format it asks for, as it does for an f16 file.
fn widen_e5m2(map: &MmapedSafetensors, name: &str, device: &Device) -> candle_core::Result<Tensor> {
    let view = map.get(name)?;
    let values: Vec<half::f16> = view
        .data()
        .iter()
        .map(|&b| half::f16::from_bits(u16::from(b) << 8))
        .collect();
    Tensor::from_vec(values, view.shape(), &Device::Cpu)?.to_device(device)
}

impl TensorSource for MappedTensors {
    fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    fn read(&self, key: &str) -> candle_core::Result<Option<Tensor>> {
        match self.entries.get(key) {
            Some(entry) => self
                .load(entry, &Device::Cpu)
                .map(Some)
                .map_err(|e| candle_core::Error::Msg(e.to_string())),
            None => Ok(None),
        }
    }
}
