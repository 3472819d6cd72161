//! HunyuanVideo 1.5's prompt encoding with Qwen2.5-VL, as the official pipeline makes it (diffusers'
//! `HunyuanVideo15Pipeline._get_mllm_prompt_embeds`; the official repository's `TextEncoder` with the
//! `li-dit-encode-video-json` template): each prompt (an empty one as " ") put as the user message after the video
//! system message in Qwen2.5-VL's chat template with the assistant's turn opened, tokenized to at most
//! 1000 + 108 tokens, run through the language model, `hidden_states[-3]` (after layer N-2, no final norm) kept,
//! and its first 108 tokens (the system part and `<|im_start|>user\n`) and their mask columns dropped.
//!
//! The pipeline pads every row to 1000 tokens and keeps the pad tokens' states under a zero mask; the transformer
//! reads only the masked-in tokens, so here the rows are re-padded with zeros to the longest prompt instead (the
//! states at the prompts' own tokens are the same: attention is causal and masks the padding).
//!
//! The quoted text the glyph encoder (byT5) reads is taken from the prompt here too ([`glyph_text`]).

use crate::qwen25vl::encoder::{chat_prompt, drop_and_repad};
use crate::qwen25vl::{PromptEmbeds, Qwen25VlError, Qwen25VlTextEncoder};

/// The pipeline's `system_message` (the official video template's system part).
pub const SYSTEM_MESSAGE: &str = "You are a helpful assistant. Describe the video by detailing the following aspects:         1. The main content and theme of the video.         2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.         3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.         4. background environment, light, style and atmosphere.         5. camera angles, movements, and transitions used in the video.";
/// `prompt_template_encode_start_idx`: the template's tokens before the prompt, dropped.
pub const CROP_START: usize = 108;
/// `tokenizer_max_length`: the tokens kept after the crop (the template's 108 come on top when tokenizing).
pub const MAX_LENGTH: usize = 1000;
/// `num_hidden_layers_to_skip`: `hidden_states[-(2 + 1)]`.
pub const SKIP_LAST_LAYERS: usize = 2;

/// A prompt as the chat template receives it: an empty prompt becomes one space.
pub fn templated(prompt: &str) -> String {
    chat_prompt(SYSTEM_MESSAGE, if prompt.is_empty() { " " } else { prompt })
}

/// HunyuanVideo 1.5's Qwen2.5-VL embeddings of `prompts` ([b, l, 3584], l ≤ 1000; rows past a prompt's tokens
/// zero) with their mask.
pub fn encode_prompts(
    encoder: &Qwen25VlTextEncoder,
    prompts: &[String],
) -> Result<PromptEmbeds, Qwen25VlError> {
    encode_prompts_up_to(encoder, prompts, MAX_LENGTH)
}

/// [`encode_prompts`] keeping at most `max_length` tokens a prompt (the pipeline's `tokenizer_max_length`).
pub fn encode_prompts_up_to(
    encoder: &Qwen25VlTextEncoder,
    prompts: &[String],
    max_length: usize,
) -> Result<PromptEmbeds, Qwen25VlError> {
    let texts: Vec<String> = prompts.iter().map(|p| templated(p)).collect();
    let (hidden, mask) =
        encoder.hidden_states_of_texts(&texts, max_length + CROP_START, SKIP_LAST_LAYERS)?;
    let lens = mask
        .sum(1)?
        .to_vec1::<u32>()?
        .into_iter()
        .map(|n| n as usize)
        .collect::<Vec<_>>();
    Ok(drop_and_repad(&hidden, &lens, CROP_START, max_length)?)
}

/// The text the glyph (byT5) encoder reads from `prompt`, as the pipeline's `extract_glyph_texts` makes it: the
/// spans in straight ("…") or curly (“…”) double quotes, each closed by the nearest closing quote on its line,
/// duplicates dropped (first kept), written `Text "a". Text "b". `; `None` when the prompt quotes nothing.
pub fn glyph_text(prompt: &str) -> Option<String> {
    let chars: Vec<char> = prompt.chars().collect();
    let mut spans: Vec<String> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let close = match chars[i] {
            '"' => '"',
            '\u{201c}' => '\u{201d}',
            _ => {
                i += 1;
                continue;
            }
        };
        let rest = &chars[i + 1..];
        match rest.iter().position(|&c| c == close || c == '\n') {
            Some(n) if rest[n] == close => {
                let span: String = rest[..n].iter().collect();
                if !spans.contains(&span) {
                    spans.push(span);
                }
                i += n + 2;
            }
            _ => i += 1,
        }
    }
    if spans.is_empty() {
        return None;
    }
    let texts: Vec<String> = spans.iter().map(|t| format!("Text \"{t}\"")).collect();
    Some(texts.join(". ") + ". ")
}

#[cfg(test)]
mod tests;
