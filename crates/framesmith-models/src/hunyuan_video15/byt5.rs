//! HunyuanVideo 1.5's glyph encoder, as the official pipeline runs it (`_process_single_byt5_prompt` of
//! github:Tencent-Hunyuan/HunyuanVideo-1.5 @60783e7): the prompt's quoted text ([`super::text::glyph_text`])
//! tokenized by byT5's byte tokenizer with Glyph-SDXL-v2's colour and font tokens ([`tokenizer`]) to at most 256
//! tokens, and run through byT5-small's encoder with Glyph-SDXL-v2's weights (vocabulary 1510, width 1472). The
//! encoder is the shared T5 v1.1 encoder of [`crate::t5`]; its sizes are read from the file. The hidden states
//! of the valid tokens are what the DiT's `byt5_in` projection takes (and what musubi-tuner's `_hv15_te` caches
//! hold as `varlen_byt5_embed`); the pipeline's padding to 256 is masked out there, so it is not made here.
//! Its files ([`files`]): the official `Glyph-SDXL-v2/checkpoints/byt5_model.pt` and ComfyUI's
//! `byt5_small_glyphxl_fp16.safetensors`.

pub mod files;
pub mod tokenizer;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};

use super::text::glyph_text;
use crate::t5::v1_1::{t5_config_from_hf_shapes, t5_encoder_keys};
use crate::t5::{T5Config, UmT5Encoder};
use crate::wan::weights::{read_whole_file, WeightsFileError};
use framesmith_nn::vb::Vb;

pub use files::{glyph_beside, glyph_weights_file, identify, GlyphFile, GlyphLayout};

/// `byt5_max_length` of the official pipeline: tokens a glyph text is cut to, the end token included.
pub const MAX_LENGTH: usize = 256;
/// Width of byT5-small's hidden states (the DiT's `text_embed_2_dim`).
pub const WIDTH: usize = 1472;

/// What the model is called in messages.
const MODEL: &str = "byT5 glyph encoder";

/// The glyph encoder. Frozen: inference only.
pub struct GlyphEncoder {
    encoder: UmT5Encoder,
}

impl GlyphEncoder {
    /// The encoder from tensors under any of its layouts' names (official `byt5_model.pt`, ComfyUI, a Hugging
    /// Face T5 encoder), its sizes read from their shapes; the error says what is missing or wrong.
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> std::result::Result<Self, String> {
        let hf = files::hf_encoder_names(tensors);
        let cfg = t5_config_from_hf_shapes(|name| hf.get(name).map(|t| t.dims().to_vec()))?;
        check_vocabulary(&cfg)?;
        let vb = Vb::from_tensors(t5_encoder_keys(hf), dtype, device);
        let encoder = UmT5Encoder::new(&cfg, &vb).map_err(|e| e.to_string())?;
        Ok(Self { encoder })
    }

    /// Loads the encoder from `path`: a weights file, or a folder holding the official one (the release's
    /// `text_encoder/`, or `Glyph-SDXL-v2/`).
    pub fn load(
        path: &Path,
        dtype: DType,
        device: &Device,
    ) -> std::result::Result<Self, WeightsFileError> {
        let file = glyph_weights_file(path)?;
        let tensors = read_whole_file(&file)?;
        Self::from_tensors(tensors, dtype, device).map_err(|detail| WeightsFileError::Mismatch {
            path: file,
            model: MODEL,
            detail,
        })
    }

    /// The encoder's sizes.
    pub fn config(&self) -> &T5Config {
        self.encoder.config()
    }

    /// The hidden states [L, width] of a glyph text's tokens (the end token included, L ≤ 256).
    pub fn encode_text(&self, text: &str) -> Result<Tensor> {
        let ids = tokenizer::token_ids(text, MAX_LENGTH);
        let len = ids.len();
        let device = self.encoder.device();
        let ids = Tensor::from_vec(ids, (1, len), device)?;
        let mask = Tensor::ones((1, len), DType::U32, device)?;
        self.encoder.encode(&ids, &mask)?.squeeze(0)
    }

    /// The glyph states [L, width] of `prompt`'s quoted text, `None` when it quotes nothing (the pipeline's
    /// all-masked glyph input).
    pub fn encode_prompt(&self, prompt: &str) -> Result<Option<Tensor>> {
        glyph_text(prompt)
            .map(|text| self.encode_text(&text))
            .transpose()
    }
}

/// The released glyph encoder has Glyph-SDXL-v2's tokens; google/byt5-small alone (384) is the base it was
/// trained from, and names what to use instead.
fn check_vocabulary(cfg: &T5Config) -> std::result::Result<(), String> {
    if cfg.vocab == tokenizer::GLYPH_VOCAB {
        return Ok(());
    }
    if cfg.vocab == tokenizer::BASE_VOCAB {
        return Err(
            "this is google/byt5-small itself (vocabulary 384), without Glyph-SDXL-v2's colour and font tokens \
             and weights; HunyuanVideo 1.5 needs Glyph-SDXL-v2's checkpoints/byt5_model.pt (the release's \
             text_encoder/Glyph-SDXL-v2) or ComfyUI's byt5_small_glyphxl_fp16.safetensors"
                .into(),
        );
    }
    Err(format!(
        "a T5 encoder with a vocabulary of {}, not Glyph-SDXL-v2's byT5 ({}): use \
         byt5_small_glyphxl_fp16.safetensors or Glyph-SDXL-v2's checkpoints/byt5_model.pt",
        cfg.vocab,
        tokenizer::GLYPH_VOCAB
    ))
}

#[cfg(test)]
mod tests;
