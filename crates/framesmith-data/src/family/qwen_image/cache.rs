//! Latent and text-encoder caches of Qwen-Image image items, as musubi-tuner writes them for Qwen-Image, so caches
//! move both ways: `{stem}_{W:04}x{H:04}_qi.safetensors` with `latents_1x{H}x{W}_{dtype}` (the VAE's normalised
//! latents `[16, 1, H, W]`) and `{stem}_qi_te.safetensors` with `varlen_vl_embed_{dtype}` (Qwen2.5-VL's hidden
//! states of the caption's valid tokens, `[L, 3584]`), both with the metadata architecture `qwen_image`. The `_qi`
//! suffix keeps them apart from Wan (`_wan`) and FLUX.1 (`_flux`) caches in a shared cache directory. The reading
//! and writing is the image families' one ([`crate::image_cache`]).

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::cache::LatentCacheName;
use crate::image_cache::{ControlKeys, ImageCacheArch};
use crate::tensor_file::CacheError;

/// The short architecture name at the end of Qwen-Image cache file names (musubi-tuner's `qi`).
pub const QWEN_IMAGE_SUFFIX: &str = "qi";
/// The architecture in the caches' metadata (musubi-tuner's `qwen_image`).
pub const QWEN_IMAGE_ARCHITECTURE: &str = "qwen_image";

/// What tells Qwen-Image's caches from other families'.
pub const QWEN_IMAGE_CACHES: ImageCacheArch = ImageCacheArch {
    suffix: QWEN_IMAGE_SUFFIX,
    architecture: QWEN_IMAGE_ARCHITECTURE,
    family: "Qwen-Image",
    control_keys: ControlKeys::Indexed,
};

/// The text cache's tensor: Qwen2.5-VL's hidden states of the caption's valid tokens.
const VL_EMBED: &str = "varlen_vl_embed";

/// Latent cache file name of an image for Qwen-Image. `original_size` is the image's size before resizing.
pub fn qwen_latent_cache_name(stem: &str, original_size: (u32, u32)) -> String {
    QWEN_IMAGE_CACHES.latent_cache_name(stem, original_size)
}

/// Text-encoder cache file name of an image for Qwen-Image.
pub fn qwen_text_cache_name(stem: &str) -> String {
    QWEN_IMAGE_CACHES.text_cache_name(stem)
}

/// Parses a Qwen-Image latent cache file name; `None` for anything else (Wan and FLUX.1 caches included).
pub fn parse_qwen_latent_cache_name(file_name: &str) -> Option<LatentCacheName> {
    QWEN_IMAGE_CACHES.parse_latent_cache_name(file_name)
}

/// Writes an image's normalised VAE latents `[16, 1, H, W]` as `latents_1x{H}x{W}_{dtype}`.
pub fn write_qwen_latent_cache(
    path: &Path,
    latents: &Tensor,
    original_size: (u32, u32),
) -> Result<(), CacheError> {
    QWEN_IMAGE_CACHES.write_latent_cache(path, latents, original_size)
}

/// Reads the latents `[C, 1, H, W]` of a Qwen-Image latent cache (control latents, if any, are not read).
pub fn read_qwen_latent_cache(path: &Path, device: &Device) -> Result<Tensor, CacheError> {
    QWEN_IMAGE_CACHES.read_latent_cache(path, device)
}

/// One image's text-encoder output for Qwen-Image.
#[derive(Clone, Debug)]
pub struct QwenTextCache {
    /// The hidden states of the caption's valid tokens, `[L, 3584]`.
    pub vl_embed: Tensor,
    /// The caption encoded (`caption1` metadata).
    pub caption: String,
}

/// Writes a Qwen-Image text-encoder cache.
pub fn write_qwen_text_cache(path: &Path, cache: &QwenTextCache) -> Result<(), CacheError> {
    write_qwen_text_cache_with_controls(path, cache, None)
}

/// Writes a Qwen-Image text-encoder cache whose embedding Qwen-Image-Edit's encoder made with the item's control
/// images, `controls` saying which ([`crate::image_cache::CONTROLS_METADATA`]); `None` for a text-only one.
pub fn write_qwen_text_cache_with_controls(
    path: &Path,
    cache: &QwenTextCache,
    controls: Option<&str>,
) -> Result<(), CacheError> {
    QWEN_IMAGE_CACHES.write_text_cache_with_controls(
        path,
        &[(VL_EMBED, &cache.vl_embed)],
        (&cache.caption, controls),
    )
}

/// Reads a Qwen-Image text-encoder cache.
pub fn read_qwen_text_cache(path: &Path, device: &Device) -> Result<QwenTextCache, CacheError> {
    let ([vl_embed], caption) = QWEN_IMAGE_CACHES.read_text_cache(path, device, [VL_EMBED])?;
    Ok(QwenTextCache { vl_embed, caption })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::flux::cache::{flux_latent_cache_name, write_flux_latent_cache};
    use crate::tensor_file::read_tensor_file;
    use candle_core::DType;

    #[test]
    fn names_are_musubi_tuners_and_never_collide_with_other_families() {
        let name = qwen_latent_cache_name("cat_01", (1328, 1328));
        assert_eq!(name, "cat_01_1328x1328_qi.safetensors");
        assert_eq!(qwen_text_cache_name("cat_01"), "cat_01_qi_te.safetensors");
        let parsed = parse_qwen_latent_cache_name(&name).expect("a Qwen-Image cache name");
        assert_eq!(
            (parsed.stem.as_str(), parsed.original_size),
            ("cat_01", (1328, 1328))
        );
        let flux = flux_latent_cache_name("cat_01", (1328, 1328));
        assert_eq!(parse_qwen_latent_cache_name(&flux), None);
        assert_eq!(
            parse_qwen_latent_cache_name("_0016x0016_qi.safetensors"),
            None
        );
    }

    #[test]
    fn caches_round_trip_and_refuse_other_architectures() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let dev = Device::Cpu;
        let latents = Tensor::arange(0f32, 64.0, &dev)?.reshape((16, 1, 2, 2))?;
        let path = dir.path().join(qwen_latent_cache_name("a", (16, 16)));
        write_qwen_latent_cache(&path, &latents, (16, 16))?;
        let file = read_tensor_file(&path, &dev)?;
        assert!(file
            .tensors
            .iter()
            .any(|(k, _)| k == "latents_1x2x2_float32"));
        let back = read_qwen_latent_cache(&path, &dev)?;
        assert_eq!(
            back.flatten_all()?.to_vec1::<f32>()?,
            latents.flatten_all()?.to_vec1::<f32>()?
        );

        let text = QwenTextCache {
            vl_embed: Tensor::ones((3, 8), DType::BF16, &dev)?,
            caption: "a cat".into(),
        };
        let text_path = dir.path().join(qwen_text_cache_name("a"));
        write_qwen_text_cache(&text_path, &text)?;
        let file = read_tensor_file(&text_path, &dev)?;
        assert!(file
            .tensors
            .iter()
            .any(|(k, _)| k == "varlen_vl_embed_bfloat16"));
        let back = read_qwen_text_cache(&text_path, &dev)?;
        assert_eq!(back.vl_embed.dims(), &[3, 8]);
        assert_eq!(back.caption, "a cat");

        let flux = dir.path().join(flux_latent_cache_name("a", (16, 16)));
        write_flux_latent_cache(&flux, &latents, (16, 16))?;
        let err = read_qwen_latent_cache(&flux, &dev).unwrap_err().to_string();
        assert!(
            err.contains("made for architecture flux, not qwen_image"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn control_latents_keep_musubi_tuners_keys_and_order() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let dev = Device::Cpu;
        let latents = Tensor::zeros((16, 1, 2, 2), DType::F32, &dev)?;
        let controls: Vec<Tensor> = (0..11)
            .map(|i| Tensor::full(i as f32, (16, 1, 2, 1 + i % 3), &dev))
            .collect::<candle_core::Result<_>>()?;
        let path = dir.path().join(qwen_latent_cache_name("a", (16, 16)));
        QWEN_IMAGE_CACHES.write_latent_cache_with_controls(&path, &latents, &controls, (16, 16))?;
        let file = read_tensor_file(&path, &dev)?;
        assert!(file
            .tensors
            .contains_key("latents_control_10_1x2x2_float32"));
        let (_, back) = QWEN_IMAGE_CACHES.read_latent_cache_with_controls(&path, &dev)?;
        let firsts: Vec<f32> = back
            .iter()
            .map(|t| t.flatten_all()?.get(0)?.to_scalar::<f32>())
            .collect::<candle_core::Result<_>>()?;
        assert_eq!(firsts, (0..11).map(|i| i as f32).collect::<Vec<_>>());

        let flux = dir.path().join(flux_latent_cache_name("a", (16, 16)));
        let flux_arch = crate::family::flux::cache::FLUX_CACHES;
        flux_arch.write_latent_cache_with_controls(&flux, &latents, &controls[..1], (16, 16))?;
        let file = read_tensor_file(&flux, &dev)?;
        assert!(file.tensors.contains_key("latents_control_1x2x1_float32"));
        assert_eq!(
            flux_arch
                .read_latent_cache_with_controls(&flux, &dev)?
                .1
                .len(),
            1
        );
        assert!(flux_arch
            .write_latent_cache_with_controls(&flux, &latents, &controls[..2], (16, 16))
            .is_err());
        Ok(())
    }
}
