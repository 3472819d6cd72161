//! Latent and text-encoder caches of FLUX.1 image items. Names and keys follow musubi-tuner's per-architecture
//! scheme with the architecture `flux` (`{stem}_{W:04}x{H:04}_flux.safetensors`, `{stem}_flux_te.safetensors`), so
//! they never collide with Wan caches (`_wan`) in a shared cache directory; the text cache holds T5-XXL's output
//! and CLIP-L's pooled vector under the keys of musubi-tuner's FLUX.1 Kontext caches (`t5_vec_{dtype}`,
//! `clip_l_pooler_{dtype}`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::cache::{LatentCacheName, CACHE_FORMAT_VERSION};
use crate::tensor_file::{
    format_error, read_tensor_file, strip_dtype_suffix, torch_dtype_name, write_tensor_file,
    CacheError, RawTensor,
};

/// The architecture name at the end of FLUX.1 cache file names and in their metadata.
pub const FLUX_ARCHITECTURE: &str = "flux";

/// Latent cache file name of an image for FLUX.1. `original_size` is the image's size before resizing.
pub fn flux_latent_cache_name(stem: &str, original_size: (u32, u32)) -> String {
    let (w, h) = original_size;
    format!("{stem}_{w:04}x{h:04}_{FLUX_ARCHITECTURE}.safetensors")
}

/// Text-encoder cache file name of an image for FLUX.1.
pub fn flux_text_cache_name(stem: &str) -> String {
    format!("{stem}_{FLUX_ARCHITECTURE}_te.safetensors")
}

/// Parses a FLUX.1 latent cache file name; `None` for anything else (Wan caches included).
pub fn parse_flux_latent_cache_name(file_name: &str) -> Option<LatentCacheName> {
    let body = file_name.strip_suffix(&format!("_{FLUX_ARCHITECTURE}.safetensors"))?;
    let (stem, size) = body.rsplit_once('_')?;
    let (w, h) = size.split_once('x')?;
    let original_size = (w.parse().ok()?, h.parse().ok()?);
    (!stem.is_empty()).then(|| LatentCacheName {
        stem: stem.to_string(),
        window: None,
        original_size,
    })
}

/// Checks a cache's `architecture` metadata, naming what it was made for otherwise.
fn check_architecture(path: &Path, metadata: &HashMap<String, String>) -> Result<(), CacheError> {
    match metadata.get("architecture").map(String::as_str) {
        Some(FLUX_ARCHITECTURE) => Ok(()),
        Some(other) => Err(format_error(
            path,
            format!("made for architecture {other}, not flux: cache the dataset for FLUX.1 again"),
        )),
        None => Err(format_error(path, "no architecture in the metadata")),
    }
}

/// Writes an image's autoencoder latents `[C, 1, H, W]` (scaled and shifted as the FLUX.1 DiT takes them) as
/// `latents_1x{H}x{W}_{dtype}`.
pub fn write_flux_latent_cache(
    path: &Path,
    latents: &Tensor,
    original_size: (u32, u32),
) -> Result<(), CacheError> {
    let (_, f, h, w) = latents
        .dims4()
        .map_err(|e| format_error(path, format!("latents must be [C, 1, H, W]: {e}")))?;
    let key = format!("latents_{f}x{h}x{w}_{}", torch_dtype_name(latents.dtype()));
    let (raw, _) = RawTensor::from_tensor(latents, path)?;
    let metadata = HashMap::from([
        ("architecture".to_string(), FLUX_ARCHITECTURE.to_string()),
        ("width".to_string(), original_size.0.to_string()),
        ("height".to_string(), original_size.1.to_string()),
        (
            "format_version".to_string(),
            CACHE_FORMAT_VERSION.to_string(),
        ),
    ]);
    write_tensor_file(path, &[(key, raw)], metadata)
}

/// Reads the latents `[C, 1, H, W]` of a FLUX.1 latent cache.
pub fn read_flux_latent_cache(path: &Path, device: &Device) -> Result<Tensor, CacheError> {
    let file = read_tensor_file(path, device)?;
    check_architecture(path, &file.metadata)?;
    let latents = file
        .tensors
        .iter()
        .find(|(k, _)| {
            k.strip_prefix("latents_")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(|(_, t)| t.clone())
        .ok_or_else(|| format_error(path, "no latents_1x{H}x{W}_{dtype} tensor"))?;
    match latents.dims() {
        [_, 1, _, _] => Ok(latents),
        dims => Err(format_error(
            path,
            format!("latents of shape {dims:?}, not [C, 1, H, W]"),
        )),
    }
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
    let named = [
        (
            format!("t5_vec_{}", torch_dtype_name(cache.t5.dtype())),
            &cache.t5,
        ),
        (
            format!(
                "clip_l_pooler_{}",
                torch_dtype_name(cache.clip_l_pooler.dtype())
            ),
            &cache.clip_l_pooler,
        ),
    ];
    let mut tensors = Vec::with_capacity(2);
    for (key, t) in named {
        tensors.push((key, RawTensor::from_tensor(t, path)?.0));
    }
    let metadata = HashMap::from([
        ("architecture".to_string(), FLUX_ARCHITECTURE.to_string()),
        ("caption1".to_string(), cache.caption.clone()),
        (
            "format_version".to_string(),
            CACHE_FORMAT_VERSION.to_string(),
        ),
    ]);
    write_tensor_file(path, &tensors, metadata)
}

/// Reads a FLUX.1 text-encoder cache.
pub fn read_flux_text_cache(path: &Path, device: &Device) -> Result<FluxTextCache, CacheError> {
    let file = read_tensor_file(path, device)?;
    check_architecture(path, &file.metadata)?;
    let get = |name: &str| {
        file.tensors
            .iter()
            .find(|(k, _)| strip_dtype_suffix(k) == name)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| format_error(path, format!("no {name}_{{dtype}} tensor")))
    };
    Ok(FluxTextCache {
        t5: get("t5_vec")?,
        clip_l_pooler: get("clip_l_pooler")?,
        caption: file.metadata.get("caption1").cloned().unwrap_or_default(),
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
