//! Writes a safetensors file whose bytes depend only on its tensors and metadata: the metadata in sorted key
//! order (the safetensors crate writes its `HashMap` in a different order in each process), the tensors laid out
//! as that crate lays them out (by dtype alignment, then name). Identical runs give identical files, so
//! whole-file hashes can compare them.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use safetensors::tensor::Dtype as StDtype;

/// One tensor to write: name, dtype, shape and little-endian bytes.
pub(super) type Entry = (String, StDtype, Vec<usize>, Vec<u8>);

/// Writes `entries` and `metadata` (left out when empty) as a safetensors file at `path`.
pub(super) fn write_sorted(
    path: &Path,
    entries: &[Entry],
    metadata: &HashMap<String, String>,
) -> std::io::Result<()> {
    let mut order: Vec<&Entry> = entries.iter().collect();
    order.sort_by(|(a_name, a_dtype, ..), (b_name, b_dtype, ..)| {
        b_dtype.cmp(a_dtype).then(a_name.cmp(b_name))
    });
    let header = header_json(&order, metadata)?;
    let mut header = header.into_bytes();
    // The safetensors crate pads the header with spaces to 8 bytes, so the data starts aligned.
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = BufWriter::new(File::create(path)?);
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&header)?;
    for (_, _, _, bytes) in order {
        out.write_all(bytes)?;
    }
    out.flush()
}

/// The JSON header: `__metadata__` with its keys sorted, then each tensor in data order.
fn header_json(order: &[&Entry], metadata: &HashMap<String, String>) -> std::io::Result<String> {
    let mut parts = Vec::with_capacity(order.len() + 1);
    if !metadata.is_empty() {
        let sorted: BTreeMap<&String, &String> = metadata.iter().collect();
        let sorted = serde_json::to_string(&sorted).map_err(std::io::Error::other)?;
        parts.push(format!("\"__metadata__\":{sorted}"));
    }
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in order {
        let end = offset + bytes.len();
        let name = serde_json::to_string(name).map_err(std::io::Error::other)?;
        let dtype = serde_json::to_string(dtype).map_err(std::io::Error::other)?;
        let shape = serde_json::to_string(shape).map_err(std::io::Error::other)?;
        parts.push(format!(
            "{name}:{{\"dtype\":{dtype},\"shape\":{shape},\"data_offsets\":[{offset},{end}]}}"
        ));
        offset = end;
    }
    Ok(format!("{{{}}}", parts.join(",")))
}
