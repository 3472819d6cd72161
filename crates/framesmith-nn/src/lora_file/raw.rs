//! An adapter file's tensors exactly as stored (names, dtypes, values) and its metadata, for the tools that
//! rename, split or rewrite them (`framesmith lora convert`, `resize`), and writing such a set back with the
//! project's deterministic, atomic writer.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, SafeTensors};

use super::{set::write_atomically, sorted_write, tensor_from_view, FileResult, LoraFileError};

/// A file's tensors (sorted by name) in their stored dtypes, on the CPU, and its string metadata.
#[derive(Clone, Debug, Default)]
pub struct RawTensors {
    pub tensors: Vec<(String, Tensor)>,
    pub metadata: HashMap<String, String>,
}

impl RawTensors {
    /// Reads every tensor of the safetensors file at `path` (f32, f16, bf16 or f64) with its metadata.
    pub fn read(path: &Path) -> FileResult<Self> {
        let bytes =
            crate::file::read_regular(path, u64::MAX).map_err(|source| LoraFileError::Io {
                action: "read",
                path: path.to_path_buf(),
                source,
            })?;
        let format_err = |e: safetensors::SafeTensorError| LoraFileError::Format {
            reason: e.to_string(),
            path: path.to_path_buf(),
        };
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(format_err)?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).map_err(format_err)?;
        let mut tensors = Vec::new();
        for (key, view) in st.tensors() {
            let t = tensor_from_view(&view, &Device::Cpu).map_err(|reason| {
                LoraFileError::UnsupportedKey {
                    key: key.clone(),
                    reason,
                    path: path.to_path_buf(),
                }
            })?;
            tensors.push((key, t));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self { tensors, metadata })
    }

    /// The tensor named `key`.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == key).map(|(_, t)| t)
    }

    /// Writes the tensors, each in its own dtype (f32, f16 or bf16), and the metadata to `path`: the bytes
    /// depend only on the contents, and an existing file is replaced only once the new one is complete.
    pub fn write(&self, path: &Path) -> FileResult<()> {
        let mut entries = Vec::with_capacity(self.tensors.len());
        for (key, t) in &self.tensors {
            let dtype = match t.dtype() {
                DType::F32 => StDtype::F32,
                DType::F16 => StDtype::F16,
                DType::BF16 => StDtype::BF16,
                other => return Err(LoraFileError::SaveDtype(other)),
            };
            let t = t.to_device(&Device::Cpu)?;
            let bytes = crate::bytes::tensor_bytes(&t)?;
            entries.push((key.clone(), dtype, t.dims().to_vec(), bytes));
        }
        write_atomically(path, |tmp| {
            sorted_write::write_sorted(tmp, &entries, &self.metadata).map_err(|source| {
                LoraFileError::Io {
                    action: "write",
                    path: path.to_path_buf(),
                    source,
                }
            })
        })
    }
}
