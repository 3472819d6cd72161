//! The tokenizers of FLUX.1's text encoders, as its `HFEmbedder` calls them (`truncation=True`,
//! `padding="max_length"`): CLIP-L to 77 ids (start token, text, end token, padded with the end token) and T5-XXL
//! to 512 ids for dev / 256 for schnell (text, `</s>`, padded with id 0). Both are read by the `tokenizers` crate
//! from a `tokenizer.json` beside the weights or at the path the user gives; nothing is ever fetched.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use tokenizers::{PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// CLIP-L's context length.
pub const CLIP_MAX_TOKENS: usize = 77;
/// T5 length for FLUX.1 [dev] (schnell uses 256).
pub const T5_MAX_TOKENS_DEV: usize = 512;
/// T5 length for FLUX.1 [schnell].
pub const T5_MAX_TOKENS_SCHNELL: usize = 256;

/// Which of the two tokenizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextTokenizerKind {
    ClipL,
    T5,
}

impl TextTokenizerKind {
    /// The Hugging Face repository whose `tokenizer.json` is needed.
    fn source(self) -> &'static str {
        match self {
            Self::ClipL => "openai/clip-vit-large-patch14 (or the tokenizer/ folder of black-forest-labs/FLUX.1-dev)",
            Self::T5 => "google/t5-v1_1-xxl (or the tokenizer_2/ folder of black-forest-labs/FLUX.1-dev)",
        }
    }

    /// Folders beside the weights that may hold the tokenizer (diffusers' FLUX layout names them so).
    fn folders(self) -> [&'static str; 2] {
        match self {
            Self::ClipL => ["tokenizer", "clip_l_tokenizer"],
            Self::T5 => ["tokenizer_2", "t5_tokenizer"],
        }
    }

    /// The token that pads (CLIP pads with its end token; T5 with `<pad>`).
    fn pad_token(self) -> &'static str {
        match self {
            Self::ClipL => "<|endoftext|>",
            Self::T5 => "<pad>",
        }
    }
}

/// Why a tokenizer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FluxTokenizerError {
    #[error("no {kind:?} tokenizer found: put tokenizer.json from {} next to the weights, or pass its path: {}", kind.source(), path.display())]
    NotFound {
        kind: TextTokenizerKind,
        path: PathBuf,
    },
    #[error("cannot read the tokenizer ({reason}); give the tokenizer.json of {}: {}", kind.source(), path.display())]
    Unreadable {
        kind: TextTokenizerKind,
        reason: String,
        path: PathBuf,
    },
    #[error("the tokenizer has no `{token}` token, so it is not the {kind:?} tokenizer; give the tokenizer.json of {}: {}", kind.source(), path.display())]
    WrongTokenizer {
        kind: TextTokenizerKind,
        token: &'static str,
        path: PathBuf,
    },
    #[error("cannot tokenize the prompt \"{prompt}\": {reason}")]
    Encode { prompt: String, reason: String },
}

/// A tokenizer that gives fixed-length id rows.
pub struct FluxTokenizer {
    tokenizer: Tokenizer,
    max_tokens: usize,
}

/// `tokenizer.json` for the encoder weights at `weights`: beside them, or in one of the folders beside them
/// that the FLUX.1 repository uses.
pub fn tokenizer_beside(weights: &Path, kind: TextTokenizerKind) -> Option<PathBuf> {
    let dir = weights.parent()?;
    std::iter::once(dir.join("tokenizer.json"))
        .chain(
            kind.folders()
                .iter()
                .map(|f| dir.join(f).join("tokenizer.json")),
        )
        .find(|p| p.is_file())
}

impl FluxTokenizer {
    /// The tokenizer at `explicit`, else the one beside `weights`.
    pub fn for_weights(
        weights: &Path,
        explicit: Option<&Path>,
        kind: TextTokenizerKind,
        max_tokens: usize,
    ) -> Result<Self, FluxTokenizerError> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => {
                tokenizer_beside(weights, kind).ok_or_else(|| FluxTokenizerError::NotFound {
                    kind,
                    path: weights.to_path_buf(),
                })?
            }
        };
        Self::load(&path, kind, max_tokens)
    }

    /// Reads `tokenizer.json` at `path`, truncating and padding to `max_tokens`.
    pub fn load(
        path: &Path,
        kind: TextTokenizerKind,
        max_tokens: usize,
    ) -> Result<Self, FluxTokenizerError> {
        if !path.is_file() {
            return Err(FluxTokenizerError::NotFound {
                kind,
                path: path.to_path_buf(),
            });
        }
        let unreadable = |reason: String| FluxTokenizerError::Unreadable {
            kind,
            reason,
            path: path.to_path_buf(),
        };
        let mut tokenizer = Tokenizer::from_file(path).map_err(|e| unreadable(e.to_string()))?;
        let pad_token = kind.pad_token();
        let pad_id =
            tokenizer
                .token_to_id(pad_token)
                .ok_or_else(|| FluxTokenizerError::WrongTokenizer {
                    kind,
                    token: pad_token,
                    path: path.to_path_buf(),
                })?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..Default::default()
            }))
            .map_err(|e| unreadable(e.to_string()))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(max_tokens),
            direction: PaddingDirection::Right,
            pad_id,
            pad_token: pad_token.into(),
            ..Default::default()
        }));
        Ok(Self {
            tokenizer,
            max_tokens,
        })
    }

    /// The ids [prompts, max_tokens] (u32) of `prompts`, special tokens added, truncated and padded.
    pub fn encode(&self, prompts: &[&str], device: &Device) -> Result<Tensor, FluxTokenizerError> {
        let mut ids = Vec::with_capacity(prompts.len() * self.max_tokens);
        for prompt in prompts {
            let encoding =
                self.tokenizer
                    .encode(*prompt, true)
                    .map_err(|e| FluxTokenizerError::Encode {
                        prompt: prompt.to_string(),
                        reason: e.to_string(),
                    })?;
            ids.extend_from_slice(encoding.get_ids());
        }
        Tensor::from_vec(ids, (prompts.len(), self.max_tokens), device).map_err(|e| {
            FluxTokenizerError::Encode {
                prompt: prompts.join(" | "),
                reason: e.to_string(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer.json with CLIP's special tokens and a template that adds them.
    fn clip_like_json() -> String {
        r#"{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{"id":3,"content":"<|startoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
                            {"id":4,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},
            "post_processor":{"type":"TemplateProcessing",
                "single":[{"SpecialToken":{"id":"<|startoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<|endoftext|>","type_id":0}}],
                "pair":[{"Sequence":{"id":"A","type_id":0}}],
                "special_tokens":{"<|startoftext|>":{"id":"<|startoftext|>","ids":[3],"tokens":["<|startoftext|>"]},
                                  "<|endoftext|>":{"id":"<|endoftext|>","ids":[4],"tokens":["<|endoftext|>"]}}},
            "decoder":null,
            "model":{"type":"WordLevel","vocab":{"a":0,"cat":1,"sits":2,"<|startoftext|>":3,"<|endoftext|>":4},"unk_token":"a"}}"#
            .to_string()
    }

    #[test]
    fn clip_ids_are_padded_with_the_end_token_and_truncated() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let weights = dir.path().join("clip_l.safetensors");
        std::fs::create_dir(dir.path().join("tokenizer"))?;
        std::fs::write(
            dir.path().join("tokenizer/tokenizer.json"),
            clip_like_json(),
        )?;
        let tok = FluxTokenizer::for_weights(&weights, None, TextTokenizerKind::ClipL, 6)?;
        let ids = tok.encode(&["a cat sits", "cat cat cat cat cat cat cat"], &Device::Cpu)?;
        assert_eq!(
            ids.to_vec2::<u32>()?,
            vec![vec![3, 0, 1, 2, 4, 4], vec![3, 1, 1, 1, 1, 4]]
        );
        Ok(())
    }

    #[test]
    fn a_missing_tokenizer_says_which_file_is_needed() {
        let err = FluxTokenizer::for_weights(
            Path::new("/nowhere/t5xxl_fp16.safetensors"),
            None,
            TextTokenizerKind::T5,
            T5_MAX_TOKENS_DEV,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains("tokenizer.json") && err.contains("google/t5-v1_1-xxl"),
            "{err}"
        );
    }
}
