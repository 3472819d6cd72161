//! LTX-2's prompt encoding as the text pass runs it, in two phases so that a 16 GB card holds each: Gemma 3 12B
//! (kept as what the card has free allows: bf16 resident, FP8 resident, or FP8 layers streamed from host memory)
//! with the checkpoint's feature extractor gives every prompt's features, kept in host memory; Gemma is dropped;
//! then the checkpoint's video connector turns each into what the transformer reads (and, for sound, the audio
//! connector the audio stream's features into what the audio stream reads).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::family::qwen_image::encoder::placement_for;
use framesmith_models::gemma3::{self, GemmaTokenizer, LoadOptions, LTX2_MAX_LENGTH};
use framesmith_models::ltx2::text::{
    connect, connect_audio, prompt_features, PromptFeatures, TextParts,
};
use framesmith_nn::device::VramUse;
use framesmith_nn::offload::release_cached_memory;

/// The encoder's files.
#[derive(Debug, Clone, Copy)]
pub struct Ltx2EncoderFiles<'a> {
    /// Gemma 3 12B (the Hugging Face folder, ComfyUI's single file).
    pub text_encoder: &'a Path,
    /// Its tokenizer (default: the one beside the weights or embedded in them).
    pub tokenizer: Option<&'a Path>,
    /// The LTX-2 checkpoint holding the feature extractor and the connector.
    pub dit: &'a Path,
}

/// One prompt encoded: what the cache holds.
pub struct Ltx2Text {
    /// The connector's output [max_length, D].
    pub embeds: Tensor,
    /// 1 for each row the transformer attends to (every row: the registers fill the padding).
    pub mask: Vec<u32>,
    /// The audio connector's output [max_length, D_audio], when encoded for sound.
    pub audio_embeds: Option<Tensor>,
}

/// How Gemma 3 is loaded: for the card ([`load_gemma`]), or at a small size in tests.
pub type LoadGemma<'a> =
    &'a dyn Fn(&Path, DType, &Device, u64) -> anyhow::Result<gemma3::Gemma3Text>;

/// Loads Gemma 3 12B from `weights` in `dtype` on `device`, kept as what the card has free allows once
/// `also_bytes` (the feature extractor) are placed beside it.
pub fn load_gemma(
    weights: &Path,
    dtype: DType,
    device: &Device,
    also_bytes: u64,
) -> anyhow::Result<gemma3::Gemma3Text> {
    let file = gemma3::identify(weights)?;
    let c = &file.config;
    // The token embedding stays in host memory.
    let on_card = file
        .parameter_count
        .saturating_sub((c.vocab_size * c.hidden_size) as u64);
    let free = VramUse::measure(device, 0).map(|use_| use_.free.saturating_sub(also_bytes));
    let (fp8, placement) = placement_for(on_card, free);
    let options = LoadOptions {
        dtype,
        fp8,
        placement,
        ..LoadOptions::new(device)
    };
    Ok(gemma3::load_text_model(weights, &options)?.1)
}

/// What the encoder is kept as, for the log.
pub fn describe(model: &gemma3::Gemma3Text) -> String {
    let placement = match model.placement() {
        gemma3::LayerPlacement::Resident => "resident",
        gemma3::LayerPlacement::Streamed => "layers streamed from host memory",
    };
    format!(
        "Gemma 3 ({} layers, {placement})",
        model.config().num_hidden_layers
    )
}

/// Each of `texts` encoded as LTX-2's pipeline encodes it (one prompt at a time: every prompt is padded to the
/// same length, so the results do not depend on the batch), in `dtype` on `device`; `log` hears how Gemma is kept.
pub fn encode_texts(
    files: Ltx2EncoderFiles<'_>,
    load: LoadGemma<'_>,
    texts: &[&str],
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Ltx2Text>> {
    encode_texts_for(files, load, (texts, false), (dtype, device), log)
}

/// [`encode_texts`], with the audio connector's output too when `audio` (the checkpoint must hold the audio
/// connector: refused by name otherwise, before Gemma loads).
pub fn encode_texts_for(
    files: Ltx2EncoderFiles<'_>,
    load: LoadGemma<'_>,
    (texts, audio): (&[&str], bool),
    (dtype, device): (DType, &Device),
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Ltx2Text>> {
    let parts = TextParts::open(files.dit)?;
    if audio && !parts.has_audio() {
        parts.audio_connector(dtype, device)?;
    }
    let tokenizer =
        GemmaTokenizer::for_weights(files.text_encoder, files.tokenizer, LTX2_MAX_LENGTH)?;
    let (projection_bytes, _) = parts.bytes();
    let gemma = load(files.text_encoder, dtype, device, projection_bytes)
        .with_context(|| format!("--text-encoder {}", files.text_encoder.display()))?;
    log(&format!("text encoder: {}", describe(&gemma)));
    let cfg = gemma.config();
    let sizes = (cfg.hidden_size, cfg.num_hidden_layers + 1);
    let extractor = if audio {
        parts.feature_extractor_av(sizes, dtype, device)?
    } else {
        parts.feature_extractor(sizes, dtype, device)?
    };
    let cpu = Device::Cpu;
    let features = texts
        .iter()
        .map(|text| {
            let f = prompt_features((&gemma, &tokenizer), &extractor, text)
                .with_context(|| format!("encoding the prompt \"{text}\""))?;
            Ok(PromptFeatures {
                features: f.features.to_device(&cpu)?,
                audio_features: match (audio, f.audio_features) {
                    (true, Some(a)) => Some(a.to_device(&cpu)?),
                    _ => None,
                },
                prompt: f.prompt,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop((gemma, extractor));
    release_cached_memory(device)?;
    let connector = parts.connector(dtype, device)?;
    let audio_connector = audio
        .then(|| parts.audio_connector(dtype, device))
        .transpose()?;
    let out = features
        .into_iter()
        .map(|f| {
            let on_device = PromptFeatures {
                features: f.features.to_device(device)?,
                audio_features: f.audio_features.map(|a| a.to_device(device)).transpose()?,
                prompt: f.prompt,
            };
            let (embeds, mask) = connect(&connector, &on_device)?;
            let audio_embeds = match &audio_connector {
                Some(c) => Some(
                    connect_audio(c, &on_device)?
                        .to_dtype(dtype)?
                        .to_device(&cpu)?,
                ),
                None => None,
            };
            Ok(Ltx2Text {
                embeds: embeds.to_dtype(dtype)?.to_device(&cpu)?,
                mask,
                audio_embeds,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    drop((connector, audio_connector));
    release_cached_memory(device)?;
    Ok(out)
}
