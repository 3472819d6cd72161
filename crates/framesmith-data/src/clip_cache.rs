//! The latent caches of a video family in musubi-tuner's per-architecture scheme, one name, writer and reader for
//! every family that caches clips this way: `{stem}_{start:05}-{frames:03}_{W:04}x{H:04}_{suffix}.safetensors` for
//! a clip (`{stem}_{W:04}x{H:04}_{suffix}` for an image) with `latents_{F}x{H}x{W}_{dtype}` and the metadata
//! `architecture`, `width`, `height` (and `frame_count` for a clip). A family says only what differs
//! ([`ImageCacheArch`]) and which other tensors it keeps beside the latents (`family/<name>/cache.rs`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use crate::cache::{parse_latent_cache_name_of, LatentCacheName};
use crate::config::DatasetKind;
use crate::frames::FrameWindow;
use crate::image_cache::ImageCacheArch;
use crate::tensor_file::{format_error, torch_dtype_name, CacheError, RawTensor};

impl ImageCacheArch {
    /// Latent cache file name of an item: a clip of a video (`window`) or an image (`None`); `original_size` is
    /// the media's size before resizing.
    pub fn clip_latent_cache_name(
        &self,
        stem: &str,
        window: Option<FrameWindow>,
        original_size: (u32, u32),
    ) -> String {
        let (w, h) = original_size;
        match window {
            Some(win) => format!(
                "{stem}_{:05}-{:03}_{w:04}x{h:04}_{}.safetensors",
                win.start, win.frames, self.suffix
            ),
            None => self.latent_cache_name(stem, original_size),
        }
    }

    /// Parses a clip latent cache file name of this family in a dataset of `kind`; `None` for anything else
    /// (other families' caches included).
    pub fn parse_clip_latent_cache_name(
        &self,
        file_name: &str,
        kind: DatasetKind,
    ) -> Option<LatentCacheName> {
        parse_latent_cache_name_of(file_name, kind, self.suffix)
    }

    /// The metadata of a clip's latent cache: `original_size` (the media's size before resizing) and
    /// `frame_count` (the clip's frames, `None` for an image).
    pub(crate) fn clip_metadata(
        &self,
        original_size: (u32, u32),
        frame_count: Option<u32>,
    ) -> HashMap<String, String> {
        let (width, height) = original_size;
        let mut metadata =
            self.metadata([("width", width.to_string()), ("height", height.to_string())]);
        if let Some(frames) = frame_count {
            metadata.insert("frame_count".into(), frames.to_string());
        }
        metadata
    }
}

/// The entry of latents `t` `[C, F, H, W]` in a cache file at `path`: `{name}_{F}x{H}x{W}_{dtype}`.
pub(crate) fn clip_latents_entry(
    path: &Path,
    name: &str,
    t: &Tensor,
) -> Result<(String, RawTensor), CacheError> {
    let (_, f, h, w) = t
        .dims4()
        .map_err(|e| format_error(path, format!("{name} must be [C, F, H, W]: {e}")))?;
    let key = format!("{name}_{f}x{h}x{w}_{}", torch_dtype_name(t.dtype()));
    Ok((key, RawTensor::from_tensor(t, path)?.0))
}

/// Whether `key` (without its dtype suffix) names the item's latents, `latents_{F}x{H}x{W}`.
pub(crate) fn is_clip_latents_key(key: &str) -> bool {
    key.strip_prefix("latents_")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// The latents `[C, F, H, W]` found in the cache at `path`, or what is wrong with them.
pub(crate) fn checked_clip_latents(
    path: &Path,
    latents: Option<Tensor>,
) -> Result<Tensor, CacheError> {
    let latents =
        latents.ok_or_else(|| format_error(path, "no latents_{F}x{H}x{W}_{dtype} tensor"))?;
    if latents.rank() != 4 {
        return Err(format_error(
            path,
            format!("latents of shape {:?}, not [C, F, H, W]", latents.dims()),
        ));
    }
    Ok(latents)
}
