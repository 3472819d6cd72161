//! Prompts to text embeddings as Qwen-Image's pipeline makes them (diffusers' `QwenImagePipeline`:
//! `_get_qwen_prompt_embeds`, then `encode_prompt`): each prompt put into the official template, tokenized (at most
//! 1024 + 34 tokens), run through the language model as one right-padded batch, the final norm's output
//! (`hidden_states[-1]`) kept at each prompt's tokens, its first 34 (the template's system part and
//! `<|im_start|>user\n`) dropped, the rows re-padded with zeros to the longest and cut to `max_sequence_length`.

use std::path::Path;

use candle_core::{DType, Tensor};

use super::model::Qwen25VlText;
use super::tokenizer::{Qwen2Tokenizer, Qwen2TokenizerError};
use super::weights::{load_text_model, LoadOptions, Qwen25VlFormatError};

/// Qwen-Image's `prompt_template_encode`; the prompt replaces `{}`.
pub const QWEN_IMAGE_TEMPLATE: &str = "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";
/// Qwen-Image's system message, as its template holds it.
pub const QWEN_IMAGE_SYSTEM: &str = "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:";
/// Qwen-Image's `prompt_template_encode_start_idx`: the template's tokens before the prompt.
pub const QWEN_IMAGE_DROP_TOKENS: usize = 34;
/// Qwen-Image's `tokenizer_max_length`: prompt tokens kept by the tokenizer (the template's 34 come on top).
pub const QWEN_IMAGE_TOKENIZER_MAX_LENGTH: usize = 1024;
/// The pipeline's default `max_sequence_length` (its `__call__`; at most 1024).
pub const QWEN_IMAGE_MAX_SEQUENCE_LENGTH: usize = 512;

/// Why prompts could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum Qwen25VlError {
    #[error(transparent)]
    Weights(#[from] Qwen25VlFormatError),
    #[error(transparent)]
    Tokenizer(#[from] Qwen2TokenizerError),
    #[error("Qwen2.5-VL text encoder: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// Text embeddings of a batch of prompts.
#[derive(Debug, Clone)]
pub struct PromptEmbeds {
    /// [b, l, hidden] in the model's dtype; rows past a prompt's length are zero.
    pub embeds: Tensor,
    /// [b, l] u32: 1 at a prompt's tokens, 0 after them (always returned, even when all ones).
    pub mask: Tensor,
    /// Tokens per prompt (the mask's row sums).
    pub lens: Vec<usize>,
}

/// The text Qwen2.5-VL's chat template makes of a system message and one user message, with the assistant's turn
/// opened (`apply_chat_template(..., add_generation_prompt=True)`); HunyuanVideo 1.5 encodes its prompts so.
pub fn chat_prompt(system: &str, user: &str) -> String {
    format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}

/// `hidden` [b, l, hidden] of right-padded rows with `lens` tokens each: every row's tokens after its first
/// `drop`, re-padded with zeros to the longest, then cut to `max_sequence_length`.
pub fn drop_and_repad(
    hidden: &Tensor,
    lens: &[usize],
    drop: usize,
    max_sequence_length: usize,
) -> candle_core::Result<PromptEmbeds> {
    let (b, l, h) = hidden.dims3()?;
    if lens.len() != b || lens.iter().any(|&n| n > l) {
        candle_core::bail!(
            "Qwen2.5-VL: lengths {lens:?} do not fit hidden states of shape {:?}",
            hidden.dims()
        );
    }
    let kept: Vec<usize> = lens.iter().map(|&n| n.saturating_sub(drop)).collect();
    let out_len = kept
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .min(max_sequence_length);
    let mut rows = Vec::with_capacity(b);
    let mut mask = Vec::with_capacity(b * out_len);
    let mut out_lens = Vec::with_capacity(b);
    for (i, &k) in kept.iter().enumerate() {
        let k = k.min(out_len);
        let tokens = hidden.get(i)?.narrow(0, drop.min(l), k)?;
        let zeros = Tensor::zeros((out_len - k, h), hidden.dtype(), hidden.device())?;
        rows.push(Tensor::cat(&[&tokens, &zeros], 0)?);
        mask.extend((0..out_len).map(|j| u32::from(j < k)));
        out_lens.push(k);
    }
    let embeds = if rows.is_empty() {
        Tensor::zeros((0, out_len, h), hidden.dtype(), hidden.device())?
    } else {
        Tensor::stack(&rows, 0)?
    };
    Ok(PromptEmbeds {
        embeds,
        mask: Tensor::from_vec(mask, (b, out_len), hidden.device())?,
        lens: out_lens,
    })
}

/// The language model with its tokenizer: Qwen-Image's prompt encoding, and the parts for other templates.
pub struct Qwen25VlTextEncoder {
    pub tokenizer: Qwen2Tokenizer,
    pub model: Qwen25VlText,
}

impl Qwen25VlTextEncoder {
    /// Loads the tokenizer (`tokenizer`, else one found near the weights; first, as it is small and a missing one
    /// should not cost a 15 GB read) and the language model at `weights` (a file or a folder).
    pub fn load(
        weights: &Path,
        tokenizer: Option<&Path>,
        options: &LoadOptions,
    ) -> Result<Self, Qwen25VlError> {
        let tokenizer = Qwen2Tokenizer::for_weights(weights, tokenizer)?;
        let model = load_text_model(weights, options)?;
        Ok(Self { tokenizer, model })
    }

    /// Qwen-Image's embeddings of `prompts` with the pipeline's default `max_sequence_length` (512).
    pub fn encode_prompts(&self, prompts: &[String]) -> Result<PromptEmbeds, Qwen25VlError> {
        self.encode_prompts_up_to(prompts, QWEN_IMAGE_MAX_SEQUENCE_LENGTH)
    }

    /// Qwen-Image's embeddings of `prompts`, at most `max_sequence_length` tokens each.
    pub fn encode_prompts_up_to(
        &self,
        prompts: &[String],
        max_sequence_length: usize,
    ) -> Result<PromptEmbeds, Qwen25VlError> {
        let texts: Vec<String> = prompts
            .iter()
            .map(|p| QWEN_IMAGE_TEMPLATE.replacen("{}", p, 1))
            .collect();
        let max_tokens = QWEN_IMAGE_TOKENIZER_MAX_LENGTH + QWEN_IMAGE_DROP_TOKENS;
        let batch = self
            .tokenizer
            .encode_batch(&texts, max_tokens, self.model.device())?;
        let hidden = self.model.hidden_states(&batch.ids, &batch.mask, 0)?;
        let out = drop_and_repad(
            &hidden,
            &batch.lens,
            QWEN_IMAGE_DROP_TOKENS,
            max_sequence_length,
        )?;
        Ok(out)
    }

    /// `hidden_states[-(skip_last_layers + 1)]` [b, l, hidden] of `texts` taken as they are (a caller's own
    /// template), cut to `max_tokens` and right-padded, with their mask [b, l] (u32).
    pub fn hidden_states_of_texts(
        &self,
        texts: &[String],
        max_tokens: usize,
        skip_last_layers: usize,
    ) -> Result<(Tensor, Tensor), Qwen25VlError> {
        let batch = self
            .tokenizer
            .encode_batch(texts, max_tokens, self.model.device())?;
        let hidden = self
            .model
            .hidden_states(&batch.ids, &batch.mask, skip_last_layers)?;
        Ok((hidden, batch.mask))
    }

    /// The model's compute dtype.
    pub fn dtype(&self) -> DType {
        self.model.dtype()
    }
}
