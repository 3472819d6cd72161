//! Reading and writing small safetensors files with string metadata (musubi-tuner's cache files): candle
//! tensors in, candle tensors out, written to a temporary file, synced and renamed so a crash leaves no half file.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, SafeTensors, View};

/// A cache file could not be read or written, or does not hold what its format promises.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Reading, writing or renaming failed.
    #[error("cannot {action} the cache file: {path}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The cache file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid safetensors file, or its content is not what the cache format says.
    #[error("the cache file is damaged or not a cache of the layout musubi-tuner writes ({message}): {path}")]
    Format {
        /// What is wrong.
        message: String,
        /// The cache file.
        path: PathBuf,
    },
}

pub(crate) fn format_error(path: &Path, message: impl Into<String>) -> CacheError {
    CacheError::Format {
        message: message.into(),
        path: path.to_path_buf(),
    }
}

/// PyTorch's name for a dtype, as musubi-tuner puts it at the end of cache keys (`latents_..._bfloat16`).
pub fn torch_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::U8 => "uint8",
        DType::U32 => "uint32",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F8E4M3 => "float8_e4m3fn",
        _ => "unknown",
    }
}

/// Dtype names PyTorch can write, longest first so `float8_e4m3fn` wins over shorter suffixes.
const TORCH_DTYPE_NAMES: &[&str] = &[
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3fn",
    "float8_e8m0fnu",
    "float8_e5m2",
    "complex128",
    "complex64",
    "complex32",
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "uint16",
    "uint32",
    "uint64",
    "uint8",
    "int16",
    "int32",
    "int64",
    "int8",
    "bool",
];

/// A cache key without its `_<dtype>` suffix (musubi-tuner's `remove_dtype_suffix`); unchanged without one.
pub fn strip_dtype_suffix(key: &str) -> &str {
    TORCH_DTYPE_NAMES
        .iter()
        .find_map(|name| key.strip_suffix(name).and_then(|k| k.strip_suffix('_')))
        .unwrap_or(key)
}

/// A tensor as little-endian bytes, ready for safetensors.
pub(crate) struct RawTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn le_bytes<T: candle_core::WithDType, const N: usize>(
    t: &Tensor,
    to_bytes: fn(T) -> [u8; N],
) -> candle_core::Result<Vec<u8>> {
    Ok(t.flatten_all()?
        .to_vec1::<T>()?
        .into_iter()
        .flat_map(to_bytes)
        .collect())
}

impl RawTensor {
    /// Copies `t` to the CPU as bytes. NaNs in float tensors become 0, as musubi-tuner does before saving;
    /// returns whether any were found.
    pub(crate) fn from_tensor(t: &Tensor, path: &Path) -> Result<(Self, bool), CacheError> {
        let err = |e: candle_core::Error| format_error(path, format!("cannot copy a tensor: {e}"));
        let (dtype, mut data) = match t.dtype() {
            DType::BF16 => (
                Dtype::BF16,
                le_bytes(t, |v: half::bf16| v.to_le_bytes()).map_err(err)?,
            ),
            DType::F16 => (
                Dtype::F16,
                le_bytes(t, |v: half::f16| v.to_le_bytes()).map_err(err)?,
            ),
            DType::F32 => (Dtype::F32, le_bytes(t, f32::to_le_bytes).map_err(err)?),
            DType::F64 => (Dtype::F64, le_bytes(t, f64::to_le_bytes).map_err(err)?),
            DType::I32 => (Dtype::I32, le_bytes(t, i32::to_le_bytes).map_err(err)?),
            DType::I64 => (Dtype::I64, le_bytes(t, i64::to_le_bytes).map_err(err)?),
            DType::U32 => (Dtype::U32, le_bytes(t, u32::to_le_bytes).map_err(err)?),
            DType::U8 => (Dtype::U8, le_bytes(t, |v: u8| [v]).map_err(err)?),
            other => {
                return Err(format_error(
                    path,
                    format!("cannot store {other:?} tensors in a cache"),
                ))
            }
        };
        let had_nan = zero_nans(dtype, &mut data);
        Ok((
            Self {
                dtype,
                shape: t.dims().to_vec(),
                data,
            },
            had_nan,
        ))
    }
}

/// Replaces NaN bit patterns by +0 in place; returns whether there were any.
fn zero_nans(dtype: Dtype, data: &mut [u8]) -> bool {
    let mut found = false;
    match dtype {
        Dtype::BF16 | Dtype::F16 => {
            let (exp, man) = if dtype == Dtype::BF16 {
                (0x7f80, 0x007f)
            } else {
                (0x7c00, 0x03ff)
            };
            for c in data.chunks_exact_mut(2) {
                let bits = u16::from_le_bytes([c[0], c[1]]);
                if bits & exp == exp && bits & man != 0 {
                    c.fill(0);
                    found = true;
                }
            }
        }
        Dtype::F32 => {
            for c in data.chunks_exact_mut(4) {
                if f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_nan() {
                    c.fill(0);
                    found = true;
                }
            }
        }
        Dtype::F64 => {
            for c in data.chunks_exact_mut(8) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                if f64::from_le_bytes(b).is_nan() {
                    c.fill(0);
                    found = true;
                }
            }
        }
        _ => {}
    }
    found
}

fn candle_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::I16 => DType::I16,
        Dtype::U32 => DType::U32,
        Dtype::U8 => DType::U8,
        // A mask saved as torch.bool: one byte of 0 or 1, as U8.
        Dtype::BOOL => DType::U8,
        Dtype::F8_E4M3 => DType::F8E4M3,
        _ => return None,
    })
}

/// The whole of a regular file: a FIFO or device in a cache folder is refused rather than read forever.
fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = framesmith_config::file_read::open_regular(path)?;
    let mut bytes = Vec::with_capacity(usize::try_from(file.metadata()?.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// All tensors and the metadata of a safetensors file.
pub struct TensorFile {
    pub tensors: HashMap<String, Tensor>,
    pub metadata: HashMap<String, String>,
}

/// Reads every tensor of a safetensors file onto `device`, with its metadata.
pub fn read_tensor_file(path: &Path, device: &Device) -> Result<TensorFile, CacheError> {
    let bytes = read_regular(path).map_err(|source| CacheError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format_error(path, e.to_string()))?;
    let (_, header) =
        SafeTensors::read_metadata(&bytes).map_err(|e| format_error(path, e.to_string()))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = candle_dtype(view.dtype()).ok_or_else(|| {
            format_error(
                path,
                format!("tensor {name} has unsupported dtype {:?}", view.dtype()),
            )
        })?;
        let t = Tensor::from_raw_buffer(view.data(), dtype, view.shape(), device)
            .map_err(|e| format_error(path, format!("tensor {name}: {e}")))?;
        tensors.insert(name, t);
    }
    Ok(TensorFile { tensors, metadata })
}

/// An integer tensor of a cache (frame indices, lengths) as host integers: copied to the CPU first, so a cache read
/// onto a GPU needs no integer cast there (not every integer dtype has a device cast).
pub(crate) fn host_integers(path: &Path, what: &str, t: &Tensor) -> Result<Vec<i64>, CacheError> {
    t.to_device(&Device::Cpu)
        .and_then(|t| t.to_dtype(DType::I64))
        .and_then(|t| t.flatten_all()?.to_vec1::<i64>())
        .map_err(|e| format_error(path, format!("{what}: {e}")))
}

/// Writes tensors and metadata to `path` through a temporary file that is synced, then renamed over `path`.
pub(crate) fn write_tensor_file(
    path: &Path,
    tensors: &[(String, RawTensor)],
    metadata: HashMap<String, String>,
) -> Result<(), CacheError> {
    let io = |source| CacheError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    };
    let bytes =
        safetensors::serialize(tensors.iter().map(|(k, v)| (k.as_str(), v)), Some(metadata))
            .map_err(|e| format_error(path, e.to_string()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(&bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn dtype_suffixes_strip_like_musubi() {
        assert_eq!(
            strip_dtype_suffix("latents_21x60x104_bfloat16"),
            "latents_21x60x104"
        );
        assert_eq!(strip_dtype_suffix("clip_float16"), "clip");
        assert_eq!(
            strip_dtype_suffix("latents_control_0_1x8x8_float8_e4m3fn"),
            "latents_control_0_1x8x8"
        );
        assert_eq!(strip_dtype_suffix("varlen_t5_bfloat16"), "varlen_t5");
        assert_eq!(
            strip_dtype_suffix("llama_attention_mask"),
            "llama_attention_mask"
        );
        assert_eq!(torch_dtype_name(DType::BF16), "bfloat16");
    }

    #[test]
    fn nans_are_zeroed_in_every_float_width() {
        let t = Tensor::new(&[1.0f32, f32::NAN, -2.0], &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            let (raw, had_nan) =
                RawTensor::from_tensor(&t.to_dtype(dtype).unwrap(), Path::new("x")).unwrap();
            assert!(had_nan, "{dtype:?}");
            let back = Tensor::from_raw_buffer(&raw.data, dtype, &raw.shape, &Device::Cpu).unwrap();
            let v = back.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(v, vec![1.0, 0.0, -2.0], "{dtype:?}");
        }
        let clean = Tensor::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        assert!(!RawTensor::from_tensor(&clean, Path::new("x")).unwrap().1);
    }
}
