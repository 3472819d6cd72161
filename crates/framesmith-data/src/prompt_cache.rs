//! Text-encoder outputs of sample prompts, cached on disk like a dataset's text caches, so that a run whose prompts
//! were embedded before (a resume, a second run, another run of the same prompt file) starts without loading its
//! text encoders. An entry is found by everything its tensors depend on: the encoder files (each by its path, size
//! and modification time, so a replaced file is a miss), the dtype and what the family encodes (prompt, negative
//! prompt, whether guidance needs the negative). Each file holds that key in its metadata and is used only when the
//! key matches in full; the file name is a hash of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use candle_core::{DType, Device, Tensor};
use framesmith_config::outputs::output_folder_of;
use sha2::{Digest, Sha256};

use super::tensor_file::{
    read_tensor_file, torch_dtype_name, write_tensor_file, CacheError, RawTensor,
};

/// Where a run's sample-prompt embeddings are cached: a folder of the output folder (of the one the user named,
/// when the run writes into a `run-N` folder beside an earlier run), so that a resume and later runs into the same
/// folder reuse them.
pub fn prompt_cache_dir(run_dir: &Path) -> PathBuf {
    output_folder_of(run_dir).join(".prompt-cache")
}

/// The metadata entry that holds an entry's full key.
const KEY_METADATA: &str = "framesmith_prompt_key";

/// The sample-prompt cache of one set of text encoders, in one folder.
#[derive(Clone, Debug)]
pub struct PromptCache {
    dir: PathBuf,
    encoders: String,
}

impl PromptCache {
    /// The cache in `dir` for outputs of the encoder files `encoders` (weights, and tokenizers where they are
    /// separate files). A file that cannot be looked at counts by its path alone.
    pub fn new(dir: &Path, encoders: &[&Path]) -> Self {
        let encoders = encoders
            .iter()
            .map(|path| file_identity(path))
            .collect::<Vec<_>>()
            .join("\n");
        Self {
            dir: dir.to_path_buf(),
            encoders,
        }
    }

    /// The folder the entries are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tensors cached for `parts` (what was encoded, e.g. the prompt and the negative prompt) in `dtype`, on
    /// `device`; `None` when there is no entry for exactly this key, or it cannot be read (it is then made again).
    pub fn get(
        &self,
        parts: &[&str],
        dtype: DType,
        device: &Device,
    ) -> Option<HashMap<String, Tensor>> {
        let key = self.key(parts, dtype);
        let file = read_tensor_file(&self.path(&key), device).ok()?;
        if file.metadata.get(KEY_METADATA) != Some(&key) {
            return None;
        }
        file.tensors
            .into_iter()
            .map(|(name, t)| Some((name, t.to_dtype(dtype).ok()?)))
            .collect()
    }

    /// Stores `tensors` as the entry for `parts` in `dtype` (written through a temporary file, then renamed).
    pub fn put(
        &self,
        parts: &[&str],
        dtype: DType,
        tensors: &[(&str, &Tensor)],
    ) -> Result<(), CacheError> {
        let key = self.key(parts, dtype);
        let path = self.path(&key);
        let raw = tensors
            .iter()
            .map(|(name, t)| Ok(((*name).to_owned(), RawTensor::from_tensor(t, &path)?.0)))
            .collect::<Result<Vec<_>, CacheError>>()?;
        let metadata = HashMap::from([(KEY_METADATA.to_owned(), key)]);
        write_tensor_file(&path, &raw, metadata)
    }

    /// The full key of `parts` in `dtype`: the encoders, the dtype and each part, one per line, lengths first so
    /// that no two different lists give the same text.
    fn key(&self, parts: &[&str], dtype: DType) -> String {
        let mut key = format!("{}\ndtype {}", self.encoders, torch_dtype_name(dtype));
        for part in parts {
            key += &format!("\n{} {part}", part.len());
        }
        key
    }

    fn path(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("prompt_{name}.safetensors"))
    }
}

/// `path` with its size and modification time, as far as they can be read.
fn file_identity(path: &Path) -> String {
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let stamp = std::fs::metadata(&absolute).ok().map(|m| {
        let modified = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        format!("{} bytes, modified {modified}", m.len())
    });
    format!(
        "encoder {} ({})",
        absolute.display(),
        stamp.as_deref().unwrap_or("unreadable")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ones(n: usize) -> Tensor {
        Tensor::ones((n, 4), DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn an_entry_is_found_only_by_its_whole_key() {
        let dir = tempfile::tempdir().unwrap();
        let encoder = dir.path().join("umt5.safetensors");
        std::fs::write(&encoder, b"weights").unwrap();
        let cache = PromptCache::new(&dir.path().join("cache"), &[&encoder]);
        assert!(cache
            .get(&["a cat", ""], DType::F32, &Device::Cpu)
            .is_none());
        cache
            .put(&["a cat", ""], DType::F32, &[("context", &ones(3))])
            .unwrap();
        let got = cache.get(&["a cat", ""], DType::F32, &Device::Cpu).unwrap();
        assert_eq!(got["context"].dims(), [3, 4]);
        // Another prompt, another split of the same text, another dtype: misses.
        assert!(cache
            .get(&["a dog", ""], DType::F32, &Device::Cpu)
            .is_none());
        assert!(cache
            .get(&["a ca", "t"], DType::F32, &Device::Cpu)
            .is_none());
        assert!(cache
            .get(&["a cat", ""], DType::BF16, &Device::Cpu)
            .is_none());
    }

    #[test]
    fn a_changed_encoder_file_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let encoder = dir.path().join("umt5.safetensors");
        std::fs::write(&encoder, b"weights").unwrap();
        let cached = dir.path().join("cache");
        PromptCache::new(&cached, &[&encoder])
            .put(&["a cat"], DType::F32, &[("context", &ones(2))])
            .unwrap();
        std::fs::write(&encoder, b"other weights").unwrap();
        let cache = PromptCache::new(&cached, &[&encoder]);
        assert!(cache.get(&["a cat"], DType::F32, &Device::Cpu).is_none());
    }

    #[test]
    fn a_damaged_entry_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let encoder = dir.path().join("umt5.safetensors");
        std::fs::write(&encoder, b"weights").unwrap();
        let cache = PromptCache::new(&dir.path().join("cache"), &[&encoder]);
        cache
            .put(&["a cat"], DType::F32, &[("context", &ones(2))])
            .unwrap();
        let file = std::fs::read_dir(cache.dir())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::write(&file, b"truncated").unwrap();
        assert!(cache.get(&["a cat"], DType::F32, &Device::Cpu).is_none());
        cache
            .put(&["a cat"], DType::F32, &[("context", &ones(2))])
            .unwrap();
        assert!(cache.get(&["a cat"], DType::F32, &Device::Cpu).is_some());
    }
}
