//! Test helpers: small safetensors files written byte by byte (official key sets of tiny Wan DiTs, prefixes, FP8
//! with scales, shards, damage), so every layout and every failure can be made in a temporary folder.

use std::path::{Path, PathBuf};

use super::keys::official_shapes;
use crate::wan::WanConfig;

/// A temporary folder, in memory (`/dev/shm`) where there is one: the fuzz tests write thousands of small files,
/// which on a busy disk costs tens of seconds.
pub(crate) fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return Ok(dir);
        }
    }
    tempfile::tempdir()
}

/// One tensor to write.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
}

impl Spec {
    pub fn new(name: &str, dtype: &'static str, shape: &[usize]) -> Self {
        Self {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
        }
    }
}

/// The official tensors of `cfg`, all in `dtype`.
pub(crate) fn dit_specs(cfg: &WanConfig, dtype: &'static str) -> Vec<Spec> {
    official_shapes(cfg)
        .into_iter()
        .map(|(name, shape)| Spec { name, dtype, shape })
        .collect()
}

/// The value written at element `k` of every F32 tensor (small, exact in f16/bf16 too).
pub(crate) fn value_at(k: usize) -> f32 {
    ((k % 13) as f32 - 6.0) * 0.125
}

fn data_bytes(dtype: &str, numel: usize) -> Vec<u8> {
    match dtype {
        "F32" => (0..numel).flat_map(|k| value_at(k).to_le_bytes()).collect(),
        "F16" => (0..numel)
            .flat_map(|k| half::f16::from_f32(value_at(k)).to_le_bytes())
            .collect(),
        "BF16" => (0..numel)
            .flat_map(|k| half::bf16::from_f32(value_at(k)).to_le_bytes())
            .collect(),
        other => {
            let bits = super::header::dtype_bits(other).unwrap_or(8) as usize;
            // Small non-NaN FP8 codes (0x00, 0x08, … 0x20), zeros for wider types.
            let bytes = (numel * bits).div_ceil(8);
            (0..bytes)
                .map(|k| if bits == 8 { ((k % 5) << 3) as u8 } else { 0 })
                .collect()
        }
    }
}

/// The bytes of a safetensors file holding `specs` (in that data order) and `metadata`.
pub(crate) fn safetensors_bytes(specs: &[Spec], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for spec in specs {
        let numel: usize = spec.shape.iter().product();
        let bytes = data_bytes(spec.dtype, numel);
        let begin = data.len();
        data.extend_from_slice(&bytes);
        header.insert(
            spec.name.clone(),
            serde_json::json!({"dtype": spec.dtype, "shape": spec.shape, "data_offsets": [begin, data.len()]}),
        );
    }
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(meta));
    }
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&data);
    out
}

/// Writes `specs` as one safetensors file.
pub(crate) fn write(path: &Path, specs: &[Spec]) -> std::io::Result<PathBuf> {
    std::fs::write(path, safetensors_bytes(specs, &[]))?;
    Ok(path.to_path_buf())
}

/// Writes `specs` as `diffusion_pytorch_model-0000N-of-0000M.safetensors` shards, with the official index when
/// `index` is set. Returns the shard paths.
pub(crate) fn write_sharded(
    dir: &Path,
    specs: &[Spec],
    shards: usize,
    index: bool,
) -> std::io::Result<Vec<PathBuf>> {
    let per = specs.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    let mut paths = Vec::new();
    for (i, chunk) in specs.chunks(per).enumerate() {
        let name = format!(
            "diffusion_pytorch_model-{:05}-of-{shards:05}.safetensors",
            i + 1
        );
        for spec in chunk {
            weight_map.insert(spec.name.clone(), serde_json::Value::String(name.clone()));
        }
        paths.push(write(&dir.join(&name), chunk)?);
    }
    if index {
        let json = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(
            dir.join("diffusion_pytorch_model.safetensors.index.json"),
            json.to_string(),
        )?;
    }
    Ok(paths)
}

/// Puts `prefix` before every name.
pub(crate) fn prefixed(specs: &[Spec], prefix: &str) -> Vec<Spec> {
    specs
        .iter()
        .map(|s| Spec {
            name: format!("{prefix}{}", s.name),
            ..s.clone()
        })
        .collect()
}

/// How the FP8 copy of a checkpoint scales its weights.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scales {
    /// `scale_weight` of shape [] per weight, plus ComfyUI's `scaled_fp8` marker.
    ComfyTensor,
    /// `weight_scale` of shape [out, 1].
    ChannelWeightScale,
    /// `scale_weight` of shape [out, in / block, 1].
    Block(usize),
    /// No scales.
    None,
}

/// Converts the 2-D `.weight` tensors inside `blocks` to FP8 e4m3 and adds their scales.
pub(crate) fn fp8(specs: &[Spec], scales: Scales) -> Vec<Spec> {
    let mut out = Vec::new();
    for s in specs {
        let module = s
            .name
            .strip_suffix(".weight")
            .filter(|_| s.shape.len() == 2 && s.name.starts_with("blocks."));
        let Some(module) = module else {
            out.push(s.clone());
            continue;
        };
        out.push(Spec {
            dtype: "F8_E4M3",
            ..s.clone()
        });
        let (o, i) = (s.shape[0], s.shape[1]);
        match scales {
            Scales::ComfyTensor => {
                out.push(Spec::new(&format!("{module}.scale_weight"), "F32", &[]))
            }
            Scales::ChannelWeightScale => {
                out.push(Spec::new(&format!("{module}.weight_scale"), "F32", &[o, 1]))
            }
            Scales::Block(b) => out.push(Spec::new(
                &format!("{module}.scale_weight"),
                "F32",
                &[o, i / b, 1],
            )),
            Scales::None => {}
        }
    }
    if matches!(scales, Scales::ComfyTensor) {
        out.push(Spec::new("scaled_fp8", "F8_E4M3", &[0]));
    }
    out
}
