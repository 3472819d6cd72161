//! Gemma 3's tokenizer, read from the user's files with the `tokenizers` crate (never fetched): a
//! `tokenizer.json`, the one in the Gemma folder, or the `tokenizer_json` tensor ltx-core's packed single-file text
//! encoders embed. Prompts are encoded as LTX-2's `LTXGemmaTokenizer.tokenize_with_weights` does: stripped,
//! tokenised with Gemma's post-processor (which puts `<bos>` first) and truncated to the max length as
//! `truncation=True` does, `<bos>` put first if the tokenizer did not, then padded on the left with `<pad>` (the
//! end-of-sequence token when there is no pad token) to the max length, with the attention mask.

use std::path::{Path, PathBuf};

use tokenizers::{Tokenizer, TruncationParams};

/// LTX-2's prompt length (`TOKENIZER_MAX_LENGTH`): every prompt is padded to it.
pub const LTX2_MAX_LENGTH: usize = 1024;
/// The tensor ltx-core's packed single-file text encoders keep `tokenizer.json` in (its bytes, U8).
pub const EMBEDDED_TOKENIZER: &str = "tokenizer_json";
/// Where the tokenizer comes from in the releases.
const SOURCE: &str = "the tokenizer.json of google/gemma-3-12b-it (beside its safetensors shards)";

/// Why the tokenizer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GemmaTokenizerError {
    #[error("no Gemma 3 tokenizer found (tokenizer.json): give the path of {SOURCE} with --tokenizer; looked beside the weights: {}", path.display())]
    NotFound { path: PathBuf },
    #[error("cannot read the Gemma 3 tokenizer ({reason}); give {SOURCE}: {}", path.display())]
    Unreadable { reason: String, path: PathBuf },
    #[error("this tokenizer has no `<bos>` token, so it is not Gemma's; give {SOURCE}: {}", path.display())]
    WrongTokenizer { path: PathBuf },
    #[error("cannot tokenize \"{text}\": {reason}")]
    Encode { text: String, reason: String },
}

/// Gemma 3's tokenizer with LTX-2's prompt handling.
pub struct GemmaTokenizer {
    tokenizer: Tokenizer,
    bos_id: u32,
    pad_id: u32,
    max_length: usize,
}

/// One prompt's ids and attention mask, left-padded to the max length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaddedPrompt {
    pub ids: Vec<u32>,
    /// 1 at the prompt's tokens, 0 at the padding before them.
    pub mask: Vec<u32>,
}

impl PaddedPrompt {
    /// The prompt's tokens (the mask's sum).
    pub fn len(&self) -> usize {
        self.mask.iter().filter(|&&m| m != 0).count()
    }

    /// Whether the prompt has no token (never, for a tokenizer that puts `<bos>` first).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl GemmaTokenizer {
    /// The tokenizer at `explicit` (a `tokenizer.json` or a folder), else one near the weights at `weights`: in
    /// their folder (the Gemma folder), its `tokenizer/` folder, or embedded in a single file.
    pub fn for_weights(
        weights: &Path,
        explicit: Option<&Path>,
        max_length: usize,
    ) -> Result<Self, GemmaTokenizerError> {
        if let Some(path) = explicit {
            return Self::load(path, max_length);
        }
        let dir = if weights.is_dir() {
            weights.to_path_buf()
        } else {
            weights.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        if let Some(found) = [dir.clone(), dir.join("tokenizer")]
            .into_iter()
            .find(|d| d.join("tokenizer.json").is_file())
        {
            return Self::load(&found, max_length);
        }
        if weights.is_file() {
            if let Some(bytes) = super::weights::embedded_tokenizer(weights) {
                return Self::from_bytes(&bytes, weights, max_length);
            }
        }
        Err(GemmaTokenizerError::NotFound {
            path: weights.to_path_buf(),
        })
    }

    /// Reads a `tokenizer.json`, or a folder holding one.
    pub fn load(path: &Path, max_length: usize) -> Result<Self, GemmaTokenizerError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        if !file.is_file() {
            return Err(GemmaTokenizerError::NotFound {
                path: path.to_path_buf(),
            });
        }
        let bytes = std::fs::read(&file).map_err(|e| GemmaTokenizerError::Unreadable {
            reason: e.to_string(),
            path: file.clone(),
        })?;
        Self::from_bytes(&bytes, &file, max_length)
    }

    /// Reads the bytes of a `tokenizer.json` (`source` names where they came from in errors).
    pub fn from_bytes(
        bytes: &[u8],
        source: &Path,
        max_length: usize,
    ) -> Result<Self, GemmaTokenizerError> {
        let unreadable = |reason: String| GemmaTokenizerError::Unreadable {
            reason,
            path: source.to_path_buf(),
        };
        let mut tokenizer = Tokenizer::from_bytes(bytes).map_err(|e| unreadable(e.to_string()))?;
        let bos_id =
            tokenizer
                .token_to_id("<bos>")
                .ok_or_else(|| GemmaTokenizerError::WrongTokenizer {
                    path: source.to_path_buf(),
                })?;
        let pad_id = tokenizer
            .token_to_id("<pad>")
            .or_else(|| tokenizer.token_to_id("<eos>"))
            .ok_or_else(|| unreadable("it has neither `<pad>` nor `<eos>`".into()))?;
        if max_length == 0 {
            return Err(unreadable("a max length of 0 tokens".into()));
        }
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| unreadable(e.to_string()))?;
        Ok(Self {
            tokenizer,
            bos_id,
            pad_id,
            max_length,
        })
    }

    /// The length every prompt is padded to.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// `text` as LTX-2 encodes it: ids and mask of `max_length` entries, padding first.
    pub fn encode_padded(&self, text: &str) -> Result<PaddedPrompt, GemmaTokenizerError> {
        let text = text.trim();
        let encoding =
            self.tokenizer
                .encode(text, true)
                .map_err(|e| GemmaTokenizerError::Encode {
                    text: text.to_string(),
                    reason: e.to_string(),
                })?;
        let mut ids = encoding.get_ids().to_vec();
        if ids.first() != Some(&self.bos_id) {
            ids.insert(0, self.bos_id);
            ids.truncate(self.max_length);
        }
        let pad = self.max_length - ids.len();
        let mut out = PaddedPrompt {
            ids: vec![self.pad_id; pad],
            mask: vec![0; pad],
        };
        out.mask.extend(std::iter::repeat_n(1, ids.len()));
        out.ids.extend(ids);
        Ok(out)
    }
}
