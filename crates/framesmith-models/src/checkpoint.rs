//! What every family's checkpoint reader does the same way once a file's safetensors header is read: find the
//! ComfyUI prefix before the model's names, index the tensors' shapes under the stripped names, and list the
//! tensors to map under those names (the `scaled_fp8` marker of ComfyUI's FP8 files left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device};

use crate::wan::weights::{read_header, Entry, MappedTensors, ModelFormatError, TensorInfo};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::vb::{Vb, WEIGHT_SCALE_KEYS};

/// The prefixes ComfyUI puts before a diffusion model's own names in a single-file checkpoint.
pub(crate) const COMFY_PREFIXES: [&str; 2] = ["model.diffusion_model.", "diffusion_model."];

/// The marker tensor of ComfyUI's scaled-FP8 files (the scales themselves sit beside each weight).
pub(crate) const SCALED_FP8_MARKER: &str = "scaled_fp8";

/// The ComfyUI prefix of `tensors`: the first of [`COMFY_PREFIXES`] that begins a name containing `marker` (a
/// part only the model's own names have, e.g. `"transformer_blocks."`).
pub(crate) fn comfy_prefix(tensors: &[TensorInfo], marker: &str) -> Option<&'static str> {
    COMFY_PREFIXES.into_iter().find(|p| {
        tensors
            .iter()
            .any(|t| t.name.starts_with(p) && t.name.contains(marker))
    })
}

/// `name` with `prefix` stripped where it has it.
pub(crate) fn strip<'a>(name: &'a str, prefix: Option<&str>) -> &'a str {
    prefix.and_then(|p| name.strip_prefix(p)).unwrap_or(name)
}

/// The tensors to map, each `(file index, header entry)`, under their names with `prefix` stripped.
pub(crate) fn entries<'a>(
    tensors: impl IntoIterator<Item = (usize, &'a TensorInfo)>,
    prefix: Option<&str>,
) -> Vec<Entry> {
    tensors
        .into_iter()
        .filter(|(_, t)| t.name != SCALED_FP8_MARKER)
        .map(|(i, t)| Entry {
            file: i,
            stored: t.name.clone(),
            name: strip(&t.name, prefix).to_string(),
            dtype: t.dtype.clone(),
        })
        .collect()
}

/// A [`Vb`] in `dtype` on `device` (linear bases in FP8 with `fp8`) over the tensors of `files` (each
/// `(file index, header entry)`) that `rename` gives a model name, the others left out; tensors are read from the
/// mapped files only as the model asks for them.
pub(crate) fn mapped_vb(
    files: &[PathBuf],
    tensors: &[(usize, TensorInfo)],
    rename: impl Fn(&str) -> Option<&str>,
    dtype: DType,
    device: &Device,
    fp8: Option<Fp8Scale>,
) -> Result<Vb, ModelFormatError> {
    let entries: Vec<Entry> = tensors
        .iter()
        .filter_map(|(i, t)| {
            Some(Entry {
                file: *i,
                stored: t.name.clone(),
                name: rename(&t.name)?.to_string(),
                dtype: t.dtype.clone(),
            })
        })
        .collect();
    let tensors = MappedTensors::open(files, &entries)?;
    Ok(Vb::from_source(Arc::new(tensors), dtype, device).with_fp8(fp8))
}

/// The headers of `files` (a folder's shards, in order): each tensor with its file's index, and the files' bytes.
pub(crate) fn read_shards(
    files: &[PathBuf],
) -> Result<(Vec<(usize, TensorInfo)>, u64), ModelFormatError> {
    let (mut tensors, mut bytes_on_disk) = (Vec::new(), 0);
    for (i, shard) in files.iter().enumerate() {
        let header = read_header(shard)?;
        tensors.extend(header.tensors.into_iter().map(|t| (i, t)));
        bytes_on_disk += header.file_bytes;
    }
    Ok((tensors, bytes_on_disk))
}

/// What a checkpoint's tensors add up to, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Number of tensors per dtype (safetensors spelling).
    pub dtypes: BTreeMap<String, usize>,
    /// FP8 weights stored with their scales (ComfyUI `scaled_fp8`, or `weight_scale` beside the weights).
    pub scaled_fp8: bool,
    pub parameter_count: u64,
}

impl Tally {
    /// The tally of `tensors`.
    pub fn of<'a>(tensors: impl IntoIterator<Item = &'a TensorInfo>) -> Self {
        let mut tally = Self {
            dtypes: BTreeMap::new(),
            scaled_fp8: false,
            parameter_count: 0,
        };
        for t in tensors {
            *tally.dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
            tally.scaled_fp8 |= t.name == SCALED_FP8_MARKER
                || WEIGHT_SCALE_KEYS
                    .iter()
                    .any(|k| t.name.ends_with(&format!(".{k}")));
            tally.parameter_count += t.numel();
        }
        tally
    }
}

/// Tensor shapes by name (prefix stripped), for telling what a file is and reading its sizes.
pub(crate) struct Names<'a> {
    pub shapes: BTreeMap<&'a str, &'a [usize]>,
}

impl<'a> Names<'a> {
    /// The shapes of `tensors` under their names with `prefix` stripped.
    pub fn new(tensors: impl IntoIterator<Item = &'a TensorInfo>, prefix: Option<&str>) -> Self {
        let shapes = tensors
            .into_iter()
            .map(|t| (strip(&t.name, prefix), t.shape.as_slice()))
            .collect();
        Self { shapes }
    }

    /// Whether a tensor is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }

    /// Whether a name begins with `prefix`.
    pub fn any_prefix(&self, prefix: &str) -> bool {
        self.shapes.keys().any(|n| n.starts_with(prefix))
    }

    /// The size of `name` along `axis`.
    pub fn dim(&self, name: &str, axis: usize) -> Option<usize> {
        self.shapes.get(name).and_then(|s| s.get(axis).copied())
    }

    /// Number of distinct indices N in names `<prefix>N.…` (blocks, layers).
    pub fn count(&self, prefix: &str) -> usize {
        self.shapes
            .keys()
            .filter_map(|n| {
                n.strip_prefix(prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .collect::<BTreeSet<_>>()
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, shape: &[usize]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: "BF16".into(),
            shape: shape.to_vec(),
            len_bytes: 0,
            data_start: 0,
        }
    }

    #[test]
    fn the_prefix_is_the_one_before_the_models_own_names() {
        let tensors = [
            info("model.diffusion_model.blocks.0.w", &[2]),
            info("diffusion_model.other", &[1]),
        ];
        assert_eq!(
            comfy_prefix(&tensors, "blocks."),
            Some("model.diffusion_model.")
        );
        assert_eq!(comfy_prefix(&tensors, "layers."), None);
    }

    #[test]
    fn names_are_indexed_stripped_and_blocks_counted_by_index() {
        let tensors = [
            info("p.blocks.0.a", &[3, 4]),
            info("p.blocks.2.a", &[3, 4]),
            info("p.blocks.10.b", &[5]),
            info("other", &[1]),
        ];
        let names = Names::new(&tensors, Some("p."));
        assert!(names.has("blocks.0.a") && names.has("other") && !names.has("p.blocks.0.a"));
        assert!(names.any_prefix("blocks.") && !names.any_prefix("layers."));
        assert_eq!(names.dim("blocks.2.a", 1), Some(4));
        assert_eq!(names.dim("blocks.2.a", 2), None);
        assert_eq!(names.count("blocks."), 3);
    }

    #[test]
    fn a_tally_counts_dtypes_parameters_and_sees_fp8_scales() {
        let plain = [info("a", &[2, 3]), info("b", &[4])];
        let tally = Tally::of(&plain);
        assert_eq!(tally.parameter_count, 10);
        assert_eq!(tally.dtypes.get("BF16"), Some(&2));
        assert!(!tally.scaled_fp8);
        let scale = format!("a.{}", WEIGHT_SCALE_KEYS[0]);
        assert!(Tally::of(&[info(&scale, &[1])]).scaled_fp8);
        assert!(Tally::of(&[info(SCALED_FP8_MARKER, &[0])]).scaled_fp8);
    }

    #[test]
    fn entries_strip_the_prefix_and_leave_out_the_fp8_marker() {
        let tensors = [
            (0, info("p.a", &[1])),
            (1, info(SCALED_FP8_MARKER, &[0])),
            (1, info("b", &[1])),
        ];
        let got: Vec<(usize, String, String)> =
            entries(tensors.iter().map(|(i, t)| (*i, t)), Some("p."))
                .into_iter()
                .map(|e| (e.file, e.stored, e.name))
                .collect();
        assert_eq!(
            got,
            [(0, "p.a".into(), "a".into()), (1, "b".into(), "b".into())]
        );
    }
}
