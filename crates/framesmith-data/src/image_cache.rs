//! The latent and text-encoder caches of an image family in musubi-tuner's per-architecture scheme, one reader and
//! writer for every family that caches images this way: `{stem}_{W:04}x{H:04}_{suffix}.safetensors` with
//! `latents_1x{H}x{W}_{dtype}` and `{stem}_{suffix}_te.safetensors` with the family's text tensors
//! (`{name}_{dtype}`), both with the metadata `architecture`. A family says only what differs ([`ImageCacheArch`]:
//! its suffix, its architecture tag) and which text tensors it keeps (`family/<name>/cache.rs`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::cache::{LatentCacheName, CACHE_FORMAT_VERSION};
use crate::tensor_file::{
    format_error, read_tensor_file, strip_dtype_suffix, torch_dtype_name, write_tensor_file,
    CacheError, RawTensor,
};

/// The text cache's metadata entry saying which control images (and which encoding of them) an embedding was made
/// from, for a family whose text encoder sees an edit item's control images; absent when it saw none.
pub const CONTROLS_METADATA: &str = "framesmith_controls";

/// What tells one image family's caches from another's.
#[derive(Clone, Copy, Debug)]
pub struct ImageCacheArch {
    /// The short architecture name at the end of the file names (`flux`, musubi-tuner's `qi`).
    pub suffix: &'static str,
    /// The architecture in the caches' metadata (`flux`, `qwen_image`).
    pub architecture: &'static str,
    /// The family's name in messages (`FLUX.1`, `Qwen-Image`).
    pub family: &'static str,
    /// How its latent caches name control latents (an edit model's source images).
    pub control_keys: ControlKeys,
}

/// How a latent cache names the control latents stored beside the item's latents (musubi-tuner's keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlKeys {
    /// One control image: `latents_control_1x{H}x{W}_{dtype}` (FLUX.1 Kontext).
    Single,
    /// Any number: `latents_control_{i}_1x{H}x{W}_{dtype}` (Qwen-Image-Edit).
    Indexed,
}

/// The index of a control latent key (`latents_control_{i}_…`, or `latents_control_{F}x…` for the only one);
/// `None` for any other key.
fn control_index(key: &str) -> Option<usize> {
    let rest = key.strip_prefix("latents_control_")?;
    match rest.split_once('_') {
        Some((first, _)) if !first.contains('x') => first.parse().ok(),
        _ => Some(0),
    }
}

impl ImageCacheArch {
    /// Latent cache file name of an image. `original_size` is the image's size before resizing.
    pub fn latent_cache_name(&self, stem: &str, original_size: (u32, u32)) -> String {
        let (w, h) = original_size;
        format!("{stem}_{w:04}x{h:04}_{}.safetensors", self.suffix)
    }

    /// Text-encoder cache file name of an image.
    pub fn text_cache_name(&self, stem: &str) -> String {
        format!("{stem}_{}_te.safetensors", self.suffix)
    }

    /// Parses a latent cache file name of this family; `None` for anything else (other families' included).
    pub fn parse_latent_cache_name(&self, file_name: &str) -> Option<LatentCacheName> {
        let body = file_name.strip_suffix(&format!("_{}.safetensors", self.suffix))?;
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
    pub(crate) fn check_architecture(
        &self,
        path: &Path,
        metadata: &HashMap<String, String>,
    ) -> Result<(), CacheError> {
        match metadata.get("architecture").map(String::as_str) {
            Some(arch) if arch == self.architecture => Ok(()),
            Some(other) => Err(format_error(
                path,
                format!(
                    "made for architecture {other}, not {}: cache the dataset for {} again",
                    self.architecture, self.family
                ),
            )),
            None => Err(format_error(path, "no architecture in the metadata")),
        }
    }

    /// The metadata every cache of this family carries, with `extra` entries.
    pub(crate) fn metadata<const N: usize>(
        &self,
        extra: [(&str, String); N],
    ) -> HashMap<String, String> {
        let mut metadata = HashMap::from([
            ("architecture".to_string(), self.architecture.to_string()),
            (
                "format_version".to_string(),
                CACHE_FORMAT_VERSION.to_string(),
            ),
        ]);
        metadata.extend(extra.map(|(k, v)| (k.to_string(), v)));
        metadata
    }

    /// Writes an image's latents `[C, 1, H, W]` (as the family's DiT takes them) as `latents_1x{H}x{W}_{dtype}`.
    pub fn write_latent_cache(
        &self,
        path: &Path,
        latents: &Tensor,
        original_size: (u32, u32),
    ) -> Result<(), CacheError> {
        self.write_latent_cache_with_controls(path, latents, &[], original_size)
    }

    /// Writes an image's latents `[C, 1, H, W]` and its control images' latents (each `[C, 1, h, w]`, in order)
    /// under the family's [`ControlKeys`].
    pub fn write_latent_cache_with_controls(
        &self,
        path: &Path,
        latents: &Tensor,
        controls: &[Tensor],
        original_size: (u32, u32),
    ) -> Result<(), CacheError> {
        let shape = |t: &Tensor| {
            t.dims4()
                .map_err(|e| format_error(path, format!("latents must be [C, 1, H, W]: {e}")))
        };
        let (_, f, h, w) = shape(latents)?;
        let key = format!("latents_{f}x{h}x{w}_{}", torch_dtype_name(latents.dtype()));
        let mut raw = vec![(key, RawTensor::from_tensor(latents, path)?.0)];
        if self.control_keys == ControlKeys::Single && controls.len() > 1 {
            return Err(format_error(
                path,
                format!(
                    "{} takes one control image, not {}",
                    self.family,
                    controls.len()
                ),
            ));
        }
        for (i, control) in controls.iter().enumerate() {
            let (_, f, h, w) = shape(control)?;
            let dtype = torch_dtype_name(control.dtype());
            let key = match self.control_keys {
                ControlKeys::Single => format!("latents_control_{f}x{h}x{w}_{dtype}"),
                ControlKeys::Indexed => format!("latents_control_{i}_{f}x{h}x{w}_{dtype}"),
            };
            raw.push((key, RawTensor::from_tensor(control, path)?.0));
        }
        let (width, height) = original_size;
        let metadata =
            self.metadata([("width", width.to_string()), ("height", height.to_string())]);
        write_tensor_file(path, &raw, metadata)
    }

    /// Reads the latents `[C, 1, H, W]` of a latent cache and its control latents (each `[C, 1, h, w]`, in
    /// index order; none when the item has no control image).
    pub fn read_latent_cache_with_controls(
        &self,
        path: &Path,
        device: &Device,
    ) -> Result<(Tensor, Vec<Tensor>), CacheError> {
        let file = read_tensor_file(path, device)?;
        self.check_architecture(path, &file.metadata)?;
        let mut controls: Vec<(usize, Tensor)> = file
            .tensors
            .iter()
            .filter_map(|(k, t)| control_index(k).map(|i| (i, t.clone())))
            .collect();
        controls.sort_by_key(|(i, _)| *i);
        let controls: Vec<Tensor> = controls.into_iter().map(|(_, t)| t).collect();
        for control in &controls {
            if !matches!(control.dims(), [_, 1, _, _]) {
                return Err(format_error(
                    path,
                    format!(
                        "control latents of shape {:?}, not [C, 1, H, W]",
                        control.dims()
                    ),
                ));
            }
        }
        Ok((self.latents_of(path, &file.tensors)?, controls))
    }

    /// Reads the latents `[C, 1, H, W]` of a latent cache (other tensors, such as control latents, are not read).
    pub fn read_latent_cache(&self, path: &Path, device: &Device) -> Result<Tensor, CacheError> {
        Ok(self.read_latent_cache_with_controls(path, device)?.0)
    }

    /// The `latents_1x{H}x{W}_{dtype}` tensor among a cache's `tensors`.
    fn latents_of(
        &self,
        path: &Path,
        tensors: &HashMap<String, Tensor>,
    ) -> Result<Tensor, CacheError> {
        let latents = tensors
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

    /// Writes a text-encoder cache: each of `tensors` as `{name}_{dtype}`, the caption as `caption1`.
    pub fn write_text_cache(
        &self,
        path: &Path,
        tensors: &[(&str, &Tensor)],
        caption: &str,
    ) -> Result<(), CacheError> {
        self.write_text_cache_with_controls(path, tensors, (caption, None))
    }

    /// [`Self::write_text_cache`] for an encoding that saw the item's control images: `controls` (what made it,
    /// e.g. the pipeline and [`crate::control::control_stamp`]) is kept as [`CONTROLS_METADATA`].
    pub fn write_text_cache_with_controls(
        &self,
        path: &Path,
        tensors: &[(&str, &Tensor)],
        (caption, controls): (&str, Option<&str>),
    ) -> Result<(), CacheError> {
        let mut raw = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            let key = format!("{name}_{}", torch_dtype_name(t.dtype()));
            raw.push((key, RawTensor::from_tensor(t, path)?.0));
        }
        let mut metadata = self.metadata([("caption1", caption.to_string())]);
        if let Some(controls) = controls {
            metadata.insert(CONTROLS_METADATA.to_owned(), controls.to_owned());
        }
        write_tensor_file(path, &raw, metadata)
    }

    /// Reads a text-encoder cache: the tensors `names` (each stored as `{name}_{dtype}`), in that order, and the
    /// caption encoded (`caption1`, empty when absent).
    pub fn read_text_cache<const N: usize>(
        &self,
        path: &Path,
        device: &Device,
        names: [&str; N],
    ) -> Result<([Tensor; N], String), CacheError> {
        let file = read_tensor_file(path, device)?;
        self.check_architecture(path, &file.metadata)?;
        let get = |name: &str| {
            file.tensors
                .iter()
                .find(|(k, _)| strip_dtype_suffix(k) == name)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| format_error(path, format!("no {name}_{{dtype}} tensor")))
        };
        let mut tensors = Vec::with_capacity(N);
        for name in names {
            tensors.push(get(name)?);
        }
        let tensors = <[Tensor; N]>::try_from(tensors)
            .map_err(|_| format_error(path, "a text tensor went missing"))?;
        let caption = file.metadata.get("caption1").cloned().unwrap_or_default();
        Ok((tensors, caption))
    }
}
