//! Latent and text-encoder caches of FLUX.1 image items. Names and keys follow musubi-tuner's per-architecture
//! scheme with the architecture `flux` (`{stem}_{W:04}x{H:04}_flux.safetensors`, `{stem}_flux_te.safetensors`), so
//! they never collide with Wan caches (`_wan`) in a shared cache directory; the text cache holds T5-XXL's output
//! and CLIP-L's pooled vector under the keys of musubi-tuner's FLUX.1 Kontext caches (`t5_vec_{dtype}`,
//! `clip_l_pooler_{dtype}`). The reading and writing is the image families' one ([`crate::image_cache`]).

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::cache::LatentCacheName;
use crate::image_cache::{ControlKeys, ImageCacheArch};
use crate::tensor_file::CacheError;

/// The architecture name at the end of FLUX.1 cache file names and in their metadata.
pub const FLUX_ARCHITECTURE: &str = "flux";

/// What tells FLUX.1's caches from other families'.
pub const FLUX_CACHES: ImageCacheArch = ImageCacheArch {
    suffix: FLUX_ARCHITECTURE,
    architecture: FLUX_ARCHITECTURE,
    family: "FLUX.1",
    control_keys: ControlKeys::Single,
};

/// The text cache's tensors: T5-XXL's output and CLIP-L's pooled vector.
const TEXT_TENSORS: [&str; 2] = ["t5_vec", "clip_l_pooler"];

/// Latent cache file name of an image for FLUX.1. `original_size` is the image's size before resizing.
pub fn flux_latent_cache_name(stem: &str, original_size: (u32, u32)) -> String {
    FLUX_CACHES.latent_cache_name(stem, original_size)
}

/// Text-encoder cache file name of an image for FLUX.1.
pub fn flux_text_cache_name(stem: &str) -> String {
    FLUX_CACHES.text_cache_name(stem)
}

/// Parses a FLUX.1 latent cache file name; `None` for anything else (Wan caches included).
pub fn parse_flux_latent_cache_name(file_name: &str) -> Option<LatentCacheName> {
    FLUX_CACHES.parse_latent_cache_name(file_name)
}

/// Writes an image's autoencoder latents `[C, 1, H, W]` (scaled and shifted as the FLUX.1 DiT takes them) as
/// `latents_1x{H}x{W}_{dtype}`.
pub fn write_flux_latent_cache(
    path: &Path,
    latents: &Tensor,
    original_size: (u32, u32),
) -> Result<(), CacheError> {
    FLUX_CACHES.write_latent_cache(path, latents, original_size)
}

/// Reads the latents `[C, 1, H, W]` of a FLUX.1 latent cache.
pub fn read_flux_latent_cache(path: &Path, device: &Device) -> Result<Tensor, CacheError> {
    FLUX_CACHES.read_latent_cache(path, device)
}

/// One image's text-encoder outputs for FLUX.1.
#[derive(Clone, Debug)]
pub struct FluxTextCache {
    /// T5-XXL's output for the padded caption, `[L, 4096]`.
    pub t5: Tensor,
    /// CLIP-L's pooled output, `[768]`.
    pub clip_l_pooler: Tensor,
    /// The caption encoded (`caption1` metadata).
    pub caption: String,
}

/// Writes a FLUX.1 text-encoder cache.
pub fn write_flux_text_cache(path: &Path, cache: &FluxTextCache) -> Result<(), CacheError> {
    let [t5, pooler] = TEXT_TENSORS;
    let tensors = [(t5, &cache.t5), (pooler, &cache.clip_l_pooler)];
    FLUX_CACHES.write_text_cache(path, &tensors, &cache.caption)
}

/// Reads a FLUX.1 text-encoder cache.
pub fn read_flux_text_cache(path: &Path, device: &Device) -> Result<FluxTextCache, CacheError> {
    let ([t5, clip_l_pooler], caption) = FLUX_CACHES.read_text_cache(path, device, TEXT_TENSORS)?;
    Ok(FluxTextCache {
        t5,
        clip_l_pooler,
        caption,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{image_latent_cache_name, parse_latent_cache_name, text_cache_name};
    use crate::DatasetKind;
    use candle_core::DType;

    #[test]
    fn names_never_collide_with_wan_caches() {
        let flux = flux_latent_cache_name("cat_01", (1024, 768));
        assert_eq!(flux, "cat_01_1024x0768_flux.safetensors");
        assert_eq!(flux_text_cache_name("cat_01"), "cat_01_flux_te.safetensors");
        let wan = image_latent_cache_name("cat_01", (1024, 768));
        assert_ne!(flux, wan);
        assert_ne!(flux_text_cache_name("cat_01"), text_cache_name("cat_01"));
        let parsed = parse_flux_latent_cache_name(&flux).expect("a FLUX cache name");
        assert_eq!(
            (parsed.stem.as_str(), parsed.original_size),
            ("cat_01", (1024, 768))
        );
        assert_eq!(parse_flux_latent_cache_name(&wan), None);
        assert_eq!(parse_latent_cache_name(&flux, DatasetKind::Image), None);
    }

    #[test]
    fn caches_round_trip_and_refuse_wan_caches() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let dev = Device::Cpu;
        let latents = Tensor::arange(0f32, 64.0, &dev)?.reshape((16, 1, 2, 2))?;
        let path = dir.path().join(flux_latent_cache_name("a", (16, 16)));
        write_flux_latent_cache(&path, &latents, (16, 16))?;
        let back = read_flux_latent_cache(&path, &dev)?;
        assert_eq!(
            back.flatten_all()?.to_vec1::<f32>()?,
            latents.flatten_all()?.to_vec1::<f32>()?
        );

        let text = FluxTextCache {
            t5: Tensor::ones((3, 8), DType::BF16, &dev)?,
            clip_l_pooler: Tensor::ones(4, DType::BF16, &dev)?,
            caption: "a cat".into(),
        };
        let text_path = dir.path().join(flux_text_cache_name("a"));
        write_flux_text_cache(&text_path, &text)?;
        let back = read_flux_text_cache(&text_path, &dev)?;
        assert_eq!(
            (back.t5.dims(), back.clip_l_pooler.dims()),
            (&[3, 8][..], &[4][..])
        );
        assert_eq!(back.caption, "a cat");

        let wan_text = dir.path().join(text_cache_name("a"));
        crate::cache::write_wan_text_cache(
            &wan_text,
            &Tensor::ones((3, 8), DType::F32, &dev)?,
            "a cat",
        )?;
        let err = read_flux_text_cache(&wan_text, &dev)
            .unwrap_err()
            .to_string();
        assert!(err.contains("made for architecture wan, not flux"), "{err}");
        Ok(())
    }
}
