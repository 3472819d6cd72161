//! umT5's tokenizer as Wan uses it (`HuggingfaceTokenizer(name, seq_len=512, clean='whitespace')` of
//! `wan/modules/tokenizers.py`): the prompt is cleaned, tokenized, truncated to 511 tokens, and closed with `</s>`,
//! as the fast T5 tokenizer does with `truncation=True, max_length=512`. The tokenizer comes from the
//! `tokenizer.json` of the model folder (`google/umt5-xxl`), its `spiece.model`, or the SentencePiece model that
//! ComfyUI embeds in its umT5 weights (`spiece`); it is always read from disk, never fetched.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::spiece::{self, Embedded, SpmProblem};
use crate::wan::weights::ModelFormatError;

/// Most tokens per prompt, `</s>` included (`text_len` of every Wan config).
pub const MAX_TOKENS: usize = 512;
/// File name of the tokenizer inside a model folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of the SentencePiece model inside a model folder.
pub const SPM_FILE: &str = "spiece.model";
/// The end-of-sequence token T5 appends.
pub const EOS_TOKEN: &str = "</s>";
pub use spiece::SPIECE_TENSOR;

/// Why the tokenizer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// No tokenizer file at the path given.
    #[error(
        "no umT5 tokenizer found: put tokenizer.json from the umT5 folder (google/umt5-xxl, inside the Wan model \
         folder) next to the text encoder weights, or pass --tokenizer: {}",
        path.display()
    )]
    NotFound { path: PathBuf },
    /// No tokenizer beside the text encoder weights, and none inside them.
    #[error(
        "no umT5 tokenizer found: the text encoder weights hold no `spiece_model` tensor (ComfyUI's umt5_xxl files \
         do) and no tokenizer.json or spiece.model is beside them; put tokenizer.json from the umT5 folder \
         (google/umt5-xxl, inside the Wan model folder) next to the text encoder weights, or pass --tokenizer: {}",
        weights.display()
    )]
    NotEmbedded { weights: PathBuf },
    /// The file exists but is not a tokenizer the `tokenizers` library reads.
    #[error("cannot read the tokenizer ({reason}); give the tokenizer.json of google/umt5-xxl: {}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    /// A SentencePiece model (a `.model` file or the `spiece_model` tensor of the weights) that does not parse.
    #[error(
        "cannot read {what} ({reason}); download the file again, or put tokenizer.json from the umT5 folder \
         (google/umt5-xxl) next to the text encoder weights or pass it with --tokenizer: {}",
        path.display()
    )]
    BadSpm {
        what: &'static str,
        reason: String,
        path: PathBuf,
    },
    /// A SentencePiece model of another algorithm than umT5's Unigram.
    #[error(
        "{what} is a SentencePiece {kind} model, but umT5's is Unigram, so these are not umT5's weights; give \
         the tokenizer.json or spiece.model of google/umt5-xxl with --tokenizer: {}",
        path.display()
    )]
    NotUnigram {
        what: &'static str,
        kind: String,
        path: PathBuf,
    },
    /// The tokenizer has no `</s>` token: not a T5 tokenizer.
    #[error("the tokenizer has no `</s>` token, so it is not umT5's; give the tokenizer.json or spiece.model of google/umt5-xxl: {}", path.display())]
    NoEos { path: PathBuf },
    /// The weights file could not be read while looking for the tokenizer inside it.
    #[error(transparent)]
    Weights(#[from] ModelFormatError),
    /// Tokenizing a prompt failed.
    #[error("cannot tokenize the prompt \"{prompt}\": {reason}")]
    Encode { prompt: String, reason: String },
}

/// The tokenizer file of the text encoder at `weights`, if there is one: `tokenizer.json` beside the weights or in
/// a `google/umt5-xxl` (or `umt5-xxl`) folder beside them, as the official Wan model folders ship it, else a
/// `spiece.model` in one of those places. `None` when there is none (ComfyUI's files carry their own).
pub fn tokenizer_beside(weights: &Path) -> Option<PathBuf> {
    let dir = weights.parent().unwrap_or(Path::new("."));
    let folders = [
        dir.to_path_buf(),
        dir.join("google").join("umt5-xxl"),
        dir.join("umt5-xxl"),
    ];
    [TOKENIZER_FILE, SPM_FILE]
        .iter()
        .flat_map(|file| folders.iter().map(move |folder| folder.join(file)))
        .find(|p| p.is_file())
}

/// The tokenizer with Wan's cleaning, truncation and `</s>`.
pub struct UmT5Tokenizer {
    tokenizer: Tokenizer,
    eos_id: u32,
    max_tokens: usize,
}

/// Token ids of a batch, padded with 0 (`<pad>`) to the longest row, and the mask (1 = token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// `[batch][len]` ids.
    pub ids: Vec<Vec<u32>>,
    /// `[batch][len]`, 1 at tokens, 0 at padding.
    pub mask: Vec<Vec<u32>>,
}

impl TokenBatch {
    /// Tokens per row (before padding).
    pub fn lens(&self) -> Vec<usize> {
        self.mask
            .iter()
            .map(|m| m.iter().filter(|&&v| v != 0).count())
            .collect()
    }
}

impl UmT5Tokenizer {
    /// The tokenizer of the text encoder at `weights`: `explicit` when given, else the file [`tokenizer_beside`]
    /// finds, else the SentencePiece model stored in the weights as the `spiece_model` tensor (ComfyUI's umT5
    /// files), of which only the header and that tensor are read.
    pub fn for_weights(weights: &Path, explicit: Option<&Path>) -> Result<Self, TokenizerError> {
        match explicit
            .map(Path::to_path_buf)
            .or_else(|| tokenizer_beside(weights))
        {
            Some(path) => Self::load(&path),
            None => Self::embedded(weights),
        }
    }

    /// Reads a SentencePiece model (a path ending `.model`) or a `tokenizer.json` (any other path).
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        if !path.is_file() {
            return Err(TokenizerError::NotFound {
                path: path.to_path_buf(),
            });
        }
        let unreadable = |reason: String| TokenizerError::Unreadable {
            path: path.to_path_buf(),
            reason,
        };
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("model"))
        {
            // SentencePiece models are a few megabytes; a gigabyte is not one.
            let bytes = framesmith_nn::file::read_regular(path, 1 << 30)
                .map_err(|e| unreadable(e.to_string()))?;
            return Self::from_spm(&bytes, "the SentencePiece model", path);
        }
        // The tokenizers library can panic on damaged files rather than return an error; a bad file is the user's
        // input, so it becomes an error here.
        let bytes = framesmith_nn::file::read_regular(path, 1 << 30)
            .map_err(|e| unreadable(e.to_string()))?;
        let tokenizer = std::panic::catch_unwind(|| Tokenizer::from_bytes(&bytes))
            .map_err(|_| unreadable("the tokenizers library crashed reading it".into()))?
            .map_err(|e| unreadable(e.to_string()))?;
        Self::new(tokenizer, path)
    }

    /// The tokenizer stored in the weights at `path` as the `spiece_model` tensor.
    fn embedded(path: &Path) -> Result<Self, TokenizerError> {
        let what = "the `spiece_model` tensor";
        match spiece::read_embedded(path)? {
            Embedded::Model(bytes) => Self::from_spm(&bytes, what, path),
            Embedded::Absent => Err(TokenizerError::NotEmbedded {
                weights: path.to_path_buf(),
            }),
            Embedded::Unusable(reason) => Err(TokenizerError::BadSpm {
                what,
                reason,
                path: path.to_path_buf(),
            }),
        }
    }

    /// Builds the tokenizer of a serialized SentencePiece model; `what` and `origin` name it in errors.
    pub(crate) fn from_spm(
        bytes: &[u8],
        what: &'static str,
        origin: &Path,
    ) -> Result<Self, TokenizerError> {
        let path = origin.to_path_buf();
        let tokenizer = spiece::tokenizer_from_spm(bytes).map_err(|problem| match problem {
            SpmProblem::Unreadable(reason) => TokenizerError::BadSpm { what, reason, path },
            SpmProblem::NotUnigram(kind) => TokenizerError::NotUnigram { what, kind, path },
        })?;
        Self::new(tokenizer, origin)
    }

    /// Wraps a tokenizer built in memory; `origin` names it in errors.
    pub fn new(tokenizer: Tokenizer, origin: &Path) -> Result<Self, TokenizerError> {
        let eos_id = tokenizer
            .token_to_id(EOS_TOKEN)
            .ok_or_else(|| TokenizerError::NoEos {
                path: origin.to_path_buf(),
            })?;
        Ok(Self {
            tokenizer,
            eos_id,
            max_tokens: MAX_TOKENS,
        })
    }

    /// The same tokenizer with another token limit (`</s>` included; at least 1).
    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens.max(1);
        self
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Token ids of one prompt: cleaned, tokenized without special tokens, cut to `max_tokens − 1`, then `</s>`.
    /// The `</s>` is appended here rather than by the file's post-processor, so a tokenizer.json saved without
    /// one still gives the official ids.
    pub fn tokenize(&self, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
        let cleaned = clean_prompt(prompt);
        let failed = |reason: String| TokenizerError::Encode {
            prompt: prompt.to_string(),
            reason,
        };
        // A damaged normaliser table can make the library index out of bounds: an error, not a crash.
        let encoding = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.tokenizer.encode(cleaned.as_str(), false)
        }))
        .map_err(|_| {
            failed("the tokenizers library crashed (is the tokenizer file damaged?)".into())
        })?
        .map_err(|e| failed(e.to_string()))?;
        let mut ids: Vec<u32> = encoding.get_ids().to_vec();
        ids.truncate(self.max_tokens - 1);
        ids.push(self.eos_id);
        Ok(ids)
    }

    /// Token ids and mask of `prompts`, padded with 0 to the longest. The official wrapper pads to 512; the
    /// encoder masks padded keys, so the tokens' outputs do not depend on how far a batch is padded.
    pub fn tokenize_batch(&self, prompts: &[&str]) -> Result<TokenBatch, TokenizerError> {
        let rows = prompts
            .iter()
            .map(|p| self.tokenize(p))
            .collect::<Result<Vec<_>, _>>()?;
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mask = rows
            .iter()
            .map(|r| {
                let mut m = vec![1u32; r.len()];
                m.resize(width, 0);
                m
            })
            .collect();
        let ids = rows
            .into_iter()
            .map(|mut r| {
                r.resize(width, 0);
                r
            })
            .collect();
        Ok(TokenBatch { ids, mask })
    }
}

/// Wan's `clean='whitespace'`: `whitespace_clean(basic_clean(text))`, where `basic_clean` is `ftfy.fix_text`,
/// then `html.unescape` twice, then `strip`. Of ftfy's fixes this applies the ones that change ordinary prompts:
/// curly quotes to straight ones, full-width ASCII and the ideographic space to their plain forms (Chinese
/// prompts use `，`), Latin ligatures split, control characters dropped. Mojibake repair and NFC are left out:
/// the umT5 tokenizer's own NFKC normaliser covers the Unicode forms, and mis-decoded text does not come from
/// caption files read as UTF-8.
pub fn clean_prompt(text: &str) -> String {
    let fixed = fix_text(text);
    let unescaped = html_unescape(&html_unescape(&fixed));
    unescaped.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn fix_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\u{2018}'..='\u{201b}' | '\u{02bc}' => out.push('\''),
            '\u{201c}'..='\u{201f}' => out.push('"'),
            '\u{3000}' => out.push(' '),
            '\u{ff01}'..='\u{ff5e}' => {
                out.push(char::from_u32(c as u32 - 0xfee0).unwrap_or(c));
            }
            '\u{fb00}' => out.push_str("ff"),
            '\u{fb01}' => out.push_str("fi"),
            '\u{fb02}' => out.push_str("fl"),
            '\u{fb03}' => out.push_str("ffi"),
            '\u{fb04}' => out.push_str("ffl"),
            '\u{fb05}' | '\u{fb06}' => out.push_str("st"),
            // ftfy's remove_control_chars: C0 controls other than tab / newlines, DEL, the deprecated
            // formatting characters and the byte-order mark.
            '\u{0000}'..='\u{0008}'
            | '\u{000b}'
            | '\u{000e}'..='\u{001f}'
            | '\u{007f}'
            | '\u{206a}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffc}' => {}
            _ => out.push(c),
        }
    }
    out
}

/// Python's `html.unescape` for numeric references and the named ones prompts contain.
fn html_unescape(text: &str) -> String {
    if !text.contains('&') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        match decode_reference(tail) {
            Some((decoded, used)) => {
                out.push_str(&decoded);
                rest = &tail[used..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The character a reference at the start of `s` (`&amp;`, `&#39;`, `&#x27;`) stands for, and its length.
fn decode_reference(s: &str) -> Option<(String, usize)> {
    let end = s.find(';')?;
    if end > 32 {
        return None;
    }
    let body = &s[1..end];
    let decoded = if let Some(num) = body.strip_prefix('#') {
        let code = match num.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => num.parse::<u32>().ok()?,
        };
        // Python maps 0 and invalid code points to U+FFFD.
        char::from_u32(code)
            .filter(|&c| c != '\0')
            .unwrap_or('\u{fffd}')
            .to_string()
    } else {
        match body {
            "amp" => "&",
            "lt" => "<",
            "gt" => ">",
            "quot" => "\"",
            "apos" => "'",
            "nbsp" => "\u{a0}",
            "hellip" => "\u{2026}",
            "mdash" => "\u{2014}",
            "ndash" => "\u{2013}",
            "copy" => "\u{a9}",
            "reg" => "\u{ae}",
            "deg" => "\u{b0}",
            _ => return None,
        }
        .to_string()
    };
    Some((decoded, end + 1))
}

#[cfg(test)]
mod tests;

/// Test support for every crate: a tiny tokenizer written in code.
pub mod testkit;
