//! Reads the named tensors of safetensors files, all at once to a device ([`MappedTensors::load_all`]) or one at
//! a time into host memory as a model asks for them ([`MappedTensors`] as a [`TensorSource`]). Each tensor is read
//! at its offset straight into the buffer the tensor then owns, large ones by several threads: the files are
//! never memory-mapped, so their pages stay in the page cache (kept for the next run, dropped by the kernel when
//! it needs the room) instead of counting in the process's resident memory, as a mapping's pages do for as long as
//! it lives.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use framesmith_nn::file::{open_regular, read_exact_at};
use framesmith_nn::vb::TensorSource;
use rayon::prelude::*;

use super::error::ModelFormatError;
use super::header::{io_error, read_header, TensorInfo};

/// One tensor to load: which file, its stored name, and the official name it is returned under.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub file: usize,
    pub stored: String,
    pub name: String,
    pub dtype: String,
}

/// Tensors larger than this are read by several threads, a part of this size each.
const READ_PART_BYTES: usize = 8 << 20;

/// An opened checkpoint file.
struct OpenFile {
    path: PathBuf,
    file: File,
}

/// Where an entry's data lies.
struct Located {
    file: usize,
    info: TensorInfo,
}

/// The tensors of a checkpoint under their official names, read from the opened files only when asked for: a
/// model built from them holds one tensor at a time in host memory on its way to where the model keeps it.
pub struct MappedTensors {
    files: Vec<OpenFile>,
    entries: HashMap<String, Located>,
}

impl MappedTensors {
    /// Opens `files` and reads their headers; reads no tensor data yet.
    pub(crate) fn open(files: &[PathBuf], entries: &[Entry]) -> Result<Self, ModelFormatError> {
        let mut opened = Vec::with_capacity(files.len());
        let mut headers = Vec::with_capacity(files.len());
        for path in files {
            let file = open_regular(path).map_err(|e| io_error(e, path))?;
            headers.push(read_header(path)?);
            opened.push(OpenFile {
                path: path.clone(),
                file,
            });
        }
        let mut located = HashMap::with_capacity(entries.len());
        for entry in entries {
            let info = headers.get(entry.file).and_then(|h| {
                h.tensors
                    .binary_search_by(|t| t.name.as_str().cmp(&entry.stored))
                    .ok()
                    .and_then(|i| h.tensors.get(i))
            });
            let Some(info) = info else {
                return Err(ModelFormatError::Load {
                    reason: format!("the file holds no tensor `{}`", entry.stored),
                    path: files.get(entry.file).cloned().unwrap_or_default(),
                });
            };
            located.insert(
                entry.name.clone(),
                Located {
                    file: entry.file,
                    info: info.clone(),
                },
            );
        }
        Ok(Self {
            files: opened,
            entries: located,
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

    fn file_of(&self, located: &Located) -> Result<&OpenFile, ModelFormatError> {
        self.files
            .get(located.file)
            .ok_or_else(|| ModelFormatError::Load {
                reason: format!("no file for tensor `{}`", located.info.name),
                path: self
                    .files
                    .first()
                    .map(|f| f.path.clone())
                    .unwrap_or_default(),
            })
    }

    /// The tensor `located` as stored, in host memory.
    fn load(&self, located: &Located) -> Result<Tensor, ModelFormatError> {
        let file = self.file_of(located)?;
        read_tensor(file, &located.info)
    }

    /// Every tensor, on `device`, keyed by its official name.
    pub fn load_all(&self, device: &Device) -> Result<HashMap<String, Tensor>, ModelFormatError> {
        self.entries
            .iter()
            .map(|(name, located)| {
                let file = self.file_of(located)?;
                let tensor = self
                    .load(located)?
                    .to_device(device)
                    .map_err(|e| load_error(&e, &file.path))?;
                Ok((name.clone(), tensor))
            })
            .collect()
    }
}

fn load_error(e: &candle_core::Error, path: &Path) -> ModelFormatError {
    ModelFormatError::Load {
        reason: e.to_string(),
        path: path.to_path_buf(),
    }
}

/// The tensor `info` of `file` as stored (dtype and shape), in host memory. `float8_e5m2` widens to float16
/// exactly: e5m2 is float16's top byte (same sign and 5-bit exponent, 2 of its 10 mantissa bits). Candle has no
/// e5m2 type; the run then converts or quantises the f16 weights to the base format it asks for.
fn read_tensor(file: &OpenFile, info: &TensorInfo) -> Result<Tensor, ModelFormatError> {
    let shape = info.shape.as_slice();
    let tensor = match info.dtype.as_str() {
        "U8" | "U16" | "U32" | "I16" | "I32" | "I64" => return read_integers(file, info),
        "F8_E4M3" => Tensor::from_vec(
            in_place(read_words::<u8>(file, info)?, float8::F8E4M3::from_bits),
            shape,
            &Device::Cpu,
        ),
        "F8_E5M2" => Tensor::from_vec(
            read_words::<u8>(file, info)?
                .into_par_iter()
                .map(|b| half::f16::from_bits(u16::from(b) << 8))
                .collect::<Vec<_>>(),
            shape,
            &Device::Cpu,
        ),
        "BF16" => Tensor::from_vec(
            in_place(read_words::<u16>(file, info)?, |w| {
                half::bf16::from_bits(u16::from_le(w))
            }),
            shape,
            &Device::Cpu,
        ),
        "F16" => Tensor::from_vec(
            in_place(read_words::<u16>(file, info)?, |w| {
                half::f16::from_bits(u16::from_le(w))
            }),
            shape,
            &Device::Cpu,
        ),
        "F32" => Tensor::from_vec(
            in_place(read_words::<u32>(file, info)?, |w| {
                f32::from_bits(u32::from_le(w))
            }),
            shape,
            &Device::Cpu,
        ),
        "F64" => Tensor::from_vec(
            in_place(read_words::<u64>(file, info)?, |w| {
                f64::from_bits(u64::from_le(w))
            }),
            shape,
            &Device::Cpu,
        ),
        "F6_E2M3" | "F6_E3M2" | "F4" | "F8_E8M0" => {
            let dtype = match info.dtype.as_str() {
                "F6_E2M3" => DType::F6E2M3,
                "F6_E3M2" => DType::F6E3M2,
                "F4" => DType::F4,
                _ => DType::F8E8M0,
            };
            Tensor::from_raw_buffer(&read_words::<u8>(file, info)?, dtype, shape, &Device::Cpu)
        }
        other => {
            return Err(ModelFormatError::UnsupportedDtype {
                tensor: info.name.clone(),
                dtype: super::dtype_label(other),
                path: file.path.clone(),
            })
        }
    };
    tensor.map_err(|e| load_error(&e, &file.path))
}

/// An integer tensor `info` of `file` (16-bit unsigned words widen to 32 bits, as candle reads them).
fn read_integers(file: &OpenFile, info: &TensorInfo) -> Result<Tensor, ModelFormatError> {
    let shape = info.shape.as_slice();
    let tensor = match info.dtype.as_str() {
        "U8" => Tensor::from_vec(read_words::<u8>(file, info)?, shape, &Device::Cpu),
        "U16" => Tensor::from_vec(
            read_words::<u16>(file, info)?
                .into_iter()
                .map(|w| u32::from(u16::from_le(w)))
                .collect::<Vec<_>>(),
            shape,
            &Device::Cpu,
        ),
        "U32" => Tensor::from_vec(
            in_place(read_words::<u32>(file, info)?, u32::from_le),
            shape,
            &Device::Cpu,
        ),
        "I16" => Tensor::from_vec(
            in_place(read_words::<i16>(file, info)?, i16::from_le),
            shape,
            &Device::Cpu,
        ),
        "I32" => Tensor::from_vec(
            in_place(read_words::<i32>(file, info)?, i32::from_le),
            shape,
            &Device::Cpu,
        ),
        "I64" => Tensor::from_vec(
            in_place(read_words::<i64>(file, info)?, i64::from_le),
            shape,
            &Device::Cpu,
        ),
        other => {
            return Err(ModelFormatError::UnsupportedDtype {
                tensor: info.name.clone(),
                dtype: super::dtype_label(other),
                path: file.path.clone(),
            })
        }
    };
    tensor.map_err(|e| load_error(&e, &file.path))
}

/// The FP8 codes of `info` as their bytes, `U8` of the stored shape, read straight into the tensor's buffer.
fn read_fp8_codes(file: &OpenFile, info: &TensorInfo) -> Result<Tensor, ModelFormatError> {
    let bytes = read_words::<u8>(file, info)?;
    Tensor::from_vec(bytes, info.shape.as_slice(), &Device::Cpu)
        .map_err(|e| load_error(&e, &file.path))
}

/// `words` turned into another type of the same size, in the same buffer.
fn in_place<W, T>(words: Vec<W>, f: impl Fn(W) -> T) -> Vec<T> {
    words.into_iter().map(f).collect()
}

/// The data of `info` as little-endian words of type `W` (their count from the data's length), read at the
/// tensor's offset into a zeroed buffer of its size; large tensors by several threads, a part each.
fn read_words<W: bytemuck::Pod + Send>(
    file: &OpenFile,
    info: &TensorInfo,
) -> Result<Vec<W>, ModelFormatError> {
    let size = std::mem::size_of::<W>();
    let len = usize::try_from(info.len_bytes)
        .ok()
        .filter(|len| len % size == 0)
        .ok_or_else(|| ModelFormatError::BadHeader {
            reason: format!(
                "tensor `{}` has {} bytes, not a whole number of its {}-byte elements",
                info.name, info.len_bytes, size
            ),
            path: file.path.clone(),
        })?;
    let mut words = vec![W::zeroed(); len / size];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
    let read = |(i, part): (usize, &mut [u8])| {
        let offset = (i * READ_PART_BYTES) as u64;
        read_exact_at(&file.file, part, info.data_start + offset)
    };
    let done: io::Result<()> = if bytes.len() <= READ_PART_BYTES {
        read((0, bytes))
    } else {
        bytes
            .par_chunks_mut(READ_PART_BYTES)
            .enumerate()
            .try_for_each(read)
    };
    done.map_err(|e| read_failed(e, info, &file.path))?;
    Ok(words)
}

/// A read that failed: a file that ends early was changed after its header was read.
fn read_failed(e: io::Error, info: &TensorInfo, path: &Path) -> ModelFormatError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ModelFormatError::Truncated {
            detail: format!(
                "tensor `{}` ends past its end, so it was shortened or replaced after it was opened",
                info.name
            ),
            path: path.to_path_buf(),
        }
    } else {
        io_error(e, path)
    }
}

impl TensorSource for MappedTensors {
    fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    fn read(&self, key: &str) -> candle_core::Result<Option<Tensor>> {
        match self.entries.get(key) {
            Some(located) => self
                .load(located)
                .map(Some)
                .map_err(|e| candle_core::Error::Msg(e.to_string())),
            None => Ok(None),
        }
    }

    fn read_fp8_codes(&self, key: &str) -> candle_core::Result<Option<Tensor>> {
        match self.entries.get(key) {
            Some(located) if located.info.dtype == "F8_E4M3" => self
                .file_of(located)
                .and_then(|file| read_fp8_codes(file, &located.info))
                .map(Some)
                .map_err(|e| candle_core::Error::Msg(e.to_string())),
            _ => Ok(None),
        }
    }
}
