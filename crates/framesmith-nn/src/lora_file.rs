//! LoRA files. Writing uses musubi-tuner's (and sd-scripts') layout (`lora_unet_blocks_0_self_attn_q.lora_down.weight`,
//! `lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight`, `.alpha`) with caller-given string metadata, to a
//! temporary file that is fsynced and then renamed, so a crash never leaves a half-written LoRA. Reading accepts
//! that layout and the ComfyUI / PEFT-style one with official module names
//! (`diffusion_model.blocks.0.self_attn.q.lora_A.weight`, `lora_B`; prefix `diffusion_model.`,
//! `model.diffusion_model.` or `transformer.`, or none), SimpleTuner's `lycoris_` names as ComfyUI reads them,
//! and FLUX.1 LoRAs named after diffusers' transformer (`transformer.transformer_blocks.0.attn.to_q.lora_A.weight`),
//! fused onto the official modules — unless the names are Qwen-Image's, whose official names are diffusers' own.
//! LoKr, LoHa and DoRA modules are written and read in the layout ComfyUI loads (`kinds.rs`). A diffusers / PEFT
//! file's alphas come from its `lora_adapter_metadata` header entry (`peft.rs`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};

use super::linear::Linear;
use super::lora::{
    Lora, FLUX_DOUBLE_BLOCK_LINEARS, FLUX_SINGLE_BLOCK_LINEARS, QWEN_IMAGE_BLOCK_LINEARS,
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
    /// The plain LoRA modules.
    pub modules: Vec<LoadedLora>,
    /// The LoKr, LoHa and DoRA modules (in natural name order).
    pub adapters: Vec<LoadedAdapter>,
    pub metadata: HashMap<String, String>,
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
                Part::Kind(suffix) => entry.others.push((suffix.to_string(), tensor)),
            }
        }
        let mut modules = Vec::with_capacity(parts.len());
        let mut adapters = Vec::new();
        for (name, p) in parts {
            if !p.others.is_empty() {
                adapters.push(kind_module(name, p, path)?);
                continue;
            }
            let incomplete = |missing| LoraFileError::Incomplete {
                name: name.clone(),
                missing,
                path: path.to_path_buf(),
            };
            let down = p.down.ok_or_else(|| incomplete("lora_down / lora_A"))?;
            let up = p.up.ok_or_else(|| incomplete("lora_up / lora_B"))?;
            let rank = down.dims().first().copied().unwrap_or(0);
            let dotted_path = p.path.as_deref().filter(|_| dotted.contains(&name));
            modules.push(LoadedLora {
                alpha: module_alpha(p.alpha, dotted_path, &metadata, rank),
                name,
                path: p.path,
                down,
                up,
            });
        }
        let mut modules = flux_diffusers::to_official(modules, &dotted, path)?;
        let order =
            |a: &str, b: &str| super::lora::natural_cmp(&a.replace('_', "."), &b.replace('_', "."));
        modules.sort_by(|a, b| order(&a.name, &b.name));
        adapters.sort_by(|a, b| order(&a.name, &b.name));
        Ok(Self {
            modules,
            adapters,
            metadata,
        })
    }

    /// Refuses a file (read from `path`) holding a NaN or infinite value, naming the first such tensor in
    /// musubi-tuner's name (`lora_unet_blocks_0_self_attn_q.lora_up.weight`).
    pub fn check_finite(&self, path: &Path) -> FileResult<()> {
        let plain = self.modules.iter().map(|m| {
            let tensors = vec![("lora_down.weight", &m.down), ("lora_up.weight", &m.up)];
            (&m.name, Some(m.alpha), tensors)
        });
        let others = self.adapters.iter().map(|m| {
            let tensors = m.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
            (&m.name, m.alpha, tensors)
        });
        for (name, alpha, tensors) in plain.chain(others) {
            let alpha = alpha
                .filter(|a| !a.is_finite())
                .map(|_| format!("{name}.alpha"));
            let tensor = tensors
                .into_iter()
                .find_map(|(suffix, t)| {
                    let finite = t
                        .flatten_all()
                        .and_then(|t| t.to_dtype(DType::F32))
                        .and_then(|t| t.to_vec1::<f32>())
                        .map(|v| v.iter().all(|x| x.is_finite()));
                    match finite {
                        Ok(true) => None,
                        Ok(false) => Some(Ok(format!("{name}.{suffix}"))),
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

    /// The plain LoRA module with musubi-tuner name `name` (`lora_unet_blocks_0_self_attn_q`).
    pub fn get(&self, name: &str) -> Option<&LoadedLora> {
        self.modules.iter().find(|m| m.name == name)
    }

    /// The LoKr, LoHa or DoRA module with musubi-tuner name `name`.
    pub fn adapter(&self, name: &str) -> Option<&LoadedAdapter> {
        self.adapters.iter().find(|m| m.name == name)
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
            .map(|m| m.name.as_str())
            .chain(self.adapters.iter().map(|m| m.name.as_str()))
            .filter(|name| !layers.contains_key(*name))
            .collect();
        if !missing.is_empty() {
            return Err(not_in_model(&missing));
        }
        for m in &self.modules {
            if let Some(layer) = layers.get(&m.name) {
                check_shapes(m, layer.in_dim(), layer.out_dim(), None)?;
            }
        }
        for m in &self.adapters {
            if let Some(layer) = layers.get(&m.name) {
                kinds::check_fits(m, &m.adapter(&Device::Cpu)?, layer)?;
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
        for m in &self.adapters {
            if let Some(layer) = layers.get_mut(&m.name) {
                kinds::attach(m, layer, multiplier, dtype)?;
            }
        }
        Ok(self.modules.len() + self.adapters.len())
    }
}

/// A plain module's alpha: the file's tensor, else (for a module named by its dotted `path`) what a diffusers /
/// PEFT file's metadata says, else the rank (scale 1, as ComfyUI and diffusers read such files).
fn module_alpha(
    alpha: Option<f64>,
    path: Option<&str>,
    metadata: &HashMap<String, String>,
    rank: usize,
) -> f64 {
    alpha
        .or_else(|| peft::peft_alpha(metadata, path?))
        .unwrap_or(rank as f64)
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
    /// LoKr / LoHa / DoRA tensors by name after the module.
    others: Vec<(String, Tensor)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Down,
    Up,
    Alpha,
    /// A LoKr, LoHa or DoRA tensor (its name after the module).
    Kind(&'static str),
}

/// A module with LoKr, LoHa or DoRA tensors, checked to make an adapter.
fn kind_module(name: String, p: Parts, path: &Path) -> FileResult<LoadedAdapter> {
    let mut tensors = p.others;
    for (suffix, t) in [("lora_down.weight", p.down), ("lora_up.weight", p.up)] {
        if let Some(t) = t {
            tensors.push((suffix.to_string(), t));
        }
    }
    let loaded = LoadedAdapter {
        name,
        path: p.path,
        tensors,
        alpha: p.alpha,
    };
    loaded
        .adapter(&Device::Cpu)
        .map_err(|e| LoraFileError::UnsupportedKey {
            key: loaded.name.clone(),
            reason: e.to_string(),
            path: path.to_path_buf(),
        })?;
    Ok(loaded)
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
    for suffix in kinds::KIND_SUFFIXES {
        if let Some(module) = key.strip_suffix(suffix).and_then(|m| m.strip_suffix('.')) {
            return Ok((module, Part::Kind(suffix)));
        }
    }
    let reason = if key.ends_with(".diff") || key.ends_with(".diff_b") {
        "full weight differences are not supported"
    } else if key.contains("hada_t") || key.contains("lokr_t") {
        "LyCORIS Tucker factors (convolutions) are not supported"
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

/// The module path of a musubi-tuner module name (`lora_unet_blocks_3_cross_attn_k_img` →
/// `blocks.3.cross_attn.k_img`) for the Wan, FLUX.1 and Qwen-Image block linears; `None` elsewhere (underscores
/// are ambiguous outside the known linears).
pub fn module_path(musubi: &str) -> Option<String> {
    block_path(musubi.strip_prefix(MUSUBI_PREFIX)?)
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
mod kinds;
mod peft;
mod raw;
mod set;
pub use set::SaveLayout;
mod sorted_write;

pub use flux_diffusers::{
    diffusers_parts as flux_diffusers_parts, official as flux_official_module,
};
pub use kinds::LoadedAdapter;
pub use peft::{peft_alpha, PEFT_METADATA_KEY};
pub use raw::RawTensors;
#[cfg(test)]
mod tests;
