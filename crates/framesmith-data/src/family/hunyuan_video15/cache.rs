//! Latent and text-encoder caches of HunyuanVideo 1.5 items as musubi-tuner's `hv_1_5_cache_latents.py` and
//! `hv_1_5_cache_text_encoder_outputs.py` write them, so caches move both ways. Latents:
//! `{stem}_{start:05}-{frames:03}_{W:04}x{H:04}_hv15.safetensors` for a clip (`{stem}_{W:04}x{H:04}_hv15` for an
//! image) with `latents_{F}x{H}x{W}_{dtype}` — the VAE's latents `[32, F, H, W]` *unscaled* (the trainer multiplies
//! them by [`HV15_SCALING_FACTOR`]) — and for I2V `latents_image_{F}x{H}x{W}_{dtype}` (the first frame's latents
//! followed by zeros, and the first-frame mask: `[33, F, H, W]`) and `siglip_{dtype}` (SigLIP's last hidden state
//! of the first frame, `[729, 1152]`). Text: `{stem}_hv15_te.safetensors` with `varlen_vl_embed_{dtype}`
//! (Qwen2.5-VL's hidden states of the caption's valid tokens, `[L, 3584]`) and `varlen_byt5_embed_{dtype}` (byT5's
//! of the quoted glyph text, `[L2, 1472]`, `L2 = 0` when the caption quotes nothing). Both carry the metadata
//! architecture `hunyuan_video_1_5`.

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::cache::LatentCacheName;
use crate::clip_cache::{checked_clip_latents, clip_latents_entry, is_clip_latents_key};
use crate::config::DatasetKind;
use crate::frames::FrameWindow;
use crate::image_cache::{ControlKeys, ImageCacheArch};
use crate::tensor_file::{
    read_tensor_file, strip_dtype_suffix, torch_dtype_name, write_tensor_file, CacheError,
    RawTensor,
};

/// The short architecture name at the end of HunyuanVideo 1.5 cache file names (musubi-tuner's `hv15`).
pub const HV15_SUFFIX: &str = "hv15";
/// The architecture in the caches' metadata (musubi-tuner's `hunyuan_video_1_5`).
pub const HV15_ARCHITECTURE: &str = "hunyuan_video_1_5";
/// The VAE's scaling factor, by which the trainer multiplies the cached latents (musubi-tuner's
/// `VAE_SCALING_FACTOR`; the caches hold the VAE's latents as they come).
pub const HV15_SCALING_FACTOR: f64 = 1.03682;

/// Frames per second clips are thinned to when a dataset gives `source_fps` (musubi-tuner's
/// `TARGET_FPS_HUNYUAN_VIDEO_1_5`).
pub const HV15_TARGET_FPS: f64 = 24.0;

/// What tells HunyuanVideo 1.5's caches from other families'.
const HV15_CACHES: ImageCacheArch = ImageCacheArch {
    suffix: HV15_SUFFIX,
    architecture: HV15_ARCHITECTURE,
    family: "HunyuanVideo 1.5",
    // Its caches hold no control latents; only the architecture check and the metadata are used.
    control_keys: ControlKeys::Indexed,
};

/// The text cache's tensors.
const VL_EMBED: &str = "varlen_vl_embed";
const BYT5_EMBED: &str = "varlen_byt5_embed";

/// Latent cache file name of an item: a clip of a video (`window`) or an image (`None`); `original_size` is the
/// media's size before resizing.
pub fn hv15_latent_cache_name(
    stem: &str,
    window: Option<FrameWindow>,
    original_size: (u32, u32),
) -> String {
    HV15_CACHES.clip_latent_cache_name(stem, window, original_size)
}

/// Text-encoder cache file name of an item (one per image or video, shared by all clips of a video).
pub fn hv15_text_cache_name(stem: &str) -> String {
    HV15_CACHES.text_cache_name(stem)
}

/// Parses a HunyuanVideo 1.5 latent cache file name of a dataset of `kind`; `None` for anything else (other
/// families' caches included).
pub fn parse_hv15_latent_cache_name(file_name: &str, kind: DatasetKind) -> Option<LatentCacheName> {
    HV15_CACHES.parse_clip_latent_cache_name(file_name, kind)
}

/// One item's latent cache.
#[derive(Clone, Debug)]
pub struct Hv15LatentCache {
    /// The VAE's latents `[32, F, H, W]`, unscaled.
    pub latents: Tensor,
    /// I2V: the first frame's latents, zeros and the first-frame mask, `[33, F, H, W]`.
    pub latents_image: Option<Tensor>,
    /// I2V: SigLIP's last hidden state of the first frame, `[tokens, 1152]`.
    pub siglip: Option<Tensor>,
}

/// Writes an item's latent cache as musubi-tuner does (`original_size`: the media's size before resizing;
/// `frame_count`: the clip's frames, `None` for an image).
pub fn write_hv15_latent_cache(
    path: &Path,
    cache: &Hv15LatentCache,
    original_size: (u32, u32),
    frame_count: Option<u32>,
) -> Result<(), CacheError> {
    let mut raw = vec![clip_latents_entry(path, "latents", &cache.latents)?];
    if let Some(image) = &cache.latents_image {
        raw.push(clip_latents_entry(path, "latents_image", image)?);
    }
    if let Some(siglip) = &cache.siglip {
        let key = format!("siglip_{}", torch_dtype_name(siglip.dtype()));
        raw.push((key, RawTensor::from_tensor(siglip, path)?.0));
    }
    write_tensor_file(
        path,
        &raw,
        HV15_CACHES.clip_metadata(original_size, frame_count),
    )
}

/// Reads a HunyuanVideo 1.5 latent cache written by musubi-tuner or by [`write_hv15_latent_cache`].
pub fn read_hv15_latent_cache(path: &Path, device: &Device) -> Result<Hv15LatentCache, CacheError> {
    let file = read_tensor_file(path, device)?;
    HV15_CACHES.check_architecture(path, &file.metadata)?;
    let (mut latents, mut latents_image, mut siglip) = (None, None, None);
    for (key, t) in file.tensors {
        let base = strip_dtype_suffix(&key);
        if base.starts_with("latents_image_") {
            latents_image = Some(t);
        } else if is_clip_latents_key(base) {
            latents = Some(t);
        } else if base == "siglip" {
            siglip = Some(t);
        }
    }
    let latents = checked_clip_latents(path, latents)?;
    Ok(Hv15LatentCache {
        latents,
        latents_image,
        siglip,
    })
}

/// One item's text-encoder output for HunyuanVideo 1.5.
#[derive(Clone, Debug)]
pub struct Hv15TextCache {
    /// Qwen2.5-VL's hidden states of the caption's valid tokens, `[L, 3584]`.
    pub vl_embed: Tensor,
    /// byT5's hidden states of the caption's quoted glyph text, `[L2, 1472]` (`L2 = 0`: nothing quoted).
    pub byt5_embed: Tensor,
    /// The caption encoded (`caption1` metadata).
    pub caption: String,
}

/// Writes a HunyuanVideo 1.5 text-encoder cache as musubi-tuner does.
pub fn write_hv15_text_cache(path: &Path, cache: &Hv15TextCache) -> Result<(), CacheError> {
    HV15_CACHES.write_text_cache(
        path,
        &[(VL_EMBED, &cache.vl_embed), (BYT5_EMBED, &cache.byt5_embed)],
        &cache.caption,
    )
}

/// Reads a HunyuanVideo 1.5 text-encoder cache.
pub fn read_hv15_text_cache(path: &Path, device: &Device) -> Result<Hv15TextCache, CacheError> {
    let ([vl_embed, byt5_embed], caption) =
        HV15_CACHES.read_text_cache(path, device, [VL_EMBED, BYT5_EMBED])?;
    Ok(Hv15TextCache {
        vl_embed,
        byt5_embed,
        caption,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cache::video_latent_cache_name;
    use candle_core::DType;

    #[test]
    fn names_are_musubi_tuners_and_never_collide_with_wan() {
        let window = FrameWindow {
            start: 0,
            frames: 121,
        };
        let name = hv15_latent_cache_name("clip", Some(window), (848, 480));
        assert_eq!(name, "clip_00000-121_0848x0480_hv15.safetensors");
        assert_eq!(hv15_text_cache_name("clip"), "clip_hv15_te.safetensors");
        let parsed = parse_hv15_latent_cache_name(&name, DatasetKind::Video).expect("a cache name");
        assert_eq!(
            (parsed.stem.as_str(), parsed.window, parsed.original_size),
            ("clip", Some(window), (848, 480))
        );
        let image = hv15_latent_cache_name("cat", None, (512, 512));
        assert_eq!(image, "cat_0512x0512_hv15.safetensors");
        assert!(parse_hv15_latent_cache_name(&image, DatasetKind::Image).is_some());
        let wan = video_latent_cache_name("clip", window, (848, 480));
        assert_eq!(parse_hv15_latent_cache_name(&wan, DatasetKind::Video), None);
    }

    #[test]
    fn caches_round_trip_with_musubi_keys_and_an_empty_glyph_embedding(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let dev = Device::Cpu;
        let latents = Tensor::arange(0f32, 96.0, &dev)?.reshape((2, 3, 4, 4))?;
        let image = Tensor::ones((3, 3, 4, 4), DType::F32, &dev)?;
        let cache = Hv15LatentCache {
            latents: latents.clone(),
            latents_image: Some(image),
            siglip: Some(Tensor::ones((5, 6), DType::F16, &dev)?),
        };
        let path = dir.path().join("a_00000-009_0064x0064_hv15.safetensors");
        write_hv15_latent_cache(&path, &cache, (64, 64), Some(9))?;
        let file = read_tensor_file(&path, &dev)?;
        let mut keys: Vec<&String> = file.tensors.keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "latents_3x4x4_float32",
                "latents_image_3x4x4_float32",
                "siglip_float16"
            ]
        );
        assert_eq!(file.metadata["architecture"], "hunyuan_video_1_5");
        assert_eq!(file.metadata["frame_count"], "9");
        let back = read_hv15_latent_cache(&path, &dev)?;
        assert_eq!(
            back.latents.flatten_all()?.to_vec1::<f32>()?,
            latents.flatten_all()?.to_vec1::<f32>()?
        );
        assert_eq!(
            back.latents_image.map(|t| t.dims().to_vec()),
            Some(vec![3, 3, 4, 4])
        );

        let text = Hv15TextCache {
            vl_embed: Tensor::ones((3, 8), DType::BF16, &dev)?,
            byt5_embed: Tensor::zeros((0, 4), DType::F32, &dev)?,
            caption: "a cat".into(),
        };
        let text_path = dir.path().join(hv15_text_cache_name("a"));
        write_hv15_text_cache(&text_path, &text)?;
        let file = read_tensor_file(&text_path, &dev)?;
        let mut keys: Vec<&String> = file.tensors.keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            ["varlen_byt5_embed_float32", "varlen_vl_embed_bfloat16"]
        );
        let back = read_hv15_text_cache(&text_path, &dev)?;
        assert_eq!(back.vl_embed.dims(), &[3, 8]);
        assert_eq!(back.byt5_embed.dims(), &[0, 4]);
        assert_eq!(back.caption, "a cat");
        Ok(())
    }

    #[test]
    fn a_cache_of_another_architecture_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let dev = Device::Cpu;
        let latents = Tensor::zeros((16, 1, 2, 2), DType::F32, &dev)?;
        let path = dir.path().join("a_0016x0016_qi.safetensors");
        crate::family::qwen_image::cache::write_qwen_latent_cache(&path, &latents, (16, 16))?;
        let err = read_hv15_latent_cache(&path, &dev).unwrap_err().to_string();
        assert!(
            err.contains("made for architecture qwen_image, not hunyuan_video_1_5"),
            "{err}"
        );
        Ok(())
    }
}
