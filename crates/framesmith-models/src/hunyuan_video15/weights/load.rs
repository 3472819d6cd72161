//! Builds the HunyuanVideo 1.5 transformer from its files — any layout [`super::identify`] names — its tensors
//! read from the mapped files as the model asks for them, under the official names ([`LayoutSource`]). FP8 files
//! stay FP8 when the run keeps its blocks in FP8 (plain `float8_e4m3fn` or ComfyUI `scaled_fp8`) and are
//! dequantised otherwise; bf16 files are quantised on load when asked. 1.0 files and PyTorch archives are refused
//! with what to download instead.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::{describe, scan, Container, HunyuanVideoFile, HunyuanVideoFormatError, Version};
use crate::checkpoint::entries;
use crate::hunyuan_video15::layout::LayoutSource;
use crate::hunyuan_video15::HunyuanVideo15Transformer;
use crate::wan::weights::MappedTensors;
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::vb::Vb;

/// An opened HunyuanVideo 1.5 transformer: what it is, and its tensors as stored (prefix stripped), each read
/// when a module asks for it.
pub struct OpenedHunyuanVideo15 {
    pub file: HunyuanVideoFile,
    pub tensors: MappedTensors,
}

/// Opens the HunyuanVideo 1.5 transformer at `path` (a file or a folder), mapping its data.
pub fn open(path: &Path) -> Result<OpenedHunyuanVideo15, HunyuanVideoFormatError> {
    let scanned = scan(path)?;
    let file = describe(path, &scanned)?;
    if file.version == Version::V10 {
        return Err(HunyuanVideoFormatError::Version10 {
            layout: file.layout_label(),
            path: path.to_path_buf(),
        });
    }
    if file.container == Container::PyTorch {
        return Err(HunyuanVideoFormatError::Build {
            problem: "HunyuanVideo 1.5 is released as safetensors; this PyTorch archive is not read for weights \
                      (download the safetensors files instead)"
                .into(),
            path: path.to_path_buf(),
        });
    }
    let prefix = file.container.prefix();
    let entries = entries(scanned.tensors.iter().map(|(i, t)| (*i, t)), prefix);
    let tensors = MappedTensors::open(&scanned.files, &entries)?;
    Ok(OpenedHunyuanVideo15 { file, tensors })
}

/// Builds the transformer at `path` in `dtype` on `device`, its block linears kept in FP8 with `fp8` set (FP8
/// files stay FP8; dense files are quantised), else dense.
pub fn load_dit(
    path: &Path,
    dtype: DType,
    device: &Device,
    fp8: Option<Fp8Scale>,
) -> Result<HunyuanVideo15Transformer, HunyuanVideoFormatError> {
    load_dit_streamed(
        path,
        (dtype, device),
        fp8,
        false,
        (&[], &OffloadOptions::default()),
    )
}

/// [`load_dit`] with the blocks in `streamed` (indices into `double_blocks`) kept in host RAM and streamed
/// through GPU slots with `offload`; `fp8_products`: FP8 bases held for FP8 tensor-core products.
pub fn load_dit_streamed(
    path: &Path,
    (dtype, device): (DType, &Device),
    fp8: Option<Fp8Scale>,
    fp8_products: bool,
    (streamed, offload): (&[usize], &OffloadOptions),
) -> Result<HunyuanVideo15Transformer, HunyuanVideoFormatError> {
    let opened = open(path)?;
    let build = |problem: String| HunyuanVideoFormatError::Build {
        problem,
        path: path.to_path_buf(),
    };
    let config = opened
        .file
        .config
        .clone()
        .ok_or_else(|| build("no sizes were read".into()))?;
    let source = LayoutSource::new(Arc::new(opened.tensors), opened.file.keys);
    let vb = Vb::from_source(Arc::new(source), dtype, device)
        .with_fp8(fp8)
        .with_fp8_products(fp8_products);
    HunyuanVideo15Transformer::new_streamed(&config, &vb, streamed, offload)
        .map_err(|e| build(e.to_string()))
}
