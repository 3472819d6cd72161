//! Whether a cache file on disk is complete, from its safetensors header alone: the header parses, names a
//! tensor of each expected kind, says the architecture asked for, and its data ends
//! exactly at the end of the file (a run killed mid-write leaves a shorter file). Reading only the header keeps
//! re-runs over large datasets cheap.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// Headers larger than this are not caches (musubi-tuner's are a few hundred bytes).
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// The metadata of a complete cache of `architecture` (its family's name in musubi-tuner's caches) at `path`
/// holding, for each of `key_prefixes`, a tensor whose key starts with it; `None` when the file is missing,
/// truncated, lacks one of them, or is another kind of file.
pub(crate) fn complete_cache(
    path: &Path,
    key_prefixes: &[&str],
    architecture: &str,
) -> Option<HashMap<String, String>> {
    let mut file = framesmith_config::file_read::open_regular(path).ok()?;
    let file_len = file.metadata().ok()?.len();
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes).ok()?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return None;
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).ok()?;
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).ok()?;
    let mut metadata = HashMap::new();
    let (mut data_end, mut found) = (0u64, vec![false; key_prefixes.len()]);
    for (key, value) in &json {
        if key == "__metadata__" {
            for (k, v) in value.as_object()? {
                metadata.insert(k.clone(), v.as_str()?.to_string());
            }
            continue;
        }
        for (found, prefix) in found.iter_mut().zip(key_prefixes) {
            *found |= key.starts_with(prefix);
        }
        data_end = data_end.max(value.get("data_offsets")?.get(1)?.as_u64()?);
    }
    let complete = found.iter().all(|&f| f)
        && 8 + header_len + data_end == file_len
        && metadata.get("architecture").map(String::as_str) == Some(architecture);
    complete.then_some(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::{Dtype, TensorView};

    /// A cache of `architecture` holding one f32 tensor named `key`, with a caption in its metadata.
    fn write_cache(path: &Path, key: &str, architecture: &str) -> anyhow::Result<()> {
        let data = vec![0u8; 3 * 8 * 4];
        let view = TensorView::new(Dtype::F32, vec![3, 8], &data)?;
        let metadata = HashMap::from([
            ("architecture".to_string(), architecture.to_string()),
            ("caption1".to_string(), "a cat".to_string()),
        ]);
        safetensors::serialize_to_file([(key, view)], Some(metadata), path)?;
        Ok(())
    }

    #[test]
    fn truncated_or_foreign_files_are_not_complete() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x_te.safetensors");
        write_cache(&path, "text_float32", "arch")?;
        let meta =
            complete_cache(&path, &["text_"], "arch").ok_or_else(|| anyhow::anyhow!("complete"))?;
        assert_eq!(meta.get("caption1").map(String::as_str), Some("a cat"));
        assert_eq!(meta.get("architecture").map(String::as_str), Some("arch"));
        assert!(complete_cache(&path, &["latents_"], "arch").is_none());
        assert!(complete_cache(&path, &["text_"], "other").is_none());
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() - 1])?;
        assert!(complete_cache(&path, &["text_"], "arch").is_none());
        std::fs::write(&path, b"junk")?;
        assert!(complete_cache(&path, &["text_"], "arch").is_none());
        assert!(complete_cache(&dir.path().join("absent"), &["text_"], "arch").is_none());
        Ok(())
    }
}
