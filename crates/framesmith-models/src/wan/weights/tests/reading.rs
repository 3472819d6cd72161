//! Reading tensor data from opened checkpoints: every dtype as candle's own reader gives it, large tensors read by
//! several threads, FP8 codes as their bytes, no mapping of the file left in the process, and a file shortened
//! while it is open reported by name instead of crashing the process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use framesmith_nn::linear::Linear;
use framesmith_nn::vb::{TensorSource, Vb};

use crate::wan::weights::testkit::{dit_specs, fp8, write, Scales};
use crate::wan::weights::*;
use crate::wan::WanConfig;

/// A safetensors file of `tensors` (name, dtype, shape, data bytes).
fn write_raw(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Result<PathBuf> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let json = serde_json::Value::Object(header).to_string().into_bytes();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&data);
    std::fs::write(path, out)?;
    Ok(path.to_path_buf())
}

/// `n` little-endian words made by `word`.
fn words<const N: usize>(n: usize, word: impl Fn(usize) -> [u8; N]) -> Vec<u8> {
    (0..n).flat_map(word).collect()
}

/// Every value of `t` as f64 (FP8 codes and integers as their values, exactly).
fn values(t: &Tensor) -> Result<Vec<f64>> {
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::U8 => flat.to_vec1::<u8>()?.into_iter().map(f64::from).collect(),
        DType::U32 => flat.to_vec1::<u32>()?.into_iter().map(f64::from).collect(),
        DType::I16 => flat.to_vec1::<i16>()?.into_iter().map(f64::from).collect(),
        DType::I32 => flat.to_vec1::<i32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => flat
            .to_vec1::<i64>()?
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        DType::F8E4M3 => flat
            .to_vec1::<float8::F8E4M3>()?
            .into_iter()
            .map(|c| f64::from(c.to_bits()))
            .collect(),
        _ => flat.to_dtype(DType::F64)?.to_vec1::<f64>()?,
    })
}

/// A tensor of every dtype candle reads (name, dtype, shape, data bytes), one larger than a read part.
fn every_dtype() -> Vec<(&'static str, &'static str, Vec<usize>, Vec<u8>)> {
    let float = |k: usize| ((k % 13) as f32 - 6.0) * 0.125;
    // Over 8 MiB: read by several threads, a part each.
    let large = 5 << 20;
    vec![
        ("u8", "U8", vec![3, 5], words(15, |k| [(k * 7 % 251) as u8])),
        (
            "f8",
            "F8_E4M3",
            vec![4, 4],
            words(16, |k| [(k % 120) as u8]),
        ),
        (
            "bf16",
            "BF16",
            vec![2, 3],
            words(6, |k| half::bf16::from_f32(float(k)).to_le_bytes()),
        ),
        (
            "f16",
            "F16",
            vec![7],
            words(7, |k| half::f16::from_f32(float(k)).to_le_bytes()),
        ),
        (
            "f32",
            "F32",
            vec![2, 2, 2],
            words(8, |k| float(k).to_le_bytes()),
        ),
        (
            "f64",
            "F64",
            vec![3],
            words(3, |k| f64::from(float(k)).to_le_bytes()),
        ),
        (
            "u16",
            "U16",
            vec![4],
            words(4, |k| (k as u16 * 4099).to_le_bytes()),
        ),
        (
            "u32",
            "U32",
            vec![4],
            words(4, |k| (k as u32 * 70001).to_le_bytes()),
        ),
        (
            "i16",
            "I16",
            vec![4],
            words(4, |k| (k as i16 - 2).to_le_bytes()),
        ),
        (
            "i32",
            "I32",
            vec![4],
            words(4, |k| (k as i32 * -70001).to_le_bytes()),
        ),
        (
            "i64",
            "I64",
            vec![2, 2],
            words(4, |k| (k as i64 - 3).to_le_bytes()),
        ),
        (
            "large",
            "BF16",
            vec![large],
            words(large, |k| half::bf16::from_f32(float(k)).to_le_bytes()),
        ),
        ("empty", "F32", vec![0, 4], Vec::new()),
    ]
}

#[test]
fn every_dtype_reads_as_candle_reads_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tensors = every_dtype();
    let path = write_raw(&dir.path().join("all.safetensors"), &tensors)?;
    let expected = candle_core::safetensors::load(&path, &Device::Cpu)?;
    let entries: Vec<Entry> = tensors
        .iter()
        .map(|(name, dtype, _, _)| Entry {
            file: 0,
            stored: (*name).to_string(),
            name: format!("official.{name}"),
            dtype: (*dtype).to_string(),
        })
        .collect();
    let opened = MappedTensors::open(std::slice::from_ref(&path), &entries)?;
    assert_eq!(opened.len(), tensors.len());
    for (name, want) in &expected {
        let got = opened
            .read(&format!("official.{name}"))?
            .with_context(|| format!("{name} not read"))?;
        assert_eq!(
            (got.dtype(), got.dims()),
            (want.dtype(), want.dims()),
            "{name}"
        );
        assert_eq!(values(&got)?, values(want)?, "{name}");
    }
    // FP8 codes as their bytes; other dtypes are not FP8 codes.
    let codes = opened.read_fp8_codes("official.f8")?.context("f8 codes")?;
    assert_eq!(codes.dtype(), DType::U8);
    assert_eq!(values(&codes)?, values(&expected["f8"])?);
    assert!(opened.read_fp8_codes("official.bf16")?.is_none());
    assert!(opened.read_fp8_codes("official.missing")?.is_none());
    Ok(())
}

/// The lines of this process's memory map naming `path`.
#[cfg(target_os = "linux")]
fn mappings_of(path: &Path) -> Result<usize> {
    let canonical = std::fs::canonicalize(path)?;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(maps
        .lines()
        .filter(|l| l.ends_with(&*canonical.to_string_lossy()))
        .count())
}

#[cfg(target_os = "linux")]
#[test]
fn a_model_built_from_a_checkpoint_leaves_no_mapping_of_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let path = write(
        &dir.path().join("tiny_fp8.safetensors"),
        &fp8(&dit_specs(&cfg, "BF16"), Scales::ComfyTensor),
    )?;
    let opened = open(&path, Some(&cfg))?;
    let names: Vec<String> = opened.tensors.names().map(str::to_string).collect();
    let source: std::sync::Arc<dyn TensorSource> = std::sync::Arc::new(opened.tensors);
    let read: Vec<Tensor> = names
        .iter()
        .map(|n| source.read(n)?.context("read"))
        .collect::<Result<_>>()?;
    assert_eq!(read.len(), names.len());
    // Open, every tensor read and still alive: the file's pages are in no mapping of this process.
    assert_eq!(mappings_of(&path)?, 0);
    Ok(())
}

#[test]
fn a_file_shortened_while_open_is_an_error_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(2);
    let path = write(
        &dir.path().join("tiny.safetensors"),
        &dit_specs(&cfg, "BF16"),
    )?;
    let opened = open(&path, Some(&cfg))?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)?
        .set_len(64)?;
    let err = opened
        .tensors
        .load_all(&Device::Cpu)
        .err()
        .context("a shortened file read without an error")?;
    let message = err.to_string();
    assert!(message.contains("shortened or replaced"), "{message}");
    assert!(message.ends_with(&path.display().to_string()), "{message}");
    Ok(())
}

#[test]
fn fp8_linears_read_as_bytes_equal_those_read_as_tensors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = WanConfig::tiny(1);
    let path = write(
        &dir.path().join("tiny_fp8.safetensors"),
        &fp8(&dit_specs(&cfg, "BF16"), Scales::ComfyTensor),
    )?;
    let opened = open(&path, Some(&cfg))?;
    let all: HashMap<String, Tensor> = opened.tensors.load_all(&Device::Cpu)?;
    let dim = cfg.dim;
    let fp8 = Some(framesmith_nn::fp8::Fp8Scale::Tensor);
    let from_file = Vb::from_source(
        std::sync::Arc::new(opened.tensors),
        DType::F32,
        &Device::Cpu,
    )
    .with_fp8(fp8);
    let from_map = Vb::from_tensors(all, DType::F32, &Device::Cpu).with_fp8(fp8);
    let layer = "blocks.0.self_attn.q";
    let a = Linear::load(&from_file.pp(layer), dim, dim)?;
    let b = Linear::load(&from_map.pp(layer), dim, dim)?;
    let dense = |l: &Linear| -> Result<Vec<f64>> { values(&l.base().dense(DType::F32)?) };
    assert_eq!(dense(&a)?, dense(&b)?);
    Ok(())
}
