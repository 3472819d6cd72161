//! HunyuanVideo 1.5's prompt encoders as generation, samples and the text pass load them: Qwen2.5-VL-7B (the shared
//! `qwen25vl` model, kept as Qwen-Image's is for what the card has free) with HunyuanVideo 1.5's video template
//! (`framesmith_models::hunyuan_video15::text`), then the byT5 glyph encoder on the prompts' quoted text, each
//! loaded in turn and dropped before the next. The glyph encoder's file is the one given, or the one beside the
//! text encoder (the release's `text_encoder/Glyph-SDXL-v2`, ComfyUI's `byt5_small_glyphxl_fp16.safetensors`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::pipeline::Hv15Text;
use crate::family::qwen_image::encoder::placement_for;
use framesmith_models::hunyuan_video15::byt5::{glyph_beside, GlyphEncoder};
use framesmith_models::hunyuan_video15::text::encode_prompts;
use framesmith_models::qwen25vl::{self, LoadOptions, Qwen25VlTextEncoder};
use framesmith_nn::device::VramUse;
use framesmith_nn::offload::release_cached_memory;

/// The encoders' files.
#[derive(Debug, Clone, Copy)]
pub struct Hv15EncoderFiles<'a> {
    /// Qwen2.5-VL's weights (ComfyUI's file, its FP8 file, or the release's `text_encoder/llm`).
    pub text_encoder: &'a Path,
    /// Its tokenizer (default: the one beside the weights).
    pub tokenizer: Option<&'a Path>,
    /// The glyph encoder (default: the one beside the text encoder).
    pub glyph: Option<&'a Path>,
}

/// How the Qwen2.5-VL language model is loaded: for the card ([`load_qwen`]), or at a small size in tests.
pub type LoadQwen<'a> =
    &'a dyn Fn(&Path, Option<&Path>, DType, &Device) -> anyhow::Result<Qwen25VlTextEncoder>;

/// Loads Qwen2.5-VL from `weights` in `dtype` on `device`, kept as what the card has free allows (bf16
/// resident, FP8 resident, or FP8 layers streamed).
pub fn load_qwen(
    weights: &Path,
    tokenizer: Option<&Path>,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Qwen25VlTextEncoder> {
    let file = qwen25vl::identify(weights)?;
    let free = VramUse::measure(device, 0).map(|use_| use_.free);
    let (fp8, placement) = placement_for(file.parameter_count, free);
    let options = LoadOptions {
        dtype,
        fp8,
        placement,
        ..LoadOptions::new(device)
    };
    Ok(Qwen25VlTextEncoder::load(weights, tokenizer, &options)?)
}

/// The glyph encoder's file: `given`, else the one beside the text encoder; the error says where to put it.
pub fn glyph_file(given: Option<&Path>, text_encoder: &Path) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.to_path_buf());
    }
    glyph_beside(text_encoder).with_context(|| {
        format!(
            "HunyuanVideo 1.5 needs its byT5 glyph encoder, and none is beside the text encoder: put ComfyUI's \
             byt5_small_glyphxl_fp16.safetensors next to it (or the release's Glyph-SDXL-v2 folder in its \
             text_encoder/), or name it with --byt5 ({})",
            text_encoder.display()
        )
    })
}

/// Each of `texts` encoded as HunyuanVideo 1.5 takes it (one at a time, so a text's states do not depend on the
/// others): the Qwen2.5-VL states [L, 3584] of its valid tokens in `dtype`, and its glyph states [L2, 1472]
/// (`None` for a text that quotes nothing). Each encoder is dropped before the next loads.
pub fn encode_texts(
    files: Hv15EncoderFiles<'_>,
    load: LoadQwen<'_>,
    texts: &[&str],
    (dtype, device): (DType, &Device),
) -> anyhow::Result<Vec<Hv15Text>> {
    let quoted = |t: &&str| framesmith_models::hunyuan_video15::text::glyph_text(t).is_some();
    let glyph_path = texts
        .iter()
        .any(quoted)
        .then(|| glyph_file(files.glyph, files.text_encoder))
        .transpose()?;
    let qwen = load(files.text_encoder, files.tokenizer, dtype, device)
        .with_context(|| format!("--text-encoder {}", files.text_encoder.display()))?;
    let txt = texts
        .iter()
        .map(|text| {
            let out = encode_prompts(&qwen, &[(*text).to_string()])
                .with_context(|| format!("encoding the prompt \"{text}\""))?;
            let len = out.lens.first().copied().unwrap_or(0);
            anyhow::ensure!(len > 0, "the text encoder gave \"{text}\" no token");
            Ok(out.embeds.get(0)?.narrow(0, 0, len)?.to_dtype(dtype)?)
        })
        .collect::<anyhow::Result<Vec<Tensor>>>()?;
    drop(qwen);
    release_cached_memory(device)?;
    let glyphs: Vec<Option<Tensor>> = match glyph_path {
        Some(path) => {
            // Small (0.2B): kept in f32 as the official pipeline runs it.
            let glyph = GlyphEncoder::load(&path, DType::F32, device)?;
            let encoded = texts
                .iter()
                .map(|t| {
                    glyph
                        .encode_prompt(t)?
                        .map(|g| g.to_dtype(dtype))
                        .transpose()
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            drop(glyph);
            release_cached_memory(device)?;
            encoded
        }
        None => vec![None; texts.len()],
    };
    Ok(txt
        .into_iter()
        .zip(glyphs)
        .map(|(txt, glyph)| Hv15Text { txt, glyph })
        .collect())
}

#[cfg(test)]
pub(crate) mod testkit;
