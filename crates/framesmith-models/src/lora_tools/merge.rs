//! `framesmith lora merge`: folds adapter files (any kind, each with its strength) into a base model file, one
//! tensor at a time. The output has the base file's header byte for byte (names, dtypes, shapes, offsets,
//! metadata); each adapted weight is rewritten in its own dtype — FP8 weights dequantised, merged and quantised
//! again with the same scale layout (new scale values, a second rounding) — and every other tensor is copied.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use framesmith_nn::adapter::Adapter;
use framesmith_nn::file::open_regular;
use framesmith_nn::lora_file::{musubi_name, LoraFile};

use super::fp8::{requantize, Fp8Parts};
use crate::hunyuan_video15::lora_keys::stacked_qkv;
use crate::wan::weights::{read_header, TensorInfo};

/// One adapter file to merge and the strength to merge it with.
#[derive(Clone, Debug)]
pub struct MergeInput {
    pub path: PathBuf,
    pub strength: f64,
}

/// What a merge changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeReport {
    /// Modules merged from each input file, in the order given.
    pub modules_per_file: Vec<usize>,
    /// Base weights rewritten, and how many of them are FP8 (merged and quantised again).
    pub weights: usize,
    pub fp8_weights: usize,
}

/// Prefixes a base model's tensors may carry (ComfyUI's, its bare DiT's, none).
const PREFIXES: [&str; 3] = ["model.diffusion_model.", "diffusion_model.", ""];

/// An adapter to fold into rows `rows_from..` of a base weight.
struct Target {
    adapter: Adapter,
    rows_from: usize,
}

/// Merges `inputs` into the base model file `base` and writes the result to `out` (never `base` itself: the
/// output goes to a temporary file beside `out`, renamed into place when complete). Memory holds one tensor at a
/// time (in f32) beside the adapters.
pub fn merge(base: &Path, out: &Path, inputs: &[MergeInput]) -> Result<MergeReport> {
    if inputs.is_empty() {
        bail!("give at least one adapter with --lora FILE[:STRENGTH]");
    }
    super::refuse_same_file(base, out, "merge")?;
    let header = read_header(base).with_context(|| "cannot read the base model".to_string())?;
    let mut adapters: HashMap<String, Vec<(usize, Adapter)>> = HashMap::new();
    for (i, input) in inputs.iter().enumerate() {
        for (name, adapter) in read_adapters(input)? {
            adapters.entry(name).or_default().push((i, adapter));
        }
    }
    let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
    let prefix = PREFIXES
        .into_iter()
        .max_by_key(|p| count_matches(&names, p, &adapters))
        .unwrap_or("");
    let mut report = MergeReport {
        modules_per_file: vec![0; inputs.len()],
        ..MergeReport::default()
    };
    let targets = plan_targets(&header.tensors, prefix, &mut adapters, &mut report);
    if let Some(unused) = unused_modules(&adapters) {
        bail!(
            "{unused} not in the base model (is the LoRA for another model or variant?); merge it into the model \
             it was trained on: {}",
            base.display()
        );
    }
    write_merged(base, out, &header.tensors, &targets, &mut report)?;
    Ok(report)
}

/// The adapters of one file by musubi-tuner module name, each with the input's strength.
fn read_adapters(input: &MergeInput) -> Result<Vec<(String, Adapter)>> {
    let path = &input.path;
    let file = LoraFile::load(path, &Device::Cpu)
        .with_context(|| format!("cannot read the adapter {}", path.display()))?;
    file.check_finite(path)?;
    let mut out = Vec::new();
    for m in &file.modules {
        let lora = framesmith_nn::lora::Lora::from_tensors(&m.down, &m.up, m.alpha)?;
        out.push((m.name.clone(), Adapter::Lora(lora)));
    }
    for m in &file.adapters {
        let adapter = m
            .adapter(&Device::Cpu)
            .with_context(|| format!("module `{}` of {}", m.name, path.display()))?;
        out.push((m.name.clone(), adapter));
    }
    for (_, adapter) in &mut out {
        adapter.set_multiplier(input.strength);
    }
    Ok(out)
}

/// The module path of a 2-D base weight under `prefix` (`blocks.0.self_attn.q`), if it is one.
fn weight_module<'a>(t: &'a TensorInfo, prefix: &str) -> Option<&'a str> {
    let module = t.name.strip_prefix(prefix)?.strip_suffix(".weight")?;
    (t.shape.len() == 2).then_some(module)
}

fn count_matches(
    names: &[&str],
    prefix: &str,
    adapters: &HashMap<String, Vec<(usize, Adapter)>>,
) -> usize {
    names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.strip_suffix(".weight"))
        .filter(|m| {
            let name = musubi_name(m);
            adapters.contains_key(&name)
                || stacked_qkv(&name)
                    .is_some_and(|parts| parts.iter().any(|p| adapters.contains_key(p)))
        })
        .count()
}

/// The adapters to fold into each base weight (by tensor name), taken out of `adapters`: those named after the
/// weight's module, or, for a stacked q/k/v weight (HunyuanVideo 1.5 in ComfyUI's layout), those of its parts.
fn plan_targets(
    tensors: &[TensorInfo],
    prefix: &str,
    adapters: &mut HashMap<String, Vec<(usize, Adapter)>>,
    report: &mut MergeReport,
) -> HashMap<String, Vec<Target>> {
    let mut targets: HashMap<String, Vec<Target>> = HashMap::new();
    for t in tensors {
        let Some(module) = weight_module(t, prefix) else {
            continue;
        };
        let name = musubi_name(module);
        let mut found = Vec::new();
        if let Some(list) = adapters.remove(&name) {
            found.extend(list.into_iter().map(|(i, a)| (i, a, 0)));
        } else if let Some(parts) = stacked_qkv(&name) {
            let rows = t.shape[0] / 3;
            for (k, part) in parts.iter().enumerate() {
                let list = adapters.remove(part).unwrap_or_default();
                found.extend(list.into_iter().map(|(i, a)| (i, a, k * rows)));
            }
        }
        found.sort_by_key(|(i, ..)| *i);
        for (i, adapter, rows_from) in found {
            report.modules_per_file[i] += 1;
            targets
                .entry(t.name.clone())
                .or_default()
                .push(Target { adapter, rows_from });
        }
    }
    targets
}

/// "3 module(s) of the adapter(s) are …, e.g. a, b" for the modules no base weight took, if any.
fn unused_modules(adapters: &HashMap<String, Vec<(usize, Adapter)>>) -> Option<String> {
    if adapters.is_empty() {
        return None;
    }
    let mut names: Vec<&str> = adapters.keys().map(String::as_str).collect();
    names.sort_unstable();
    let shown: Vec<&str> = names.iter().take(4).copied().collect();
    Some(format!(
        "{} adapter module(s) are, e.g. {},",
        names.len(),
        shown.join(", ")
    ))
}

/// The companion scale of an FP8 weight `name` (`….weight` → `….scale_weight` or `….weight_scale`).
fn scale_of<'a>(name: &str, by_name: &HashMap<&str, &'a TensorInfo>) -> Option<&'a TensorInfo> {
    let module = name.strip_suffix(".weight")?;
    [".scale_weight", ".weight_scale"]
        .iter()
        .find_map(|s| by_name.get(format!("{module}{s}").as_str()).copied())
}

/// Streams the base file to a temporary file beside `out` (header copied, adapted weights rewritten, the rest
/// copied; new FP8 scales written in place at the end), then renames it over `out`.
fn write_merged(
    base: &Path,
    out: &Path,
    tensors: &[TensorInfo],
    targets: &HashMap<String, Vec<Target>>,
    report: &mut MergeReport,
) -> Result<()> {
    let tmp = temporary_beside(out)?;
    let result = (|| -> Result<()> {
        let mut src =
            open_regular(base).with_context(|| format!("cannot open {}", base.display()))?;
        let mut dst = BufWriter::new(
            File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?,
        );
        let mut order: Vec<&TensorInfo> = tensors.iter().collect();
        order.sort_by_key(|t| t.data_start);
        let header_end = order.first().map_or(0, |t| t.data_start);
        copy_span(&mut src, &mut dst, 0, header_end)?;
        let by_name: HashMap<&str, &TensorInfo> =
            tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut new_scales: Vec<(u64, Vec<u8>)> = Vec::new();
        for t in order {
            let Some(list) = targets.get(&t.name) else {
                copy_span(&mut src, &mut dst, t.data_start, t.len_bytes)?;
                continue;
            };
            let bytes = read_span(&mut src, t)?;
            let scale = scale_of(&t.name, &by_name);
            let merged = merge_tensor(t, bytes, scale, &mut src, list)
                .with_context(|| format!("cannot merge into `{}`", t.name))?;
            dst.write_all(&merged.weight)?;
            report.weights += 1;
            report.fp8_weights += usize::from(t.dtype == "F8_E4M3");
            if let (Some(scale_bytes), Some(s)) = (merged.scale, scale) {
                new_scales.push((s.data_start, scale_bytes));
            }
        }
        let mut file = dst.into_inner().map_err(|e| e.into_error())?;
        for (at, bytes) in new_scales {
            file.seek(SeekFrom::Start(at))?;
            file.write_all(&bytes)?;
        }
        file.sync_all()?;
        Ok(())
    })();
    let result = result
        .and_then(|()| fs::rename(&tmp, out).map_err(anyhow::Error::from))
        .with_context(|| format!("cannot write the merged model {}", out.display()));
    if result.is_err() {
        // Best effort: the temporary file may not exist if creating it failed.
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn temporary_beside(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("the output path names no file: {}", out.display()))?;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Created now so that a missing folder is said before any work.
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .with_context(|| {
            format!(
                "cannot write next to the output (does its folder exist?): {}",
                out.display()
            )
        })?;
    Ok(tmp)
}

fn copy_span(src: &mut File, dst: &mut impl Write, from: u64, len: u64) -> Result<()> {
    src.seek(SeekFrom::Start(from))?;
    let copied = std::io::copy(&mut src.take(len), dst)?;
    if copied != len {
        bail!("the base file ended early (it changed while being read?)");
    }
    Ok(())
}

fn read_span(src: &mut File, t: &TensorInfo) -> Result<Vec<u8>> {
    src.seek(SeekFrom::Start(t.data_start))?;
    let mut bytes = vec![0u8; usize::try_from(t.len_bytes)?];
    src.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// A merged weight's bytes, and for FP8 its new scales' bytes (in the file's scale dtype and shape).
struct Merged {
    weight: Vec<u8>,
    scale: Option<Vec<u8>>,
}

fn merge_tensor(
    t: &TensorInfo,
    bytes: Vec<u8>,
    scale: Option<&TensorInfo>,
    src: &mut File,
    targets: &[Target],
) -> Result<Merged> {
    let dims = (t.shape[0], t.shape[1]);
    match t.dtype.as_str() {
        "BF16" | "F16" | "F32" => {
            let dtype = match t.dtype.as_str() {
                "BF16" => DType::BF16,
                "F16" => DType::F16,
                _ => DType::F32,
            };
            let w = Tensor::from_raw_buffer(&bytes, dtype, &[dims.0, dims.1], &Device::Cpu)?;
            let merged = apply(&w, targets)?.to_dtype(dtype)?;
            Ok(Merged {
                weight: framesmith_nn::bytes::tensor_bytes(&merged)?,
                scale: None,
            })
        }
        "F8_E4M3" => {
            let scale = match scale {
                Some(s) => Some((read_span(src, s)?, s.dtype.as_str(), s.shape.as_slice())),
                None => None,
            };
            let parts = Fp8Parts::read(bytes, dims, scale)?;
            let merged = apply(&parts.dequantize()?, targets)?;
            let (weight, scale) = requantize(&merged, &parts)?;
            Ok(Merged { weight, scale })
        }
        other => bail!(
            "weights stored as {other} cannot be merged into (bf16, f16, f32 or float8_e4m3fn with its scales)"
        ),
    }
}

/// The weight `w` with each target folded into its rows, in order, as f32.
fn apply(w: &Tensor, targets: &[Target]) -> Result<Tensor> {
    let mut w = w.to_dtype(DType::F32)?;
    for target in targets {
        let rows = target.adapter.out_dim();
        let (out_dim, _) = w.dims2()?;
        if target.rows_from == 0 && rows == out_dim {
            w = target.adapter.merged_weight(&w)?;
            continue;
        }
        let part = target
            .adapter
            .merged_weight(&w.narrow(0, target.rows_from, rows)?)?;
        let after = out_dim - target.rows_from - rows;
        let mut pieces = Vec::with_capacity(3);
        if target.rows_from > 0 {
            pieces.push(w.narrow(0, 0, target.rows_from)?);
        }
        pieces.push(part);
        if after > 0 {
            pieces.push(w.narrow(0, target.rows_from + rows, after)?);
        }
        w = Tensor::cat(&pieces, 0)?;
    }
    Ok(w)
}
