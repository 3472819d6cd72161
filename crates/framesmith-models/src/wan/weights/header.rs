//! Safetensors header reader: sniffs what a file is (safetensors, PyTorch pickle, GGUF, text …) and validates the
//! JSON header against the file size, without touching tensor data; [`read_tensor_data`] then reads the bytes of
//! one small tensor alone. No input makes it panic: lengths are checked before allocating and all offset
//! arithmetic is checked.

use framesmith_nn::file::open_regular;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::error::{ModelFormatError, NotSafetensors};
use super::report::group_digits;

/// Largest header accepted; the same bound the `safetensors` crate uses, so a damaged length field cannot make us
/// allocate gigabytes.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor entry of a safetensors header, validated against the file size.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorInfo {
    /// The name as stored in the file.
    pub name: String,
    /// The safetensors dtype spelling (`BF16`, `F8_E4M3`, …).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Number of data bytes.
    pub len_bytes: u64,
    /// Where the data starts, in bytes from the start of the file.
    pub data_start: u64,
}

impl TensorInfo {
    /// Number of elements (saturating: shapes were validated when read, so this never actually saturates).
    pub fn numel(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
    }
}

/// A validated safetensors header.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    /// Tensors sorted by name.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` string pairs.
    pub metadata: BTreeMap<String, String>,
    /// Size of the file on disk.
    pub file_bytes: u64,
}

/// Bits per element of a safetensors dtype, `None` for a dtype the format does not define.
pub(crate) fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

/// Reads and validates the header of the safetensors file at `path`.
pub(crate) fn read_header(path: &Path) -> Result<Header, ModelFormatError> {
    let mut file = open_regular(path).map_err(|e| io_error(e, path))?;
    let file_bytes = file.metadata().map_err(|e| io_error(e, path))?.len();
    read_header_from(&mut file, file_bytes, path)
}

/// Reads and validates a safetensors header from `reader`, a file of `file_bytes` bytes at `path`.
pub(crate) fn read_header_from<R: Read + Seek>(
    reader: &mut R,
    file_bytes: u64,
    path: &Path,
) -> Result<Header, ModelFormatError> {
    let unreadable = |cause: std::io::Error| io_error(cause, path);
    if file_bytes == 0 {
        return Err(ModelFormatError::Empty {
            path: path.to_path_buf(),
        });
    }
    let mut head = [0u8; 64];
    let head_len = read_up_to(reader, &mut head).map_err(unreadable)?;
    let head = head.get(..head_len).unwrap_or_default();
    let header_bytes = sniff(head, file_bytes, path)?;
    let header_end = 8 + header_bytes;
    if header_end > file_bytes {
        return Err(ModelFormatError::Truncated {
            detail: format!(
                "its header alone needs {} bytes but the file has {}",
                group_digits(header_end),
                group_digits(file_bytes)
            ),
            path: path.to_path_buf(),
        });
    }
    let mut json = vec![0u8; header_bytes as usize];
    reader.seek(SeekFrom::Start(8)).map_err(unreadable)?;
    reader.read_exact(&mut json).map_err(unreadable)?;
    parse_header(&json, header_end, file_bytes).map_err(|problem| match problem {
        HeaderProblem::Bad(reason) => ModelFormatError::BadHeader {
            reason,
            path: path.to_path_buf(),
        },
        HeaderProblem::Short(detail) => ModelFormatError::Truncated {
            detail,
            path: path.to_path_buf(),
        },
    })
}

/// The data of one tensor of the file at `path`, as stored: seeks to it and reads `info.len_bytes` bytes, nothing
/// else. `info` comes from [`read_header`] of the same file, so the span lies inside it; callers check that the
/// tensor is small before asking (this reads it into memory).
pub(crate) fn read_tensor_data(
    path: &Path,
    info: &TensorInfo,
) -> Result<Vec<u8>, ModelFormatError> {
    let unreadable = |cause: std::io::Error| io_error(cause, path);
    let len = usize::try_from(info.len_bytes).map_err(|_| ModelFormatError::BadHeader {
        reason: format!("tensor `{}` is too large to read into memory", info.name),
        path: path.to_path_buf(),
    })?;
    let mut file = open_regular(path).map_err(unreadable)?;
    file.seek(SeekFrom::Start(info.data_start))
        .map_err(unreadable)?;
    let mut data = vec![0u8; len];
    file.read_exact(&mut data).map_err(unreadable)?;
    Ok(data)
}

/// Maps an I/O error to not-found or unreadable.
pub(crate) fn io_error(cause: std::io::Error, path: &Path) -> ModelFormatError {
    if cause.kind() == std::io::ErrorKind::NotFound {
        ModelFormatError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        ModelFormatError::Unreadable {
            cause,
            path: path.to_path_buf(),
        }
    }
}

fn read_up_to<R: Read>(reader: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else {
            break;
        };
        match reader.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Returns the header length of a safetensors file, or says what else the first bytes show.
fn sniff(head: &[u8], file_bytes: u64, path: &Path) -> Result<u64, ModelFormatError> {
    if let Some(n) = safetensors_header_len(head) {
        return Ok(n);
    }
    let length = head
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes);
    let not_safetensors = |kind| ModelFormatError::NotSafetensors {
        kind,
        path: path.to_path_buf(),
    };
    if let Some(kind) = foreign_kind(head) {
        return Err(not_safetensors(kind));
    }
    if let Some(first_line) = text_line(head) {
        return Err(not_safetensors(NotSafetensors::Text(first_line)));
    }
    // A safetensors start (a length, then `{`) whose length is past the limit: say which limit, not "unknown".
    if let (Some(n), Some(b'{')) = (length, head.get(8)) {
        let header_end = n.saturating_add(8);
        return Err(ModelFormatError::BadHeader {
            reason: if header_end > file_bytes {
                format!(
                    "its header length field says {} bytes, more than the whole file's {}",
                    group_digits(n),
                    group_digits(file_bytes)
                )
            } else {
                format!(
                    "its header of {} bytes exceeds the limit of {} bytes a safetensors reader accepts",
                    group_digits(n),
                    group_digits(MAX_HEADER_BYTES)
                )
            },
            path: path.to_path_buf(),
        });
    }
    // A prefix of a real safetensors file: a small length field and nothing (or no `{`) after it yet.
    let short = match length {
        None => true,
        Some(n) => n <= MAX_HEADER_BYTES && file_bytes <= 8,
    };
    if short {
        return Err(ModelFormatError::Truncated {
            detail: format!("it has only {file_bytes} bytes, too few for a safetensors header"),
            path: path.to_path_buf(),
        });
    }
    Err(not_safetensors(NotSafetensors::Unknown(hex_prefix(head))))
}

/// What the first bytes of a file show, when they are not a safetensors header: a PyTorch archive or pickle, a
/// GGUF file, a Git LFS pointer, a web page or other text. `None` for a safetensors header or unknown binary.
pub(crate) fn sniff_kind(head: &[u8]) -> Option<NotSafetensors> {
    foreign_kind(head).or_else(|| text_line(head).map(NotSafetensors::Text))
}

/// The header length when `head` starts like a safetensors file: a sane little-endian length, then `{`.
pub(crate) fn safetensors_header_len(head: &[u8]) -> Option<u64> {
    let n = u64::from_le_bytes(head.get(..8)?.try_into().ok()?);
    (n <= MAX_HEADER_BYTES && head.get(8) == Some(&b'{')).then_some(n)
}

/// The first bytes of `head` in hex (`b7 e2 38 05 …`), for naming a file nothing recognised.
pub(crate) fn hex_prefix(head: &[u8]) -> String {
    let hex: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
    hex.join(" ")
}

/// Up to the first 64 bytes of the file at `path`: enough for [`sniff_kind`] and [`safetensors_header_len`].
pub(crate) fn read_head(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(64);
    open_regular(path)?.take(64).read_to_end(&mut head)?;
    Ok(head)
}

/// Recognises the file formats people most often download instead of safetensors.
fn foreign_kind(head: &[u8]) -> Option<NotSafetensors> {
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        return Some(NotSafetensors::PyTorchZip);
    }
    if head.starts_with(b"GGUF") {
        return Some(NotSafetensors::Gguf);
    }
    if head.first() == Some(&0x80) && head.get(1).is_some_and(|p| (2..=5).contains(p)) {
        return Some(NotSafetensors::PyTorchPickle);
    }
    if head.starts_with(b"version https://git-lfs") {
        return Some(NotSafetensors::LfsPointer);
    }
    let lower = String::from_utf8_lossy(head)
        .trim_start()
        .to_ascii_lowercase();
    if lower.starts_with("<!doctype html") || lower.starts_with("<html") {
        return Some(NotSafetensors::Html);
    }
    None
}

/// The first line (shortened) when `head` looks like text.
fn text_line(head: &[u8]) -> Option<String> {
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        // A multi-byte character cut by the end of the sniffed window is still text.
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(head.get(..e.valid_up_to())?).ok()?
        }
        Err(_) => return None,
    };
    let printable = |c: char| !c.is_control() || matches!(c, '\n' | '\r' | '\t');
    if text.trim().is_empty() || !text.chars().all(printable) {
        return None;
    }
    let line = text.trim_start().lines().next().unwrap_or_default();
    let mut short: String = line.chars().take(40).collect();
    if line.chars().count() > 40 {
        short.push('…');
    }
    Some(short)
}

enum HeaderProblem {
    Bad(String),
    Short(String),
}

fn parse_header(json: &[u8], data_start: u64, file_bytes: u64) -> Result<Header, HeaderProblem> {
    let bad = |s: String| HeaderProblem::Bad(s);
    let value: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| bad(format!("the header is not valid JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| bad("the header is not a JSON object".into()))?;
    let mut tensors = Vec::with_capacity(obj.len());
    let mut spans = Vec::with_capacity(obj.len());
    let mut metadata = BTreeMap::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            metadata = parse_metadata(entry).map_err(bad)?;
            continue;
        }
        let (mut info, span) = parse_entry(name, entry).map_err(bad)?;
        info.data_start = data_start.saturating_add(span.0);
        spans.push((span, tensors.len()));
        tensors.push(info);
    }
    // The same rules the `safetensors` crate enforces when the file is mapped, checked here so that every
    // problem gets a clear message before any data is touched: tensors tile the data section without gaps or
    // overlaps and end exactly at the end of the file.
    spans.sort();
    let mut data_end = 0u64;
    for &((begin, end), i) in &spans {
        if begin != data_end {
            let name = tensors.get(i).map(|t| t.name.as_str()).unwrap_or_default();
            return Err(bad(format!(
                "the data of tensor `{name}` starts at byte {begin} of the data section, expected {data_end} \
                 (tensors overlap or leave gaps)"
            )));
        }
        data_end = end;
    }
    let needed = data_start.saturating_add(data_end);
    if needed > file_bytes {
        return Err(HeaderProblem::Short(format!(
            "its header describes {} bytes but the file has {}",
            group_digits(needed),
            group_digits(file_bytes)
        )));
    }
    if needed < file_bytes {
        return Err(bad(format!(
            "{} unexplained bytes follow the last tensor",
            group_digits(file_bytes - needed)
        )));
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Header {
        tensors,
        metadata,
        file_bytes,
    })
}

fn parse_metadata(entry: &serde_json::Value) -> Result<BTreeMap<String, String>, String> {
    let map = entry
        .as_object()
        .ok_or_else(|| "`__metadata__` is not an object".to_string())?;
    map.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(format!("`__metadata__` value `{k}` is not text")),
        })
        .collect()
}

/// Validates one tensor entry; returns it and its data span (relative to the data section).
fn parse_entry(name: &str, entry: &serde_json::Value) -> Result<(TensorInfo, (u64, u64)), String> {
    let field = |key: &str| {
        entry
            .get(key)
            .ok_or_else(|| format!("tensor `{name}` has no `{key}`"))
    };
    let dtype = field("dtype")?
        .as_str()
        .ok_or_else(|| format!("tensor `{name}` has a non-text dtype"))?;
    let bits =
        dtype_bits(dtype).ok_or_else(|| format!("tensor `{name}` has unknown dtype `{dtype}`"))?;
    let shape = field("shape")?
        .as_array()
        .ok_or_else(|| format!("tensor `{name}` has a shape that is not a list"))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| format!("tensor `{name}` has a shape that is not a list of sizes"))?;
    let offsets = field("data_offsets")?
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64()).collect::<Option<Vec<u64>>>());
    let [begin, end] = match offsets.flatten().as_deref() {
        Some(&[b, e]) => [b, e],
        _ => return Err(format!("tensor `{name}` has malformed data_offsets")),
    };
    let overflow = || format!("tensor `{name}` has a shape too large to exist ({shape:?})");
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(overflow)?;
    let bits_total = numel.checked_mul(bits).ok_or_else(overflow)?;
    if bits_total % 8 != 0 || end < begin || end - begin != bits_total / 8 {
        return Err(format!(
            "tensor `{name}` has data_offsets [{begin}, {end}] but shape {shape:?} of {dtype} needs {} bytes",
            bits_total / 8
        ));
    }
    let info = TensorInfo {
        name: name.to_string(),
        dtype: dtype.to_string(),
        shape,
        len_bytes: end - begin,
        data_start: 0,
    };
    Ok((info, (begin, end)))
}
