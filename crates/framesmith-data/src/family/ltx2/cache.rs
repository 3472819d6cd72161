//! Latent and text-encoder caches of LTX-2 / LTX-2.3 items as the LTX-2 branch of musubi-tuner
//! (AkaneTendo25/musubi-tuner, `ltx2_cache_latents.py` and `ltx2_cache_text_encoder_outputs.py`) writes them, the
//! caches LTX-2 LoRA trainers' users already have. Latents: `{stem}_{start:05}-{frames:03}_{W:04}x{H:04}_ltx2.safetensors`
//! for a clip (`{stem}_{W:04}x{H:04}_ltx2` for an image) with `latents_{F}x{H}x{W}_{dtype}` — the video VAE's
//! normalised latents `[128, F, H, W]`, as the transformer takes them. Text: `{stem}_ltx2_te.safetensors` with
//! `video_prompt_embeds_{dtype}` — the text connector's output `[L, D]`, what the video cross-attention reads — and
//! `prompt_attention_mask` `[L]`, and for joint audio-video training `audio_prompt_embeds_{dtype}` (the audio
//! connector's output, what the audio cross-attention reads; the pre-connector features are not read). Audio
//! (`--ltx2_mode av`): `{latent file's name with _ltx2_audio}.safetensors` beside each latent cache, with
//! `audio_latents_{T}x{mel}x{C}_{dtype}` — the audio VAE's latents `[C, T, mel]` (8 channels × 16 mel bins per
//! latent frame) — and `audio_lengths_int32` (the frames that hold audio; the rest pads to the clip's length).
//! All carry the metadata architecture `ltx2_v1`.
//!
//! The official trainer's `.precomputed/conditions/*.pt` hold the features *before* the connector (it runs the
//! connector in every step); these caches hold its output, as `framesmith cache text` writes them too.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::cache::LatentCacheName;
use crate::clip_cache::{checked_clip_latents, clip_latents_entry, is_clip_latents_key};
use crate::config::DatasetKind;
use crate::frames::FrameWindow;
use crate::image_cache::{ControlKeys, ImageCacheArch};
use crate::tensor_file::{
    format_error, host_integers, read_tensor_file, strip_dtype_suffix, torch_dtype_name,
    write_tensor_file, CacheError, RawTensor,
};

/// The short architecture name at the end of LTX-2 cache file names.
pub const LTX2_SUFFIX: &str = "ltx2";
/// The architecture in the caches' metadata (musubi-tuner's LTX-2 branch's `ltx2_v1`).
pub const LTX2_ARCHITECTURE: &str = "ltx2_v1";

/// What tells LTX-2's caches from other families'.
const LTX2_CACHES: ImageCacheArch = ImageCacheArch {
    suffix: LTX2_SUFFIX,
    architecture: LTX2_ARCHITECTURE,
    family: "LTX-2",
    // Its caches hold no control latents; only the architecture check and the metadata are used.
    control_keys: ControlKeys::Indexed,
};

/// The text cache's tensors.
const VIDEO_EMBEDS: &str = "video_prompt_embeds";
const AUDIO_EMBEDS: &str = "audio_prompt_embeds";
/// The audio cache's tensors.
const AUDIO_LATENTS: &str = "audio_latents";
const AUDIO_LENGTHS: &str = "audio_lengths";
/// The end of a latent cache's name and of its audio cache's.
const LATENT_END: &str = "_ltx2.safetensors";
const AUDIO_END: &str = "_ltx2_audio.safetensors";
const MASK: &str = "prompt_attention_mask";

/// Latent cache file name of an item: a clip of a video (`window`) or an image (`None`); `original_size` is the
/// media's size before resizing.
pub fn ltx2_latent_cache_name(
    stem: &str,
    window: Option<FrameWindow>,
    original_size: (u32, u32),
) -> String {
    LTX2_CACHES.clip_latent_cache_name(stem, window, original_size)
}

/// Text-encoder cache file name of an item (one per image or video, shared by all clips of a video).
pub fn ltx2_text_cache_name(stem: &str) -> String {
    LTX2_CACHES.text_cache_name(stem)
}

/// Parses an LTX-2 latent cache file name of a dataset of `kind`; `None` for anything else (other families'
/// caches, the `_ltx2_audio` and `_ltx2_te` files included).
pub fn parse_ltx2_latent_cache_name(file_name: &str, kind: DatasetKind) -> Option<LatentCacheName> {
    LTX2_CACHES.parse_clip_latent_cache_name(file_name, kind)
}

/// Writes an item's latents `[128, F, H, W]` as musubi-tuner's LTX-2 branch does (`original_size`: the media's
/// size before resizing; `frame_count`: the clip's frames, `None` for an image).
pub fn write_ltx2_latent_cache(
    path: &Path,
    latents: &Tensor,
    original_size: (u32, u32),
    frame_count: Option<u32>,
) -> Result<(), CacheError> {
    let raw = vec![clip_latents_entry(path, "latents", latents)?];
    write_tensor_file(
        path,
        &raw,
        LTX2_CACHES.clip_metadata(original_size, frame_count),
    )
}

/// Reads the latents `[C, F, H, W]` of an LTX-2 latent cache.
pub fn read_ltx2_latent_cache(path: &Path, device: &Device) -> Result<Tensor, CacheError> {
    let file = read_tensor_file(path, device)?;
    LTX2_CACHES.check_architecture(path, &file.metadata)?;
    let latents = file
        .tensors
        .into_iter()
        .find(|(key, _)| is_clip_latents_key(strip_dtype_suffix(key)))
        .map(|(_, t)| t);
    checked_clip_latents(path, latents)
}

/// The audio latent cache beside the latent cache `latent_file` (`…_ltx2.safetensors` → `…_ltx2_audio.safetensors`,
/// as musubi-tuner's LTX-2 branch names it); `None` for a name that is not a latent cache's.
pub fn ltx2_audio_cache_name(latent_file: &str) -> Option<String> {
    latent_file
        .strip_suffix(LATENT_END)
        .map(|stem| format!("{stem}{AUDIO_END}"))
}

/// One clip's audio latents.
#[derive(Clone, Debug)]
pub struct Ltx2AudioCache {
    /// The audio VAE's latents `[C, T, mel]`.
    pub latents: Tensor,
    /// The latent frames that hold audio (`audio_lengths`); `None` when the cache holds none (all do).
    pub length: Option<usize>,
}

/// Writes a clip's audio latent cache as musubi-tuner's LTX-2 branch does.
pub fn write_ltx2_audio_cache(path: &Path, cache: &Ltx2AudioCache) -> Result<(), CacheError> {
    let latents = &cache.latents;
    let (c, t, mel) = latents
        .dims3()
        .map_err(|e| format_error(path, format!("audio latents: {e}")))?;
    let dtype = torch_dtype_name(latents.dtype());
    let length = cache.length.unwrap_or(t) as i32;
    let lengths =
        Tensor::new(length, &Device::Cpu).map_err(|e| format_error(path, e.to_string()))?;
    let raw = vec![
        (
            format!("{AUDIO_LATENTS}_{t}x{mel}x{c}_{dtype}"),
            RawTensor::from_tensor(latents, path)?.0,
        ),
        (
            format!("{AUDIO_LENGTHS}_int32"),
            RawTensor::from_tensor(&lengths, path)?.0,
        ),
    ];
    let metadata = LTX2_CACHES.metadata([("format_version", "1.0.1".to_string())]);
    write_tensor_file(path, &raw, metadata)
}

/// Reads an audio latent cache.
pub fn read_ltx2_audio_cache(path: &Path, device: &Device) -> Result<Ltx2AudioCache, CacheError> {
    let file = read_tensor_file(path, device)?;
    LTX2_CACHES.check_architecture(path, &file.metadata)?;
    let find = |prefix: &str| {
        file.tensors
            .iter()
            .find(|(k, _)| k.starts_with(&format!("{prefix}_")))
            .map(|(_, t)| t.clone())
    };
    let latents = find(AUDIO_LATENTS)
        .ok_or_else(|| format_error(path, "no audio_latents_{T}x{mel}x{C}_{dtype} tensor"))?;
    if latents.rank() != 3 || latents.elem_count() == 0 {
        return Err(format_error(
            path,
            format!(
                "audio latents of shape {:?}, expected [C, T, mel]",
                latents.dims()
            ),
        ));
    }
    let length = match find(AUDIO_LENGTHS) {
        Some(t) => host_integers(path, AUDIO_LENGTHS, &t)?
            .first()
            .map(|&n| n.max(0) as usize),
        None => None,
    };
    Ok(Ltx2AudioCache { latents, length })
}

/// One item's text-encoder output for LTX-2's video stream.
#[derive(Clone, Debug)]
pub struct Ltx2TextCache {
    /// The text connector's output `[L, D]`.
    pub video_prompt_embeds: Tensor,
    /// The audio connector's output `[L, D_audio]` (caches made for joint audio-video training).
    pub audio_prompt_embeds: Option<Tensor>,
    /// Gemma's attention mask of the caption `[L]` (1: a token; the connector gave padding its learnable
    /// registers); `None` when the cache holds none.
    pub prompt_attention_mask: Option<Tensor>,
    /// The caption encoded (`caption1` metadata).
    pub caption: String,
    /// What encoded it, when Framesmith did (`framesmith.text_encoding` metadata: the release whose text side
    /// made it and the width, e.g. `LTX-2.3 4096`), so a cache made for the other release is made again.
    pub encoding: Option<String>,
}

/// The metadata entry naming what encoded a text cache.
pub const TEXT_ENCODING_METADATA: &str = "framesmith.text_encoding";

/// Writes an LTX-2 text-encoder cache as musubi-tuner's LTX-2 branch does (the audio embeddings when given).
pub fn write_ltx2_text_cache(path: &Path, cache: &Ltx2TextCache) -> Result<(), CacheError> {
    let embeds = &cache.video_prompt_embeds;
    let dtype = torch_dtype_name(embeds.dtype());
    let mut raw = vec![
        (
            format!("{VIDEO_EMBEDS}_{dtype}"),
            RawTensor::from_tensor(embeds, path)?.0,
        ),
        (
            format!("text_{dtype}"),
            RawTensor::from_tensor(embeds, path)?.0,
        ),
    ];
    if let Some(audio) = &cache.audio_prompt_embeds {
        let dtype = torch_dtype_name(audio.dtype());
        raw.push((
            format!("{AUDIO_EMBEDS}_{dtype}"),
            RawTensor::from_tensor(audio, path)?.0,
        ));
    }
    if let Some(mask) = &cache.prompt_attention_mask {
        let mask = mask
            .to_dtype(DType::I64)
            .map_err(|e| format_error(path, e.to_string()))?;
        raw.push((MASK.to_string(), RawTensor::from_tensor(&mask, path)?.0));
        raw.push((
            "text_mask".to_string(),
            RawTensor::from_tensor(&mask, path)?.0,
        ));
    }
    let mut metadata = LTX2_CACHES.metadata([("caption1", cache.caption.clone())]);
    if let Some(encoding) = &cache.encoding {
        metadata.insert(TEXT_ENCODING_METADATA.to_string(), encoding.clone());
    }
    write_tensor_file(path, &raw, metadata)
}

/// Reads an LTX-2 text-encoder cache.
pub fn read_ltx2_text_cache(path: &Path, device: &Device) -> Result<Ltx2TextCache, CacheError> {
    let file = read_tensor_file(path, device)?;
    LTX2_CACHES.check_architecture(path, &file.metadata)?;
    let get = |name: &str| {
        file.tensors
            .iter()
            .find(|(k, _)| strip_dtype_suffix(k) == name)
            .map(|(_, t)| t.clone())
    };
    let video_prompt_embeds = get(VIDEO_EMBEDS).ok_or_else(|| {
        format_error(
            path,
            "no video_prompt_embeds_{dtype} tensor (a cache of another LTX-2 trainer?)",
        )
    })?;
    Ok(Ltx2TextCache {
        video_prompt_embeds,
        audio_prompt_embeds: get(AUDIO_EMBEDS),
        prompt_attention_mask: get(MASK),
        caption: file.metadata.get("caption1").cloned().unwrap_or_default(),
        encoding: file.metadata.get(TEXT_ENCODING_METADATA).cloned(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_skip_the_text_and_audio_caches() {
        let window = FrameWindow {
            start: 0,
            frames: 121,
        };
        let name = ltx2_latent_cache_name("clip", Some(window), (768, 512));
        assert_eq!(name, "clip_00000-121_0768x0512_ltx2.safetensors");
        let parsed = parse_ltx2_latent_cache_name(&name, DatasetKind::Video).expect("a cache name");
        assert_eq!(parsed.stem, "clip");
        assert_eq!(ltx2_text_cache_name("clip"), "clip_ltx2_te.safetensors");
        for other in [
            "clip_ltx2_te.safetensors",
            "clip_00000-121_0768x0512_ltx2_audio.safetensors",
            "clip_00000-121_0768x0512_hv15.safetensors",
        ] {
            assert!(
                parse_ltx2_latent_cache_name(other, DatasetKind::Video).is_none(),
                "{other}"
            );
        }
    }

    #[test]
    fn caches_round_trip_and_refuse_other_architectures() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Device::Cpu;
        let latents = Tensor::arange(0f32, 2.0 * 3.0 * 2.0 * 2.0, &dev)
            .unwrap()
            .reshape((2, 3, 2, 2))
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let path = dir.path().join("a_00000-017_0064x0064_ltx2.safetensors");
        write_ltx2_latent_cache(&path, &latents, (64, 64), Some(17)).unwrap();
        let back = read_ltx2_latent_cache(&path, &dev).unwrap();
        assert_eq!(back.dims(), [2, 3, 2, 2]);
        assert_eq!(back.dtype(), DType::BF16);

        let text = Ltx2TextCache {
            video_prompt_embeds: Tensor::ones((5, 8), DType::F32, &dev).unwrap(),
            audio_prompt_embeds: Some(Tensor::ones((5, 4), DType::BF16, &dev).unwrap()),
            prompt_attention_mask: Some(Tensor::new(&[0i64, 0, 1, 1, 1], &dev).unwrap()),
            caption: "a cat".into(),
            encoding: Some("LTX-2 8".into()),
        };
        let text_path = dir.path().join(ltx2_text_cache_name("a"));
        write_ltx2_text_cache(&text_path, &text).unwrap();
        let back = read_ltx2_text_cache(&text_path, &dev).unwrap();
        assert_eq!(back.video_prompt_embeds.dims(), [5, 8]);
        let mask = back
            .prompt_attention_mask
            .unwrap()
            .to_vec1::<i64>()
            .unwrap();
        assert_eq!(mask, [0, 0, 1, 1, 1]);
        assert_eq!(back.caption, "a cat");
        assert_eq!(back.encoding.as_deref(), Some("LTX-2 8"));
        assert_eq!(back.audio_prompt_embeds.unwrap().dims(), [5, 4]);

        // The audio latents beside the clip's latents, with their valid length.
        let audio_name = ltx2_audio_cache_name("a_00000-017_0064x0064_ltx2.safetensors").unwrap();
        assert_eq!(audio_name, "a_00000-017_0064x0064_ltx2_audio.safetensors");
        assert!(ltx2_audio_cache_name("a_ltx2_te.safetensors").is_none());
        let audio = Ltx2AudioCache {
            latents: Tensor::ones((8, 9, 16), DType::BF16, &dev).unwrap(),
            length: Some(7),
        };
        let audio_path = dir.path().join(&audio_name);
        write_ltx2_audio_cache(&audio_path, &audio).unwrap();
        let raw = read_tensor_file(&audio_path, &dev).unwrap();
        assert!(raw.tensors.contains_key("audio_latents_9x16x8_bfloat16"));
        assert!(raw.tensors.contains_key("audio_lengths_int32"));
        let back = read_ltx2_audio_cache(&audio_path, &dev).unwrap();
        assert_eq!(
            (back.latents.dims(), back.length),
            (&[8, 9, 16][..], Some(7))
        );

        // A HunyuanVideo 1.5 latent cache is named, not misread.
        let hv = crate::family::hunyuan_video15::cache::Hv15LatentCache {
            latents: latents.clone(),
            latents_image: None,
            siglip: None,
        };
        let hv_path = dir.path().join("b_00000-017_0064x0064_hv15.safetensors");
        crate::family::hunyuan_video15::cache::write_hv15_latent_cache(
            &hv_path,
            &hv,
            (64, 64),
            None,
        )
        .unwrap();
        let err = read_ltx2_latent_cache(&hv_path, &dev)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hunyuan_video_1_5") && err.contains("LTX-2"),
            "{err}"
        );
    }
}
