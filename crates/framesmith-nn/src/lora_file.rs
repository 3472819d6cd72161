//! LoRA files. Writing uses musubi-tuner's (and sd-scripts') layout (`lora_unet_blocks_0_self_attn_q.lora_down.weight`,
//! `lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight`, `.alpha`) with caller-given string metadata, to a
//! temporary file that is fsynced and then renamed, so a crash never leaves a half-written LoRA. Reading accepts
//! that layout and the ComfyUI / PEFT-style one with official module names
//! (`diffusion_model.blocks.0.self_attn.q.lora_A.weight`, `lora_B`; prefix `diffusion_model.`,
//! `model.diffusion_model.` or `transformer.`, or none), SimpleTuner's `lycoris_` names as ComfyUI reads them,
//! and FLUX.1 LoRAs named after diffusers' transformer (`transformer.transformer_blocks.0.attn.to_q.lora_A.weight`),
//! fused onto the official modules — unless the names are Qwen-Image's, whose official names are diffusers' own.

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};

use super::linear::Linear;
use super::lora::{
    Lora, LoraSet, FLUX_DOUBLE_BLOCK_LINEARS, FLUX_SINGLE_BLOCK_LINEARS, QWEN_IMAGE_BLOCK_LINEARS,
    WAN_BLOCK_LINEARS,
};

/// The key prefix musubi-tuner gives DiT modules.
pub const MUSUBI_PREFIX: &str = "lora_unet_";

/// musubi-tuner's module name for a module path: `blocks.0.ffn.0` → `lora_unet_blocks_0_ffn_0`.
pub fn musubi_name(module_path: &str) -> String {
    format!("{MUSUBI_PREFIX}{}", module_path.replace('.', "_"))
}

/// Errors reading, writing or applying LoRA files. File paths come last in messages.
#[derive(Debug, thiserror::Error)]
pub enum LoraFileError {
    #[error("cannot {action} the LoRA file: {source}: {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a readable safetensors file ({reason}): {path}")]
    Format { reason: String, path: PathBuf },
    #[error("LoRA tensor `{key}` holds NaN or infinite values, so nothing was written: {path}")]
    NonFinite { key: String, path: PathBuf },
    #[error("LoRA tensor `{key}` in the file holds NaN or infinite values: {path}")]
    NonFiniteInFile { key: String, path: PathBuf },
    #[error("unsupported tensor `{key}` in the LoRA file ({reason}): {path}")]
    UnsupportedKey {
        key: String,
        reason: String,
        path: PathBuf,
    },
    #[error("LoRA module `{name}` has no {missing} tensor: {path}")]
    Incomplete {
        name: String,
        missing: &'static str,
        path: PathBuf,
    },
    #[error("{count} LoRA module(s) in the file do not exist in this model, e.g. {names} (is it a LoRA for another model or variant?)")]
    NotInModel { count: usize, names: String },
    #[error("LoRA module `{name}` does not fit the model: {reason}")]
    ShapeMismatch { name: String, reason: String },
    #[error("LoRA modules can be saved as f32, bf16 or f16, not {0:?}")]
    SaveDtype(DType),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

type FileResult<T> = std::result::Result<T, LoraFileError>;

/// One module read from a LoRA file.
#[derive(Clone, Debug)]
pub struct LoadedLora {
    /// musubi-tuner's name, `lora_unet_…`, whatever layout the file used.
    pub name: String,
    /// The module path (`blocks.0.self_attn.q`): given by dotted layouts, recovered for Wan and FLUX.1 block
    /// linears from musubi names (underscores are ambiguous elsewhere).
    pub path: Option<String>,
    /// `[rank, in]`, dtype as stored.
    pub down: Tensor,
    /// `[out, rank]`, dtype as stored.
    pub up: Tensor,
    /// From the file, or the rank when the file has none (scale 1, as ComfyUI reads such files).
    pub alpha: f64,
}

/// A LoRA file's modules (in natural name order) and metadata.
#[derive(Clone, Debug, Default)]
pub struct LoraFile {
    pub modules: Vec<LoadedLora>,
    pub metadata: HashMap<String, String>,
}

impl LoraSet {
    /// Writes the adapters with musubi-tuner's keys, tensors in `dtype` (f32, bf16 or f16; `alpha` always an f32
    /// scalar) and `metadata` in the header. Refuses to write NaN or infinite values; an existing file at
    /// `path` is replaced only once the new one is complete on disk.
    pub fn save(
        &self,
        path: &Path,
        dtype: DType,
        metadata: &HashMap<String, String>,
    ) -> FileResult<()> {
        let st_dtype = match dtype {
            DType::F32 => StDtype::F32,
            DType::BF16 => StDtype::BF16,
            DType::F16 => StDtype::F16,
            other => return Err(LoraFileError::SaveDtype(other)),
        };
        let mut entries: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (module_path, lora) in self.iter() {
            let name = musubi_name(module_path);
            for (suffix, var) in [
                ("lora_down.weight", &lora.down),
                ("lora_up.weight", &lora.up),
            ] {
                let key = format!("{name}.{suffix}");
                let t = var.as_tensor().to_device(&Device::Cpu)?.to_dtype(dtype)?;
                let bytes = tensor_bytes(&t)?.ok_or_else(|| LoraFileError::NonFinite {
                    key: key.clone(),
                    path: path.to_path_buf(),
                })?;
                entries.push((key, st_dtype, t.dims().to_vec(), bytes));
            }
            if !lora.alpha.is_finite() {
                return Err(LoraFileError::NonFinite {
                    key: format!("{name}.alpha"),
                    path: path.to_path_buf(),
                });
            }
            let alpha = (lora.alpha as f32).to_le_bytes().to_vec();
            entries.push((format!("{name}.alpha"), StDtype::F32, vec![], alpha));
        }
        for (key, dt, shape, bytes) in &entries {
            // The sizes must agree before the header promises them.
            TensorView::new(*dt, shape.clone(), bytes).map_err(|e| LoraFileError::Format {
                reason: format!("tensor `{key}`: {e}"),
                path: path.to_path_buf(),
            })?;
        }
        write_atomically(path, |tmp| {
            sorted_write::write_sorted(tmp, &entries, metadata).map_err(|source| {
                LoraFileError::Io {
                    action: "write",
                    path: path.to_path_buf(),
                    source,
                }
            })
        })
    }

    /// Copies a file's weights into these adapters' variables (resuming or continuing training); the layers
    /// share the variables, so they see the new values. The file must hold exactly these modules with the same
    /// shapes and alphas.
    pub fn load_weights(&self, file: &LoraFile) -> FileResult<()> {
        let ours: Vec<String> = self.iter().map(|(p, _)| musubi_name(p)).collect();
        let extra: Vec<&str> = file
            .modules
            .iter()
            .filter(|m| !ours.contains(&m.name))
            .map(|m| m.name.as_str())
            .collect();
        if !extra.is_empty() {
            return Err(not_in_model(&extra));
        }
        let mismatch = |name: &str, reason: String| LoraFileError::ShapeMismatch {
            name: name.to_string(),
            reason,
        };
        let mut pairs = Vec::with_capacity(ours.len());
        for ((_, lora), name) in self.iter().zip(&ours) {
            let m = file.get(name).ok_or_else(|| {
                mismatch(name, "the file has no weights for this module".to_string())
            })?;
            check_shapes(m, lora.in_dim(), lora.out_dim(), Some(lora.rank()))?;
            if (m.alpha - lora.alpha).abs() > 1e-6 * lora.alpha.abs().max(1.0) {
                let reason = format!("alpha {} in the file, {} configured", m.alpha, lora.alpha);
                return Err(mismatch(name, reason));
            }
            pairs.push((lora, m));
        }
        for (lora, m) in pairs {
            lora.down.set(
                &m.down
                    .to_dtype(lora.down.dtype())?
                    .to_device(lora.down.device())?,
            )?;
            lora.up.set(
                &m.up
                    .to_dtype(lora.up.dtype())?
                    .to_device(lora.up.device())?,
            )?;
        }
        Ok(())
    }
}

/// Little-endian bytes of a CPU f32/bf16/f16 tensor, or `None` when a value is not finite.
fn tensor_bytes(t: &Tensor) -> FileResult<Option<Vec<u8>>> {
    let flat = t.flatten_all()?;
    let all_finite = flat
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?
        .iter()
        .all(|v| v.is_finite());
    if !all_finite {
        return Ok(None);
    }
    if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        return Err(LoraFileError::SaveDtype(t.dtype()));
    }
    let bytes = crate::bytes::tensor_bytes(t)?;
    Ok(Some(bytes))
}

/// Runs `write` on a temporary file next to `path`, fsyncs it, renames it over `path` and fsyncs the folder.
/// On failure the temporary file is removed and `path` is untouched.
fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> FileResult<()>) -> FileResult<()> {
    let io = |action, source| LoraFileError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(file_name) = path.file_name() else {
        return Err(io("write", std::io::Error::other("the path names no file")));
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = write(&tmp).and_then(|()| {
        // Write access: Windows refuses FlushFileBuffers on a read-only handle.
        let file = OpenOptions::new()
            .write(true)
            .open(&tmp)
            .map_err(|e| io("reopen", e))?;
        file.sync_all().map_err(|e| io("flush", e))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|e| io("rename", e))
    });
    if result.is_err() {
        // Best effort: the temporary file may not exist if writing failed early.
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Makes the rename itself durable on Unix; some filesystems reject fsync on folders, and the file's own
    // data is already on disk, so a failure here is not worth failing the save.
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

impl LoraFile {
    /// Reads a LoRA file in musubi-tuner / kohya layout or ComfyUI / diffusers-style layout onto `device`.
    pub fn load(path: &Path, device: &Device) -> FileResult<Self> {
        let bytes =
            crate::file::read_regular(path, u64::MAX).map_err(|source| LoraFileError::Io {
                action: "read",
                path: path.to_path_buf(),
                source,
            })?;
        let format_err = |e: safetensors::SafeTensorError| LoraFileError::Format {
            reason: e.to_string(),
            path: path.to_path_buf(),
        };
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(format_err)?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).map_err(format_err)?;
        let mut parts: HashMap<String, Parts> = HashMap::new();
        // Modules named by their dotted module path (not musubi-tuner's or LyCORIS' underscored names).
        let mut dotted = HashSet::new();
        for (key, view) in st.tensors() {
            let (module, part) =
                split_key(&key).map_err(|reason| LoraFileError::UnsupportedKey {
                    key: key.clone(),
                    reason,
                    path: path.to_path_buf(),
                })?;
            let tensor = tensor_from_view(&view, device).map_err(|reason| {
                LoraFileError::UnsupportedKey {
                    key: key.clone(),
                    reason,
                    path: path.to_path_buf(),
                }
            })?;
            let (name, module_path) = normalize_module(module);
            if is_dotted(module) {
                dotted.insert(name.clone());
            }
            let entry = parts.entry(name).or_insert_with(|| Parts {
                path: module_path,
                ..Parts::default()
            });
            match part {
                Part::Down => entry.down = Some(tensor),
                Part::Up => entry.up = Some(tensor),
                Part::Alpha => entry.alpha = Some(scalar(&tensor)?),
            }
        }
        let mut modules = Vec::with_capacity(parts.len());
        for (name, p) in parts {
            let incomplete = |missing| LoraFileError::Incomplete {
                name: name.clone(),
                missing,
                path: path.to_path_buf(),
            };
            let down = p.down.ok_or_else(|| incomplete("lora_down / lora_A"))?;
            let up = p.up.ok_or_else(|| incomplete("lora_up / lora_B"))?;
            let rank = down.dims().first().copied().unwrap_or(0);
            modules.push(LoadedLora {
                alpha: p.alpha.unwrap_or(rank as f64),
                name,
                path: p.path,
                down,
                up,
            });
        }
        let mut modules = flux_diffusers::to_official(modules, &dotted, path)?;
        modules.sort_by(|a, b| {
            super::lora::natural_cmp(&a.name.replace('_', "."), &b.name.replace('_', "."))
        });
        Ok(Self { modules, metadata })
    }

    /// Refuses a file (read from `path`) holding a NaN or infinite value, naming the first such tensor in
    /// musubi-tuner's name (`lora_unet_blocks_0_self_attn_q.lora_up.weight`).
    pub fn check_finite(&self, path: &Path) -> FileResult<()> {
        for m in &self.modules {
            let alpha = (!m.alpha.is_finite()).then(|| format!("{}.alpha", m.name));
            let tensor = [("lora_down.weight", &m.down), ("lora_up.weight", &m.up)]
                .into_iter()
                .find_map(|(suffix, t)| {
                    let finite = t
                        .flatten_all()
                        .and_then(|t| t.to_dtype(DType::F32))
                        .and_then(|t| t.to_vec1::<f32>())
                        .map(|v| v.iter().all(|x| x.is_finite()));
                    match finite {
                        Ok(true) => None,
                        Ok(false) => Some(Ok(format!("{}.{suffix}", m.name))),
                        Err(e) => Some(Err(e)),
                    }
                })
                .transpose()?;
            if let Some(key) = alpha.or(tensor) {
                return Err(LoraFileError::NonFiniteInFile {
                    key,
                    path: path.to_path_buf(),
                });
            }
        }
        Ok(())
    }

    /// The module with musubi-tuner name `name` (`lora_unet_blocks_0_self_attn_q`).
    pub fn get(&self, name: &str) -> Option<&LoadedLora> {
        self.modules.iter().find(|m| m.name == name)
    }

    /// Attaches the file's adapters, with `multiplier` and factors converted to `dtype`, to the matching layers
    /// of `modules` (path, layer), replacing their adapters; returns how many were attached. Every module of
    /// the file must exist in `modules` with matching shapes, else nothing is changed and the error names the
    /// first offenders. Layers the file does not mention keep their current adapter.
    pub fn apply<'a, I>(&self, modules: I, multiplier: f64, dtype: DType) -> FileResult<usize>
    where
        I: IntoIterator<Item = (String, &'a mut Linear)>,
    {
        let mut layers: HashMap<String, &mut Linear> = modules
            .into_iter()
            .map(|(p, l)| (musubi_name(&p), l))
            .collect();
        let missing: Vec<&str> = self
            .modules
            .iter()
            .filter(|m| !layers.contains_key(&m.name))
            .map(|m| m.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(not_in_model(&missing));
        }
        for m in &self.modules {
            if let Some(layer) = layers.get(&m.name) {
                check_shapes(m, layer.in_dim(), layer.out_dim(), None)?;
            }
        }
        for m in &self.modules {
            if let Some(layer) = layers.get_mut(&m.name) {
                let device = layer.base().device().clone();
                let down = m.down.to_dtype(dtype)?.to_device(&device)?;
                let up = m.up.to_dtype(dtype)?.to_device(&device)?;
                let mut lora = Lora::from_tensors(&down, &up, m.alpha)?;
                lora.multiplier = multiplier;
                layer.set_lora(Some(lora));
            }
        }
        Ok(self.modules.len())
    }
}

fn not_in_model(names: &[&str]) -> LoraFileError {
    let mut shown: Vec<&str> = names.iter().take(5).copied().collect();
    shown.sort_unstable();
    LoraFileError::NotInModel {
        count: names.len(),
        names: shown.join(", "),
    }
}

fn check_shapes(
    m: &LoadedLora,
    in_dim: usize,
    out_dim: usize,
    rank: Option<usize>,
) -> FileResult<()> {
    let (d, u) = (m.down.dims(), m.up.dims());
    let fits = d.len() == 2
        && u.len() == 2
        && d[1] == in_dim
        && u[0] == out_dim
        && d[0] == u[1]
        && rank.is_none_or(|r| r == d[0]);
    if fits {
        return Ok(());
    }
    let rank_note = rank.map(|r| format!(" rank {r},")).unwrap_or_default();
    Err(LoraFileError::ShapeMismatch {
        name: m.name.clone(),
        reason: format!(
            "down {d:?} and up {u:?} for a layer of{rank_note} in {in_dim}, out {out_dim}"
        ),
    })
}

#[derive(Default)]
struct Parts {
    path: Option<String>,
    down: Option<Tensor>,
    up: Option<Tensor>,
    alpha: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Down,
    Up,
    Alpha,
}

/// Splits a key into its module and tensor kind, or says why it is not a supported LoRA tensor.
fn split_key(key: &str) -> std::result::Result<(&str, Part), String> {
    const SUFFIXES: [(&str, Part); 5] = [
        (".lora_down.weight", Part::Down),
        (".lora_up.weight", Part::Up),
        (".lora_A.weight", Part::Down),
        (".lora_B.weight", Part::Up),
        (".alpha", Part::Alpha),
    ];
    for (suffix, part) in SUFFIXES {
        if let Some(module) = key.strip_suffix(suffix) {
            return Ok((module, part));
        }
    }
    let reason = if key.ends_with(".dora_scale") {
        "DoRA adapters are not supported"
    } else if key.ends_with(".diff") || key.ends_with(".diff_b") {
        "full weight differences are not supported"
    } else if key.contains("hada_") || key.contains("lokr_") {
        "LyCORIS LoHa/LoKr adapters are not supported"
    } else {
        "not a LoRA tensor: expected .lora_down/.lora_up/.lora_A/.lora_B weights and .alpha"
    };
    Err(reason.to_string())
}

/// The prefix of SimpleTuner's LyCORIS-style names, which ComfyUI reads as musubi-tuner's
/// (`lycoris_transformer_blocks_0_attn_to_q`).
const LYCORIS_PREFIX: &str = "lycoris_";

/// Whether a key's module part is a dotted module path rather than an underscored name.
fn is_dotted(module: &str) -> bool {
    !module.starts_with(MUSUBI_PREFIX) && !module.starts_with(LYCORIS_PREFIX)
}

/// musubi name and, where known, module path of a key's module part.
fn normalize_module(module: &str) -> (String, Option<String>) {
    if let Some(rest) = module.strip_prefix(MUSUBI_PREFIX) {
        return (module.to_string(), block_path(rest));
    }
    if let Some(rest) = module.strip_prefix(LYCORIS_PREFIX) {
        return (format!("{MUSUBI_PREFIX}{rest}"), block_path(rest));
    }
    let path = ["model.diffusion_model.", "diffusion_model.", "transformer."]
        .iter()
        .find_map(|p| module.strip_prefix(p))
        .unwrap_or(module);
    (musubi_name(path), Some(path.to_string()))
}

/// `blocks_3_cross_attn_k_img` → `blocks.3.cross_attn.k_img` for the Wan block linears,
/// `double_blocks_0_img_mlp_0` → `double_blocks.0.img_mlp.0` and `single_blocks_5_linear1` →
/// `single_blocks.5.linear1` for the FLUX.1 ones, `transformer_blocks_0_img_mlp_net_0_proj` →
/// `transformer_blocks.0.img_mlp.net.0.proj` for Qwen-Image's.
fn block_path(underscored: &str) -> Option<String> {
    let lists: [(&str, &[&str]); 4] = [
        ("double_blocks", &FLUX_DOUBLE_BLOCK_LINEARS),
        ("single_blocks", &FLUX_SINGLE_BLOCK_LINEARS),
        ("transformer_blocks", &QWEN_IMAGE_BLOCK_LINEARS),
        ("blocks", &WAN_BLOCK_LINEARS),
    ];
    lists.into_iter().find_map(|(list, linears)| {
        let rest = underscored.strip_prefix(list)?.strip_prefix('_')?;
        let (index, linear) = rest.split_once('_')?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        linears
            .iter()
            .find(|l| l.replace('.', "_") == linear)
            .map(|l| format!("{list}.{index}.{l}"))
    })
}

fn tensor_from_view(view: &TensorView<'_>, device: &Device) -> std::result::Result<Tensor, String> {
    let dtype = match view.dtype() {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F64 => DType::F64,
        other => {
            return Err(format!(
                "dtype {other:?}; LoRA tensors must be f32, f16, bf16 or f64"
            ))
        }
    };
    Tensor::from_raw_buffer(view.data(), dtype, view.shape(), device).map_err(|e| e.to_string())
}

fn scalar(t: &Tensor) -> FileResult<f64> {
    let values = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    match values.as_slice() {
        [v] => Ok(*v),
        _ => Err(candle_core::Error::msg(format!(
            "alpha has shape {:?}, expected a scalar",
            t.dims()
        ))
        .into()),
    }
}

mod flux_diffusers;
mod sorted_write;
#[cfg(test)]
mod tests;
