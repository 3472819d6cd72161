//! Latent and text-encoder caches in musubi-tuner's Wan format, so caches move both ways: its file names
//! (`{stem}_{start:05}-{frames:03}_{W:04}x{H:04}_wan.safetensors`, `{stem}_wan_te.safetensors`), its tensor
//! keys (`latents_{F}x{H}x{W}_{dtype}`, `varlen_t5_{dtype}`, ...) and its metadata.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::config::DatasetKind;
use super::frames::FrameWindow;
use super::tensor_file::{
    format_error, host_integers, read_tensor_file, strip_dtype_suffix, torch_dtype_name,
    write_tensor_file, CacheError, RawTensor,
};

/// musubi-tuner's short architecture name, at the end of cache file names.
pub const WAN_ARCHITECTURE: &str = "wan";
/// musubi-tuner's cache `format_version` metadata.
pub const CACHE_FORMAT_VERSION: &str = "1.0.1";

/// The name of a media file without its last extension (Python's `os.path.splitext(basename)[0]`).
pub fn media_stem(media: &Path) -> String {
    media
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// Latent cache file name of a video clip. `original_size` is the video's frame size before resizing.
pub fn video_latent_cache_name(
    stem: &str,
    window: FrameWindow,
    original_size: (u32, u32),
) -> String {
    let (w, h) = original_size;
    format!(
        "{stem}_{:05}-{:03}_{w:04}x{h:04}_{WAN_ARCHITECTURE}.safetensors",
        window.start, window.frames
    )
}

/// Latent cache file name of an image. `original_size` is the image's size before resizing.
pub fn image_latent_cache_name(stem: &str, original_size: (u32, u32)) -> String {
    let (w, h) = original_size;
    format!("{stem}_{w:04}x{h:04}_{WAN_ARCHITECTURE}.safetensors")
}

/// Text-encoder cache file name of an item (one per image or video, shared by all clips of a video).
pub fn text_cache_name(stem: &str) -> String {
    format!("{stem}_{WAN_ARCHITECTURE}_te.safetensors")
}

/// What a latent cache file name says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatentCacheName {
    /// The media file's stem; its text cache is [`text_cache_name`] of it.
    pub stem: String,
    /// The clip, for video caches.
    pub window: Option<FrameWindow>,
    /// Media size before resizing, `(width, height)`.
    pub original_size: (u32, u32),
}

/// Parses a latent cache file name the way musubi-tuner's training loader does (split on `_` from the right).
/// `None` when the name is not a Wan latent cache of that kind.
pub fn parse_latent_cache_name(file_name: &str, kind: DatasetKind) -> Option<LatentCacheName> {
    parse_latent_cache_name_of(file_name, kind, WAN_ARCHITECTURE)
}

/// [`parse_latent_cache_name`] for the caches of musubi-tuner's architecture `suffix` (`wan`, `hv15`): the same
/// names, `{stem}[_{start:05}-{frames:03}]_{W:04}x{H:04}_{suffix}.safetensors`, for every video architecture.
pub fn parse_latent_cache_name_of(
    file_name: &str,
    kind: DatasetKind,
    suffix: &str,
) -> Option<LatentCacheName> {
    let body = file_name.strip_suffix(&format!("_{suffix}.safetensors"))?;
    let (rest, size) = body.rsplit_once('_')?;
    let (w, h) = size.split_once('x')?;
    let original_size = (w.parse().ok()?, h.parse().ok()?);
    let (stem, window) = match kind {
        DatasetKind::Image => (rest, None),
        DatasetKind::Video => {
            let (stem, frames) = rest.rsplit_once('_')?;
            // "00000-017", or with a section index "00000-017-00".
            let mut parts = frames.split('-');
            let start = parts.next()?.parse().ok()?;
            let frames = parts.next()?.parse().ok()?;
            (stem, Some(FrameWindow { start, frames }))
        }
    };
    (!stem.is_empty()).then(|| LatentCacheName {
        stem: stem.to_string(),
        window,
        original_size,
    })
}

/// The shape `[channels, frames, height, width]` of a latent cache's latents, read from the file's header alone
/// (the planner sizes a run by its caches without loading them).
pub fn read_latent_shape(path: &Path) -> Result<[usize; 4], CacheError> {
    use std::io::Read;
    /// Headers of real caches are a few hundred bytes; anything past this is not a cache.
    const MAX_HEADER_BYTES: u64 = 1 << 20;
    let io = |source| CacheError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    };
    let mut file = framesmith_config::file_read::open_regular(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER_BYTES {
        return Err(format_error(path, format!("a {len}-byte header")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let header: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| format_error(path, format!("unreadable header: {e}")))?;
    let shape = header
        .iter()
        // `latents_{F}x{H}x{W}_{dtype}`, not `latents_image_…` or `latents_control_…`.
        .find(|(key, _)| {
            key.strip_prefix("latents_")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .and_then(|(_, entry)| entry.get("shape")?.as_array().cloned())
        .ok_or_else(|| format_error(path, "no latents tensor"))?;
    let dims: Vec<usize> = shape
        .iter()
        .filter_map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect();
    <[usize; 4]>::try_from(dims)
        .map_err(|dims| format_error(path, format!("latents of shape {dims:?}, not [C, F, H, W]")))
}

/// Metadata of a latent cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatentCacheMetadata {
    /// `wan`.
    pub architecture: String,
    /// Media width before resizing.
    pub width: u32,
    /// Media height before resizing.
    pub height: u32,
    /// `1.0.1`.
    pub format_version: String,
    /// Clip length, for video caches.
    pub frame_count: Option<u32>,
}

/// One item's latents, as musubi-tuner's `save_latent_cache_wan` stores them.
#[derive(Clone, Debug)]
pub struct WanLatentCache {
    /// VAE latents, `[C, F, H, W]`.
    pub latents: Tensor,
    /// I2V conditioning: first-frame mask (4 channels) and image latents, `[4 + C, F, H, W]`.
    pub latents_image: Option<Tensor>,
    /// Control video latents, `[C, F, H, W]`.
    pub latents_control: Option<Tensor>,
    /// CLIP vision features of the first frame (Wan2.1 I2V), stored in float16.
    pub clip: Option<Tensor>,
    /// Latent frame indices for one-frame training.
    pub f_indices: Option<Vec<i32>>,
}

/// Writes a Wan latent cache. Key names follow musubi-tuner exactly, including its use of the latents' dtype
/// in the `clip_` key even though CLIP features are float16. NaNs become 0 as in musubi-tuner; the return value
/// is the names of the tensors that had any.
pub fn write_wan_latent_cache(
    path: &Path,
    cache: &WanLatentCache,
    meta: &LatentCacheMetadata,
) -> Result<Vec<String>, CacheError> {
    let (_, f, h, w) = cache
        .latents
        .dims4()
        .map_err(|e| format_error(path, format!("latents must be [C, F, H, W]: {e}")))?;
    let dtype = torch_dtype_name(cache.latents.dtype());
    let mut named: Vec<(String, &Tensor)> =
        vec![(format!("latents_{f}x{h}x{w}_{dtype}"), &cache.latents)];
    if let Some(t) = &cache.clip {
        named.push((format!("clip_{dtype}"), t));
    }
    if let Some(t) = &cache.latents_image {
        named.push((format!("latents_image_{f}x{h}x{w}_{dtype}"), t));
    }
    if let Some(t) = &cache.latents_control {
        named.push((format!("latents_control_{f}x{h}x{w}_{dtype}"), t));
    }
    let f_indices = match &cache.f_indices {
        Some(v) => Some(
            Tensor::new(v.as_slice(), &Device::Cpu)
                .map_err(|e| format_error(path, e.to_string()))?,
        ),
        None => None,
    };
    if let Some(t) = &f_indices {
        named.push(("f_indices_int32".to_string(), t));
    }
    let mut raw = Vec::with_capacity(named.len());
    let mut had_nan = Vec::new();
    for (key, t) in named {
        let (r, nan) = RawTensor::from_tensor(t, path)?;
        if nan {
            had_nan.push(key.clone());
        }
        raw.push((key, r));
    }
    let mut metadata = HashMap::from([
        ("architecture".to_string(), meta.architecture.clone()),
        ("width".to_string(), meta.width.to_string()),
        ("height".to_string(), meta.height.to_string()),
        ("format_version".to_string(), meta.format_version.clone()),
    ]);
    if let Some(n) = meta.frame_count {
        metadata.insert("frame_count".to_string(), n.to_string());
    }
    write_tensor_file(path, &raw, metadata)?;
    Ok(had_nan)
}

impl LatentCacheMetadata {
    /// Metadata musubi-tuner writes for a Wan item of `original_size`; `frame_count` for video clips.
    pub fn wan(original_size: (u32, u32), frame_count: Option<u32>) -> Self {
        Self {
            architecture: WAN_ARCHITECTURE.to_string(),
            width: original_size.0,
            height: original_size.1,
            format_version: CACHE_FORMAT_VERSION.to_string(),
            frame_count,
        }
    }
}

/// Reads a Wan latent cache written by musubi-tuner or by [`write_wan_latent_cache`].
pub fn read_wan_latent_cache(
    path: &Path,
    device: &Device,
) -> Result<(WanLatentCache, LatentCacheMetadata), CacheError> {
    let file = read_tensor_file(path, device)?;
    let mut latents = None;
    let mut cache_parts: HashMap<&str, Tensor> = HashMap::new();
    for (key, t) in &file.tensors {
        let base = strip_dtype_suffix(key);
        let part = if base.starts_with("latents_image_") {
            "latents_image"
        } else if base.starts_with("latents_control_") {
            "latents_control"
        } else if base.starts_with("latents_") {
            check_latent_shape(path, base, t)?;
            latents = Some(t.clone());
            continue;
        } else if base == "clip" || base == "f_indices" {
            base
        } else {
            continue;
        };
        cache_parts.insert(part, t.clone());
    }
    let latents =
        latents.ok_or_else(|| format_error(path, "no latents_{F}x{H}x{W}_{dtype} tensor"))?;
    let f_indices = match cache_parts.remove("f_indices") {
        Some(t) => Some(
            host_integers(path, "f_indices", &t)?
                .into_iter()
                .map(|v| v as i32)
                .collect(),
        ),
        None => None,
    };
    let cache = WanLatentCache {
        latents,
        latents_image: cache_parts.remove("latents_image"),
        latents_control: cache_parts.remove("latents_control"),
        clip: cache_parts.remove("clip"),
        f_indices,
    };
    Ok((cache, latent_metadata(path, &file.metadata)?))
}

/// The `FxHxW` in a `latents_` key must match the tensor's `[C, F, H, W]`.
fn check_latent_shape(path: &Path, base: &str, t: &Tensor) -> Result<(), CacheError> {
    let shape = base.rsplit('_').next().unwrap_or_default();
    let dims: Vec<usize> = shape.split('x').filter_map(|d| d.parse().ok()).collect();
    if dims.len() != 3 || t.dims().len() != 4 || t.dims()[1..] != dims[..] {
        return Err(format_error(
            path,
            format!("tensor {base} has shape {:?}", t.dims()),
        ));
    }
    Ok(())
}

fn latent_metadata(
    path: &Path,
    m: &HashMap<String, String>,
) -> Result<LatentCacheMetadata, CacheError> {
    let text = |key: &str| {
        m.get(key)
            .cloned()
            .ok_or_else(|| format_error(path, format!("no {key} in the metadata")))
    };
    let number = |key: &str| {
        text(key)?
            .parse::<u32>()
            .map_err(|_| format_error(path, format!("metadata {key} is not a number")))
    };
    let architecture = text("architecture")?;
    if architecture != WAN_ARCHITECTURE {
        return Err(format_error(
            path,
            format!("made for architecture {architecture}, not wan"),
        ));
    }
    Ok(LatentCacheMetadata {
        architecture,
        width: number("width")?,
        height: number("height")?,
        format_version: text("format_version")?,
        frame_count: m
            .get("frame_count")
            .map(|_| number("frame_count"))
            .transpose()?,
    })
}

/// One item's text-encoder output, as musubi-tuner's `save_text_encoder_output_cache_wan` stores it.
#[derive(Clone, Debug)]
pub struct WanTextCache {
    /// umT5 output for the caption's tokens only (no padding), `[L, 4096]`.
    pub t5: Tensor,
    /// The caption encoded (`caption1` metadata).
    pub caption: String,
}

/// Writes a Wan text-encoder cache. As in musubi-tuner, tensors already in an existing file under other names
/// are kept (a same-named tensor in another dtype is replaced), as is its extra metadata.
pub fn write_wan_text_cache(path: &Path, t5: &Tensor, caption: &str) -> Result<(), CacheError> {
    let key = format!("varlen_t5_{}", torch_dtype_name(t5.dtype()));
    let (raw, _) = RawTensor::from_tensor(t5, path)?;
    let mut tensors = vec![(key, raw)];
    let mut metadata = HashMap::new();
    if path.exists() {
        let old = read_tensor_file(path, &Device::Cpu)?;
        if old.metadata.get("architecture").map(String::as_str) != Some(WAN_ARCHITECTURE) {
            return Err(format_error(
                path,
                "an existing cache for another architecture is in the way",
            ));
        }
        for (k, t) in &old.tensors {
            if strip_dtype_suffix(k) != "varlen_t5" {
                tensors.push((k.clone(), RawTensor::from_tensor(t, path)?.0));
            }
        }
        metadata = old.metadata;
    }
    metadata.insert("architecture".into(), WAN_ARCHITECTURE.into());
    metadata.insert("caption1".into(), caption.into());
    metadata.insert("format_version".into(), CACHE_FORMAT_VERSION.into());
    write_tensor_file(path, &tensors, metadata)
}

/// Reads a Wan text-encoder cache.
pub fn read_wan_text_cache(path: &Path, device: &Device) -> Result<WanTextCache, CacheError> {
    let file = read_tensor_file(path, device)?;
    if file.metadata.get("architecture").map(String::as_str) != Some(WAN_ARCHITECTURE) {
        return Err(format_error(
            path,
            "the metadata does not say architecture = wan",
        ));
    }
    let t5 = file
        .tensors
        .iter()
        .find(|(k, _)| strip_dtype_suffix(k) == "varlen_t5")
        .map(|(_, t)| t.clone())
        .ok_or_else(|| format_error(path, "no varlen_t5_{dtype} tensor"))?;
    Ok(WanTextCache {
        t5,
        caption: file.metadata.get("caption1").cloned().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
