//! Every tensor of one weights file that is small enough to read whole (VAE, text encoders, CLIP): safetensors or
//! the official PyTorch `.pth` files through candle's pickle reader, which never executes code. The content
//! decides the reader, not the extension. Errors name the file and say what it holds when it is not weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::{ModelFormatError, NotSafetensors};

/// Why a weights file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WeightsFileError {
    /// The path does not exist.
    #[error("weights file not found: {}", path.display())]
    NotFound { path: PathBuf },
    /// The file could not be parsed (truncated, not a tensor file, ...).
    #[error("cannot read the weights file ({reason}): {}", path.display())]
    Read {
        path: PathBuf,
        /// The reader's words, without backtrace.
        reason: String,
    },
    /// A PyTorch file the safe pickle reader cannot read, said as `framesmith inspect` says it.
    #[error(transparent)]
    Format(#[from] ModelFormatError),
    /// The file holds another model or another variant.
    #[error("{what}: {}", path.display())]
    WrongModel { path: PathBuf, what: String },
    /// The file is the right kind of model but a tensor is missing or has another shape.
    #[error("the weights do not fit the {model}: {detail}: {}", path.display())]
    Mismatch {
        path: PathBuf,
        model: &'static str,
        detail: String,
    },
}

impl WeightsFileError {
    /// A reader's error on `path`, in one line (no backtrace).
    pub fn read(path: &Path, e: &candle_core::Error) -> Self {
        Self::Read {
            path: path.to_path_buf(),
            reason: super::pickle_reason(e),
        }
    }
}

/// The weights file at `path`: the file itself, or the first of `candidates` (paths inside it) that a folder
/// holds; a folder with none is the error `missing` says.
pub fn weights_file_in(
    path: &Path,
    candidates: &[&str],
    missing: impl FnOnce() -> String,
) -> Result<PathBuf, WeightsFileError> {
    if !path.exists() {
        return Err(WeightsFileError::NotFound {
            path: path.to_path_buf(),
        });
    }
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    candidates
        .iter()
        .map(|c| path.join(c))
        .find(|p| p.is_file())
        .ok_or_else(|| WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: missing(),
        })
}

/// Why a legacy (non-zip) PyTorch pickle cannot be used.
const LEGACY_PICKLE: &str = "this is a legacy PyTorch pickle (not the zip format torch.save has written since \
                             PyTorch 1.6), which Framesmith's safe reader cannot read; use the official .pth release \
                             or a .safetensors file";

/// Every tensor of a `.safetensors` or `.pth`/`.pt`/`.ckpt` file, on the CPU, keyed by name. A `.pth` whose
/// tensors sit under a `state_dict` or `model` entry is read from there.
pub fn read_whole_file(path: &Path) -> Result<HashMap<String, Tensor>, WeightsFileError> {
    if path.is_dir() {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: "this is a folder (a diffusers layout?); give the single .safetensors or .pth weights file".into(),
        });
    }
    if !path.exists() {
        return Err(WeightsFileError::NotFound {
            path: path.to_path_buf(),
        });
    }
    let read_err = |e: candle_core::Error| WeightsFileError::read(path, &e);
    let pickle_err = |e: candle_core::Error| {
        WeightsFileError::Format(ModelFormatError::UnreadablePickle {
            reason: super::pickle_reason(&e),
            path: path.to_path_buf(),
        })
    };
    let wrong = |what: String| WeightsFileError::WrongModel {
        path: path.to_path_buf(),
        what,
    };
    // The content decides the reader, not the extension: a renamed file still reads, and a file that is not
    // weights at all (a download's error page, a Git LFS stub) is named as what it is.
    let head = super::read_head(path).map_err(|e| read_err(e.into()))?;
    if head.is_empty() {
        return Err(wrong(
            "the file is empty (an interrupted download?); download it again".into(),
        ));
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let pickle = match super::sniff_kind(&head) {
        Some(NotSafetensors::PyTorchZip) => true,
        Some(NotSafetensors::PyTorchPickle) => return Err(wrong(LEGACY_PICKLE.into())),
        Some(other) => return Err(wrong(other.to_string())),
        None if super::safetensors_header_len(&head).is_some() => false,
        None if matches!(ext.as_str(), "pth" | "pt" | "ckpt" | "bin") => true,
        None => {
            return Err(wrong(format!(
                "this is neither safetensors nor a PyTorch checkpoint (its first bytes are {}); point to the \
                 .safetensors or .pth weights",
                super::hex_prefix(&head)
            )));
        }
    };
    if !pickle {
        return candle_core::safetensors::load(path, &Device::Cpu).map_err(read_err);
    }
    let mut tensors = candle_core::pickle::read_all(path).map_err(pickle_err)?;
    for key in ["state_dict", "model"] {
        if !tensors.is_empty() {
            break;
        }
        tensors = candle_core::pickle::read_all_with_key(path, Some(key)).map_err(pickle_err)?;
    }
    Ok(tensors.into_iter().collect())
}
