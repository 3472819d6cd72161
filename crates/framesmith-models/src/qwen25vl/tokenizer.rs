//! Qwen2's byte-level BPE tokenizer, read from the user's files with the `tokenizers` crate (never fetched): a
//! `tokenizer.json`, or a Qwen2.5-VL / Qwen-Image `tokenizer/` folder's `vocab.json` + `merges.txt` with the
//! special tokens listed in its `tokenizer_config.json` (`added_tokens_decoder`) or `added_tokens.json`. Qwen2
//! adds no special tokens of its own to a text; padding is on the right with `<|endoftext|>`.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// The pre-tokenizer split of Qwen2's `tokenizer.json`.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The token Qwen2 pads with.
pub const PAD_TOKEN: &str = "<|endoftext|>";
/// The token that opens a chat turn (in every template).
pub const IM_START: &str = "<|im_start|>";
/// Where the tokenizer is found in the releases.
const SOURCE: &str =
    "the tokenizer/ folder of Qwen/Qwen-Image, or Qwen/Qwen2.5-VL-7B-Instruct's tokenizer.json";

/// Why the tokenizer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Qwen2TokenizerError {
    #[error("no Qwen2.5-VL tokenizer found (tokenizer.json, or vocab.json + merges.txt): give the path of {SOURCE}; looked beside the weights: {}", path.display())]
    NotFound { path: PathBuf },
    #[error("cannot read the Qwen2.5-VL tokenizer ({reason}); give {SOURCE}: {}", path.display())]
    Unreadable { reason: String, path: PathBuf },
    #[error("this tokenizer has no `{token}` token, so it is not Qwen2's; give {SOURCE}: {}", path.display())]
    WrongTokenizer { token: &'static str, path: PathBuf },
    #[error("cannot tokenize \"{text}\": {reason}")]
    Encode { text: String, reason: String },
}

/// Qwen2's tokenizer.
pub struct Qwen2Tokenizer {
    tokenizer: Tokenizer,
    pad_id: u32,
}

/// Ids of several texts padded on the right to the longest: `ids` and `mask` [b, l] (u32; mask 1 at tokens).
pub struct TokenBatch {
    pub ids: Tensor,
    pub mask: Tensor,
    /// Tokens per row.
    pub lens: Vec<usize>,
}

impl Qwen2Tokenizer {
    /// The tokenizer at `explicit` (a `tokenizer.json` or a folder), else one found near the weights at
    /// `weights`: in their folder, its `tokenizer/` folder, or the `tokenizer/` folder beside it (diffusers puts
    /// `tokenizer/` beside `text_encoder/`).
    pub fn for_weights(
        weights: &Path,
        explicit: Option<&Path>,
    ) -> Result<Self, Qwen2TokenizerError> {
        if let Some(path) = explicit {
            return Self::load(path);
        }
        let dir = if weights.is_dir() {
            weights.to_path_buf()
        } else {
            weights.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let mut candidates = vec![dir.clone(), dir.join("tokenizer")];
        if let Some(parent) = dir.parent() {
            candidates.push(parent.join("tokenizer"));
        }
        candidates
            .into_iter()
            .find(|d| d.join("tokenizer.json").is_file() || d.join("vocab.json").is_file())
            .map(|d| Self::load(&d))
            .unwrap_or_else(|| {
                Err(Qwen2TokenizerError::NotFound {
                    path: weights.to_path_buf(),
                })
            })
    }

    /// Reads a `tokenizer.json`, or a folder holding one (or `vocab.json` + `merges.txt`).
    pub fn load(path: &Path) -> Result<Self, Qwen2TokenizerError> {
        let unreadable = |reason: String, at: &Path| Qwen2TokenizerError::Unreadable {
            reason,
            path: at.to_path_buf(),
        };
        let (tokenizer, at) = if path.is_file() {
            let t = Tokenizer::from_file(path).map_err(|e| unreadable(e.to_string(), path))?;
            (t, path.to_path_buf())
        } else if path.join("tokenizer.json").is_file() {
            let file = path.join("tokenizer.json");
            let t = Tokenizer::from_file(&file).map_err(|e| unreadable(e.to_string(), &file))?;
            (t, file)
        } else if path.join("vocab.json").is_file() {
            let json = json_from_vocab_merges(path).map_err(|e| unreadable(e, path))?;
            let t = json
                .parse::<Tokenizer>()
                .map_err(|e| unreadable(e.to_string(), path))?;
            (t, path.to_path_buf())
        } else {
            return Err(Qwen2TokenizerError::NotFound {
                path: path.to_path_buf(),
            });
        };
        for token in [PAD_TOKEN, IM_START] {
            if tokenizer.token_to_id(token).is_none() {
                return Err(Qwen2TokenizerError::WrongTokenizer { token, path: at });
            }
        }
        let pad_id = tokenizer.token_to_id(PAD_TOKEN).unwrap_or_default();
        Ok(Self { tokenizer, pad_id })
    }

    /// The ids of `text` (special tokens written in it, like `<|im_start|>`, become their ids; nothing added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Qwen2TokenizerError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Qwen2TokenizerError::Encode {
                text: text.to_string(),
                reason: e.to_string(),
            })
    }

    /// The id of `token`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The id padding is written with.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Each text's ids cut to `max_tokens` (from the right, as `truncation=True` does), then padded on the right
    /// to the longest row.
    pub fn encode_batch(
        &self,
        texts: &[String],
        max_tokens: usize,
        device: &Device,
    ) -> Result<TokenBatch, Qwen2TokenizerError> {
        let rows = texts
            .iter()
            .map(|t| {
                let mut ids = self.encode(t)?;
                ids.truncate(max_tokens);
                Ok(ids)
            })
            .collect::<Result<Vec<_>, Qwen2TokenizerError>>()?;
        pad_right(&rows, self.pad_id, device).map_err(|e| Qwen2TokenizerError::Encode {
            text: texts.join(" | "),
            reason: e.to_string(),
        })
    }
}

/// `rows` padded on the right with `pad_id` to the longest.
pub fn pad_right(
    rows: &[Vec<u32>],
    pad_id: u32,
    device: &Device,
) -> candle_core::Result<TokenBatch> {
    let l = rows.iter().map(Vec::len).max().unwrap_or(0);
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for row in rows {
        ids.extend(
            row.iter()
                .copied()
                .chain(std::iter::repeat_n(pad_id, l - row.len())),
        );
        mask.extend((0..l).map(|i| u32::from(i < row.len())));
    }
    Ok(TokenBatch {
        ids: Tensor::from_vec(ids, (rows.len(), l), device)?,
        mask: Tensor::from_vec(mask, (rows.len(), l), device)?,
        lens: rows.iter().map(Vec::len).collect(),
    })
}

/// The `tokenizer.json` that Qwen2's `vocab.json` + `merges.txt` in `dir` make, with the special tokens of its
/// `tokenizer_config.json` or `added_tokens.json`.
fn json_from_vocab_merges(dir: &Path) -> Result<String, String> {
    let read =
        |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"));
    let vocab: Value =
        serde_json::from_str(&read("vocab.json")?).map_err(|e| format!("vocab.json: {e}"))?;
    let merges_text = read("merges.txt")?;
    let merges: Vec<&str> = merges_text
        .lines()
        .filter(|l| !l.starts_with("#version") && !l.trim().is_empty())
        .collect();
    let mut added: Vec<(u64, String, bool)> = Vec::new();
    if let Ok(text) = read("tokenizer_config.json") {
        let cfg: Value =
            serde_json::from_str(&text).map_err(|e| format!("tokenizer_config.json: {e}"))?;
        if let Some(map) = cfg.get("added_tokens_decoder").and_then(Value::as_object) {
            for (id, tok) in map {
                let id = id
                    .parse::<u64>()
                    .map_err(|e| format!("tokenizer_config.json: {e}"))?;
                let content = tok
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let special = tok.get("special").and_then(Value::as_bool).unwrap_or(true);
                added.push((id, content.to_string(), special));
            }
        }
    }
    if added.is_empty() {
        if let Ok(text) = read("added_tokens.json") {
            let map: Value =
                serde_json::from_str(&text).map_err(|e| format!("added_tokens.json: {e}"))?;
            for (content, id) in map.as_object().into_iter().flatten() {
                added.push((id.as_u64().unwrap_or_default(), content.clone(), true));
            }
        }
    }
    added.sort();
    let added: Vec<Value> = added
        .into_iter()
        .map(|(id, content, special)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": !special, "special": special})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    Ok(tokenizer.to_string())
}
