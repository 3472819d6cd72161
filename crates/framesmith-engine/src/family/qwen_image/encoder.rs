//! The seam between Qwen-Image and its text encoder: prompts in, Qwen2.5-VL's hidden states and their mask out
//! ([`PromptEncoder`]). The text cache pass, samples and generation encode only through it, so the encoder is
//! one loader ([`load_encoder`]) away: the language model with the official template (its system tokens dropped,
//! `prompt_template_encode_start_idx` = 34) plugs in there. Each prompt keeps the hidden states of its valid tokens
//! only, as musubi-tuner caches them (`embed[:txt_len]`).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

/// Width of Qwen2.5-VL-7B's hidden states (the released transformer's `joint_attention_dim`).
pub const TEXT_DIM: usize = 3584;

/// Turns prompts into Qwen-Image's text conditioning.
pub trait PromptEncoder {
    /// The hidden states [b, L, D] of `prompts` as the Qwen-Image pipeline takes them, and their mask [b, L]
    /// (non-zero: a valid token; each row's valid tokens first, padding after).
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)>;
}

/// The text encoder's files.
#[derive(Debug, Clone, Copy)]
pub struct EncoderFiles<'a> {
    /// Qwen2.5-VL's weights (ComfyUI's `qwen_2.5_vl_7b.safetensors`, its FP8 file, or a diffusers `text_encoder/`).
    pub weights: &'a Path,
    /// Its tokenizer (default: the one beside the weights).
    pub tokenizer: Option<&'a Path>,
}

/// How a caller gets its encoder: [`load_encoder`] in a run; a stand-in in tests.
pub type LoadEncoder<'a> =
    &'a dyn Fn(EncoderFiles<'_>, DType, &Device) -> anyhow::Result<Box<dyn PromptEncoder>>;

/// Loads Qwen-Image's text encoder from `files` in `dtype` on `device`: the one place the Qwen2.5-VL language model
/// plugs in. This build does not run it, so it says how to make the text caches another way.
pub fn load_encoder(
    files: EncoderFiles<'_>,
    _dtype: DType,
    _device: &Device,
) -> anyhow::Result<Box<dyn PromptEncoder>> {
    anyhow::bail!(
        "this Framesmith build cannot run Qwen-Image's text encoder (Qwen2.5-VL) yet: cache the captions with \
         musubi-tuner's qwen_image_cache_text_encoder_outputs.py (Framesmith trains from its `_qi_te` caches as they \
         are) and leave sampling.prompts unset: {}",
        files.weights.display()
    )
}

/// Each of `prompts` through `encoder` on its own (so a prompt's embedding does not depend on which others came
/// with it), as its valid tokens' hidden states [L, D] in `dtype`.
pub fn encode_each(
    encoder: &dyn PromptEncoder,
    prompts: &[&str],
    dtype: DType,
) -> anyhow::Result<Vec<Tensor>> {
    prompts
        .iter()
        .map(|prompt| {
            let (embed, mask) = encoder
                .encode(&[*prompt])
                .with_context(|| format!("encoding the prompt \"{prompt}\""))?;
            valid_rows(&embed, &mask)?
                .into_iter()
                .next()
                .context("the text encoder returned no prompt")?
                .to_dtype(dtype)
                .map_err(Into::into)
        })
        .collect()
}

/// The rows [L_i, D] of each prompt's valid tokens in `embed` [b, L, D] under `mask` [b, L].
pub fn valid_rows(embed: &Tensor, mask: &Tensor) -> anyhow::Result<Vec<Tensor>> {
    let (b, l, _) = embed.dims3()?;
    if mask.dims() != [b, l] {
        anyhow::bail!(
            "the text encoder's mask {:?} does not fit its hidden states {:?}",
            mask.dims(),
            embed.dims()
        );
    }
    let lens = framesmith_models::qwen_image::transformer::txt_lens_from_mask(mask)?;
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            if n == 0 {
                anyhow::bail!("the text encoder gave prompt {i} no valid token");
            }
            Ok(embed.get(i)?.narrow(0, 0, n)?)
        })
        .collect()
}

/// A stand-in text encoder for tests: each word a fixed random vector of width `dim` (the demo model's text
/// embedding), prompts padded to the longest with a mask, as the real encoder returns them.
#[cfg(test)]
pub(crate) struct WordEncoder {
    pub dim: usize,
}

#[cfg(test)]
impl PromptEncoder for WordEncoder {
    fn encode(&self, prompts: &[&str]) -> anyhow::Result<(Tensor, Tensor)> {
        let rows = prompts
            .iter()
            .map(|p| crate::demo::text::embed(p, self.dim, 64, &Device::Cpu))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let lens = rows
            .iter()
            .map(|r| r.dim(0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let longest = lens.iter().copied().max().unwrap_or(0);
        let (mut padded, mut mask) = (Vec::new(), Vec::new());
        for r in &rows {
            let n = r.dim(0)?;
            padded.push(r.pad_with_zeros(0, 0, longest - n)?);
            mask.push(Tensor::cat(
                &[
                    Tensor::ones(n, DType::U8, &Device::Cpu)?,
                    Tensor::zeros(longest - n, DType::U8, &Device::Cpu)?,
                ],
                0,
            )?);
        }
        Ok((Tensor::stack(&padded, 0)?, Tensor::stack(&mask, 0)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_prompt_keeps_its_valid_tokens_alone() -> anyhow::Result<()> {
        let encoder = WordEncoder { dim: 8 };
        let (embed, mask) = encoder.encode(&["a red cat", "dog"])?;
        assert_eq!(embed.dims()[0], 2);
        let rows = valid_rows(&embed, &mask)?;
        assert_eq!((rows[0].dims(), rows[1].dims()), (&[3, 8][..], &[1, 8][..]));
        let each = encode_each(&encoder, &["a red cat", "dog"], DType::F32)?;
        let diff = (&each[1] - &rows[1])?
            .abs()?
            .sum_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        let bad = Tensor::ones((2, 1), DType::U8, &Device::Cpu)?;
        assert!(valid_rows(&embed, &bad).is_err());
        let err = load_encoder(
            EncoderFiles {
                weights: Path::new("qwen_2.5_vl_7b.safetensors"),
                tokenizer: None,
            },
            DType::F32,
            &Device::Cpu,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains("qwen_image_cache_text_encoder_outputs.py")
                && err.ends_with("qwen_2.5_vl_7b.safetensors"),
            "{err}"
        );
        Ok(())
    }
}
