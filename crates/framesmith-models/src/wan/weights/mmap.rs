//! Memory-maps safetensors files and copies the named tensors out to a device. The one `unsafe` of the
//! checkpoint reader lives here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{Device, Tensor};

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

/// Loads every entry, keyed by its official name.
pub(crate) fn load_tensors(
    files: &[PathBuf],
    entries: &[Entry],
    device: &Device,
) -> Result<HashMap<String, Tensor>, ModelFormatError> {
    let load_error = |e: candle_core::Error, path: &Path| ModelFormatError::Load {
        reason: e.to_string(),
        path: path.to_path_buf(),
    };
    let maps = files
        .iter()
        .map(|f| map_file(f).map_err(|e| load_error(e, f)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tensors = HashMap::with_capacity(entries.len());
    for entry in entries {
        let (Some(map), Some(path)) = (maps.get(entry.file), files.get(entry.file)) else {
            continue;
        };
        let tensor = map
            .load(&entry.stored, device)
            .map_err(|e| load_error(e, path))?;
        tensors.insert(entry.name.clone(), tensor);
    }
    Ok(tensors)
}
