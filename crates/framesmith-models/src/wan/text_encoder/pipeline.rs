//! Prompts to text embeddings as the official `T5EncoderModel` wrapper does it: tokenizer (cleaned, `</s>`, at
//! most 512 tokens), the umT5 encoder over the padded batch with its mask, and each row trimmed to its tokens.
//! Also reads the encoder's sizes from its weights, so any umT5-shaped checkpoint loads without naming a config.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::tokenizer::{TokenizerError, UmT5Tokenizer, SPIECE_TENSOR};
use crate::t5::{official_t5_keys, T5Config, UmT5Encoder};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

/// Why prompts could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum TextEncoderError {
    #[error(transparent)]
    Weights(#[from] WeightsFileError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("umT5 encoder: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// umT5 with its tokenizer: prompts in, `[L_i, dim]` embeddings out.
pub struct TextEncoder {
    pub tokenizer: UmT5Tokenizer,
    pub encoder: UmT5Encoder,
}

impl TextEncoder {
    /// Loads the encoder weights (`.pth` or safetensors, official or Hugging Face names; sizes read from the
    /// weights) and the tokenizer: `tokenizer` when given, else a `tokenizer.json` or `spiece.model` found beside
    /// the weights, else the SentencePiece model ComfyUI stores inside them (see [`UmT5Tokenizer::for_weights`]).
    pub fn load(
        weights: &Path,
        tokenizer: Option<&Path>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, TextEncoderError> {
        // The tokenizer first: it is small, and a missing one should not cost a 10 GB read.
        let tokenizer = UmT5Tokenizer::for_weights(weights, tokenizer)?;
        let encoder = load_umt5_auto(weights, dtype, device)?;
        Ok(Self { tokenizer, encoder })
    }

    /// The embeddings of `prompts`, each `[L_i, dim]` with `L_i` its token count (`</s>` included), computed
    /// as one batch padded to the longest prompt.
    pub fn encode_prompts(&self, prompts: &[&str]) -> Result<Vec<Tensor>, TextEncoderError> {
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let batch = self.tokenizer.tokenize_batch(prompts)?;
        let (b, l) = (batch.ids.len(), batch.ids.first().map_or(0, Vec::len));
        let flat = |rows: &[Vec<u32>]| rows.iter().flatten().copied().collect::<Vec<u32>>();
        let device = Device::Cpu;
        let ids = Tensor::from_vec(flat(&batch.ids), (b, l), &device)?;
        let mask = Tensor::from_vec(flat(&batch.mask), (b, l), &device)?;
        Ok(self.encoder.encode_trimmed(&ids, &mask)?)
    }
}

/// The sizes of a T5 encoder from its tensors (official names): vocabulary and width from the token embedding,
/// attention and feed-forward widths from block 0, the block count, and buckets and heads from the
/// relative-position table (one shared table for T5, one per block for umT5). `None` when a tensor is missing.
pub fn t5_config_from_tensors(tensors: &HashMap<String, Tensor>) -> Option<T5Config> {
    let dims = |key: &str| tensors.get(key).map(|t| t.dims().to_vec());
    let [vocab, dim] = dims("token_embedding.weight")?[..] else {
        return None;
    };
    let [dim_attn, _] = dims("blocks.0.attn.q.weight")?[..] else {
        return None;
    };
    let [dim_ffn, _] = dims("blocks.0.ffn.fc1.weight")?[..] else {
        return None;
    };
    let num_layers = (0..)
        .take_while(|i| tensors.contains_key(&format!("blocks.{i}.attn.q.weight")))
        .count();
    let shared = dims("pos_embedding.embedding.weight");
    let shared_pos = shared.is_some();
    let pos = shared.or_else(|| dims("blocks.0.pos_embedding.embedding.weight"))?;
    let [num_buckets, num_heads] = pos[..] else {
        return None;
    };
    Some(T5Config {
        vocab,
        dim,
        dim_attn,
        dim_ffn,
        num_heads,
        num_layers,
        num_buckets,
        shared_pos,
        ..T5Config::umt5_xxl()
    })
}

/// Loads a T5 encoder whose sizes are read from the weights (umT5-XXL for Wan's files). The tokenizer ComfyUI
/// stores beside the tensors (`spiece_model`) is set aside; [`UmT5Tokenizer::for_weights`] reads it.
pub fn load_umt5_auto(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<UmT5Encoder, WeightsFileError> {
    let mut tensors = read_whole_file(path)?;
    tensors.remove(SPIECE_TENSOR);
    let tensors = official_t5_keys(tensors);
    let Some(cfg) = t5_config_from_tensors(&tensors) else {
        return Err(WeightsFileError::WrongModel {
            path: path.to_path_buf(),
            what: "this file holds no T5 encoder (no `token_embedding.weight`, `blocks.0.attn.q.weight` or \
                   relative-position table)"
                .into(),
        });
    };
    let vb = Vb::from_tensors(tensors, dtype, device);
    UmT5Encoder::new(&cfg, &vb).map_err(|e| WeightsFileError::Mismatch {
        path: path.to_path_buf(),
        model: "umT5 encoder",
        detail: format!("{e}"),
    })
}
