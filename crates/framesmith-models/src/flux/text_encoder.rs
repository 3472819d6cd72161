//! FLUX.1's text conditioning from prompts (the two `HFEmbedder`s of the official `conditioner.py`, as `prepare`
//! uses them): T5-XXL's token states `txt` [b, max_tokens, 4096] — padding positions included and attended, no
//! mask, as FLUX calls it — and CLIP-L's pooled output `vec` [b, 768], each encoder with its tokenizer.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::clip_text::ClipTextModel;
use super::tokenizer::{FluxTokenizer, FluxTokenizerError, TextTokenizerKind, CLIP_MAX_TOKENS};
use super::weights::{load_clip_text, load_t5_xxl, FluxFormatError};
use crate::t5::UmT5Encoder;

/// Why the text encoders could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum FluxTextError {
    #[error(transparent)]
    Weights(#[from] FluxFormatError),
    #[error(transparent)]
    Tokenizer(#[from] FluxTokenizerError),
    #[error("text encoding failed: {0}")]
    Encode(#[from] candle_core::Error),
}

/// Where the text encoders and their tokenizers are.
#[derive(Debug, Clone, Copy)]
pub struct TextEncoderFiles<'a> {
    /// `clip_l.safetensors`.
    pub clip: &'a Path,
    /// Its `tokenizer.json`, when not beside it.
    pub clip_tokenizer: Option<&'a Path>,
    /// `t5xxl_*.safetensors`.
    pub t5: &'a Path,
    /// Its `tokenizer.json`, when not beside it.
    pub t5_tokenizer: Option<&'a Path>,
    /// T5 sequence length: 512 for dev, 256 for schnell.
    pub t5_max_tokens: usize,
}

/// CLIP-L and T5-XXL with their tokenizers.
pub struct FluxTextEncoder {
    clip: ClipTextModel,
    clip_tokenizer: FluxTokenizer,
    t5: UmT5Encoder,
    t5_tokenizer: FluxTokenizer,
}

impl FluxTextEncoder {
    /// Loads both encoders and finds their tokenizers (never fetched).
    pub fn load(
        files: TextEncoderFiles,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, FluxTextError> {
        let clip = load_clip_text(files.clip, None, dtype, device)?;
        let clip_tokenizer = FluxTokenizer::for_weights(
            files.clip,
            files.clip_tokenizer,
            TextTokenizerKind::ClipL,
            CLIP_MAX_TOKENS.min(clip.config().max_position_embeddings),
        )?;
        Ok(Self {
            clip,
            clip_tokenizer,
            t5: load_t5_xxl(files.t5, dtype, device)?,
            t5_tokenizer: FluxTokenizer::for_weights(
                files.t5,
                files.t5_tokenizer,
                TextTokenizerKind::T5,
                files.t5_max_tokens,
            )?,
        })
    }

    /// From parts already built (tests, or encoders loaded another way).
    pub fn from_parts(
        clip: ClipTextModel,
        clip_tokenizer: FluxTokenizer,
        t5: UmT5Encoder,
        t5_tokenizer: FluxTokenizer,
    ) -> Self {
        Self {
            clip,
            clip_tokenizer,
            t5,
            t5_tokenizer,
        }
    }

    /// `txt` [b, t5_max_tokens, dim] and `vec` [b, clip_dim] for `prompts`.
    pub fn encode(&self, prompts: &[&str]) -> Result<(Tensor, Tensor), FluxTextError> {
        let device = self.clip.device().clone();
        let ids = self.t5_tokenizer.encode(prompts, &device)?;
        let txt = self.t5.encode(&ids, &ids.ones_like()?)?;
        let ids = self.clip_tokenizer.encode(prompts, &device)?;
        let vec = self.clip.forward(&ids)?.pooler_output;
        Ok((txt, vec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{clip_tokenizer_json, t5_tokenizer_json};
    use crate::flux::clip_text::{text_model_prefix, ClipTextConfig};
    use crate::flux::testkit::{assert_close, Case};
    use crate::t5::v1_1::{t5_config_from_hf_json, t5_from_tensors};
    use framesmith_nn::vb::Vb;

    #[test]
    fn prompts_become_txt_and_vec() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let words = ["a", "cat", "sits", "on", "mat"];
        let (clip_json, t5_json) = (clip_tokenizer_json(&words), t5_tokenizer_json(&words));
        let (clip_tok, t5_tok) = (dir.path().join("clip.json"), dir.path().join("t5.json"));
        std::fs::write(&clip_tok, clip_json)?;
        std::fs::write(&t5_tok, t5_json)?;

        let clip_case = Case::load("clip_l")?;
        let cfg = ClipTextConfig::from_json(&clip_case.config["init"].to_string())?;
        let vb = Vb::from_tensors(clip_case.weights.clone(), DType::F32, &Device::Cpu);
        let clip = ClipTextModel::new(&cfg, &text_model_prefix(&vb))?;
        let t5_case = Case::load("t5_encoder")?;
        let t5_cfg = t5_config_from_hf_json(&t5_case.config["init"].to_string())?;
        let t5 = t5_from_tensors(t5_case.weights.clone(), &t5_cfg, DType::F32, &Device::Cpu)?;
        let encoder = FluxTextEncoder::from_parts(
            clip,
            FluxTokenizer::load(&clip_tok, TextTokenizerKind::ClipL, 8)?,
            t5,
            FluxTokenizer::load(&t5_tok, TextTokenizerKind::T5, 6)?,
        );
        let (txt, vec) = encoder.encode(&["a cat sits on a mat", "cat"])?;
        assert_eq!((txt.dims(), vec.dims()), (&[2, 6, 32][..], &[2, 32][..]));

        // The same as the encoders on the ids the tokenizers give (`</s>` then `<pad>` for T5; CLIP pooled at its end token, position 2).
        let ids = Tensor::new(&[[3u32, 1, 0, 0, 0, 0]], &Device::Cpu)?;
        let t5_alone = encoder.t5.encode(&ids, &ids.ones_like()?)?;
        assert_close("txt", &txt.get(1)?.unsqueeze(0)?, &t5_alone, 1e-5, 1e-5)?;
        let ids = Tensor::new(&[[0u32, 3, 1, 1, 1, 1, 1, 1]], &Device::Cpu)?;
        let clip_alone = encoder.clip.forward(&ids)?.pooler_output;
        assert_close("vec", &vec.get(1)?.unsqueeze(0)?, &clip_alone, 1e-5, 1e-5)?;
        Ok(())
    }
}
