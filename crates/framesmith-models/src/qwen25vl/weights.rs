//! Says what a Qwen2.5-VL text-encoder file is, from safetensors headers only, and builds the language model from
//! it. Layouts: ComfyUI's single files (`qwen_2.5_vl_7b.safetensors`, `qwen_2.5_vl_7b_fp8_scaled.safetensors`:
//! `model.layers.*` and `visual.*`), a Hugging Face / diffusers folder (`text_encoder/` of Qwen/Qwen-Image,
//! `text_encoder/llm/` of HunyuanVideo 1.5, Qwen2.5-VL-7B-Instruct itself: sharded, `model.language_model.*` in
//! transformers 5, `model.*` before), or the text model's names bare. The vision tower and `lm_head` are not read.
//! FP8 files (plain e4m3, or `scaled_fp8` with `scale_weight`) stay FP8 when the run keeps FP8 bases.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::model::{LayerPlacement, Qwen25VlText};
use super::Qwen25VlTextConfig;
use crate::checkpoint::mapped_vb;
use crate::wan::weights::{read_header, write_size_lines, ModelFormatError, TensorInfo};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::vb::WEIGHT_SCALE_KEYS;

/// Prefixes of the language model's names, most specific first.
const PREFIXES: [&str; 3] = ["model.language_model.", "model.", ""];
/// Prefixes of the vision tower's names.
pub(super) const VISION: [&str; 2] = ["visual.", "model.visual."];
/// The tensor every layout has, under its prefix.
const PROBE: &str = "layers.0.self_attn.q_proj.bias";
/// What to download instead of a wrong file.
const PICK: &str = "pick qwen_2.5_vl_7b.safetensors (or qwen_2.5_vl_7b_fp8_scaled.safetensors) from \
    Comfy-Org/Qwen-Image_ComfyUI split_files/text_encoders, or the text_encoder/ folder of Qwen/Qwen-Image";
/// What to download for Qwen-Image-Edit when a file lacks the vision tower.
const PICK_VISION: &str = "pick qwen_2.5_vl_7b.safetensors (or qwen_2.5_vl_7b_fp8_scaled.safetensors) from \
    Comfy-Org/Qwen-Image_ComfyUI split_files/text_encoders, or the text_encoder/ folder of Qwen/Qwen-Image-Edit";
/// Head width of every released Qwen2.5 model (a single file's shapes give heads × head width only).
const HEAD_DIM: usize = 128;

/// Why a path is not a Qwen2.5-VL text encoder Framesmith can use.
#[derive(Debug, thiserror::Error)]
pub enum Qwen25VlFormatError {
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// Not a Qwen2.5-VL language model (another family's file): other readers may name it.
    #[error("this is not a Qwen2.5-VL text encoder (no `{PROBE}` under `model.language_model.`, `model.` or bare); {PICK}: {}", path.display())]
    NotQwen25Vl { path: PathBuf },

    /// Its tensors, but not all of them (one shard of a folder, a damaged file).
    #[error("this Qwen2.5-VL text encoder is incomplete: {problem}; {fix}: {}", path.display())]
    Incomplete {
        problem: String,
        fix: &'static str,
        path: PathBuf,
    },

    /// A Qwen2.5-VL language model of another size than the 7B one Qwen-Image and HunyuanVideo 1.5 use.
    #[error("this is a Qwen2.5-VL-style language model of width {hidden} with {layers} layers, not Qwen2.5-VL-7B; {PICK}: {}", path.display())]
    WrongSize {
        hidden: usize,
        layers: usize,
        path: PathBuf,
    },

    /// A text encoder without the vision tower, which Qwen-Image-Edit's prompt encoding needs.
    #[error("this Qwen2.5-VL text encoder has no vision tower (no `visual.*` tensors), which Qwen-Image-Edit needs to \
        encode its condition images; {PICK_VISION}: {}", path.display())]
    NoVisionTower { path: PathBuf },

    /// The model could not be built from the tensors (a tensor missing or misshapen, a bad config.json).
    #[error("cannot build the Qwen2.5-VL text encoder from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// Whether `err` only says the path is something else (so a caller trying other families goes on).
pub fn is_unrecognised(err: &Qwen25VlFormatError) -> bool {
    matches!(
        err,
        Qwen25VlFormatError::NotQwen25Vl { .. } | Qwen25VlFormatError::File(_)
    )
}

/// How the tensors are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// One safetensors file.
    SingleFile,
    /// A Hugging Face / diffusers folder: `config.json` and this many shards.
    Folder { shards: usize },
}

/// What [`identify`] found.
#[derive(Debug, Clone)]
pub struct Qwen25VlFile {
    pub path: PathBuf,
    pub config: Qwen25VlTextConfig,
    pub layout: Layout,
    /// The language model's key prefix.
    pub prefix: &'static str,
    /// Number of vision-tower tensors (not used for text encoding).
    pub vision_tensors: usize,
    /// Number of tensors per dtype (safetensors spelling), whole file.
    pub dtypes: BTreeMap<String, usize>,
    /// FP8 weights stored with their scales (`scaled_fp8`, `scale_weight` / `weight_scale`).
    pub scaled_fp8: bool,
    /// Parameters of the language model alone.
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
}

/// The safetensors files at a path and their tensors.
pub(super) struct Scan {
    pub(super) files: Vec<PathBuf>,
    pub(super) tensors: Vec<(usize, TensorInfo)>,
    bytes_on_disk: u64,
    layout: Layout,
    pub(super) folder_config: Option<String>,
}

/// The folder whose `config.json` is Qwen2.5-VL's: `path` itself, or with `within` also its `text_encoder/`
/// (Qwen-Image) or `text_encoder/llm/` (HunyuanVideo 1.5).
fn hf_folder(path: &Path, within: bool) -> Option<(PathBuf, String)> {
    let nested = [path.join("text_encoder"), path.join("text_encoder/llm")];
    std::iter::once(path.to_path_buf())
        .chain(nested.into_iter().filter(|_| within))
        .find_map(|dir| {
            let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            let qwen = json["model_type"] == "qwen2_5_vl"
                || json["model_type"] == "qwen2_5_vl_text"
                || json["architectures"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|x| x.as_str().is_some_and(|s| s.starts_with("Qwen2_5_VL")))
                });
            qwen.then_some((dir, text))
        })
}

/// Reads the headers at `path`: one file, or a folder's shards (with `within`, also the text encoder's folder
/// inside a pipeline's folder).
pub(super) fn scan(path: &Path, within: bool) -> Result<Scan, Qwen25VlFormatError> {
    if !path.is_dir() {
        let header = read_header(path)?;
        return Ok(Scan {
            files: vec![path.to_path_buf()],
            tensors: header.tensors.into_iter().map(|t| (0, t)).collect(),
            bytes_on_disk: header.file_bytes,
            layout: Layout::SingleFile,
            folder_config: None,
        });
    }
    let not_qwen = || Qwen25VlFormatError::NotQwen25Vl {
        path: path.to_path_buf(),
    };
    let (dir, config) = hf_folder(path, within).ok_or_else(not_qwen)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|_| not_qwen())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let (mut tensors, mut bytes_on_disk) = (Vec::new(), 0);
    for (i, shard) in files.iter().enumerate() {
        let header = read_header(shard)?;
        tensors.extend(header.tensors.into_iter().map(|t| (i, t)));
        bytes_on_disk += header.file_bytes;
    }
    Ok(Scan {
        layout: Layout::Folder {
            shards: files.len(),
        },
        files,
        tensors,
        bytes_on_disk,
        folder_config: Some(config),
    })
}

/// The language model's name of a stored tensor, when it is one (vision tower, `lm_head` and markers are not).
fn lm_name<'a>(stored: &'a str, prefix: &str) -> Option<&'a str> {
    if VISION.iter().any(|v| stored.starts_with(v)) || stored.starts_with("lm_head.") {
        return None;
    }
    let name = stored.strip_prefix(prefix)?;
    let known = ["embed_tokens.", "layers.", "norm."];
    known.iter().any(|k| name.starts_with(k)).then_some(name)
}

/// The sizes a single file's shapes give (head width 128, as every released Qwen2.5 model has).
fn config_from_shapes(
    shapes: &BTreeMap<&str, &[usize]>,
    path: &Path,
) -> Result<Qwen25VlTextConfig, Qwen25VlFormatError> {
    let need = |name: &str, axis: usize| {
        shapes
            .get(name)
            .and_then(|s| s.get(axis).copied())
            .ok_or_else(|| Qwen25VlFormatError::Incomplete {
                problem: format!("tensor `{name}` is missing"),
                fix: if path.to_string_lossy().contains("-of-") {
                    "this looks like one shard: give the folder that holds all of them"
                } else {
                    "download it again"
                },
                path: path.to_path_buf(),
            })
    };
    let hidden = need("embed_tokens.weight", 1)?;
    let (q_rows, k_rows) = (
        need("layers.0.self_attn.q_proj.weight", 0)?,
        need("layers.0.self_attn.k_proj.weight", 0)?,
    );
    // 128 for every released size; a smaller model (a test's) gets the widest power of two dividing both.
    let head_dim = (1..=HEAD_DIM.trailing_zeros())
        .rev()
        .map(|p| 1usize << p)
        .find(|d| q_rows % d == 0 && k_rows % d == 0)
        .unwrap_or(2);
    let third = 3 * head_dim / 16;
    let layers = (0..)
        .take_while(|i| shapes.contains_key(format!("layers.{i}.self_attn.q_proj.weight").as_str()))
        .count();
    let cfg = Qwen25VlTextConfig {
        vocab_size: need("embed_tokens.weight", 0)?,
        hidden_size: hidden,
        intermediate_size: need("layers.0.mlp.gate_proj.weight", 0)?,
        num_hidden_layers: layers,
        num_attention_heads: q_rows / head_dim,
        num_key_value_heads: k_rows / head_dim,
        // The released split (16, 24, 24) of a head's frequencies, scaled to other head widths.
        mrope_section: vec![head_dim / 2 - 2 * third, third, third],
        ..Qwen25VlTextConfig::qwen25_vl_7b()
    };
    need("norm.weight", 0)?;
    cfg.validate().map_err(|e| Qwen25VlFormatError::Build {
        problem: e.to_string(),
        path: path.to_path_buf(),
    })?;
    Ok(cfg)
}

fn describe(path: &Path, scan: &Scan) -> Result<Qwen25VlFile, Qwen25VlFormatError> {
    let has = |name: &str| scan.tensors.iter().any(|(_, t)| t.name == name);
    let prefix = PREFIXES
        .into_iter()
        .find(|p| has(&format!("{p}{PROBE}")))
        .ok_or_else(|| Qwen25VlFormatError::NotQwen25Vl {
            path: path.to_path_buf(),
        })?;
    let shapes: BTreeMap<&str, &[usize]> = scan
        .tensors
        .iter()
        .filter_map(|(_, t)| Some((lm_name(&t.name, prefix)?, t.shape.as_slice())))
        .collect();
    let config = match &scan.folder_config {
        Some(text) => {
            Qwen25VlTextConfig::from_hf_json(text).map_err(|e| Qwen25VlFormatError::Build {
                problem: e.to_string(),
                path: path.to_path_buf(),
            })?
        }
        None => config_from_shapes(&shapes, path)?,
    };
    let mut dtypes = BTreeMap::new();
    for (_, t) in &scan.tensors {
        *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
    }
    let lm = || {
        scan.tensors
            .iter()
            .filter(|(_, t)| lm_name(&t.name, prefix).is_some())
    };
    Ok(Qwen25VlFile {
        path: path.to_path_buf(),
        config,
        layout: scan.layout.clone(),
        prefix,
        vision_tensors: scan
            .tensors
            .iter()
            .filter(|(_, t)| VISION.iter().any(|v| t.name.starts_with(v)))
            .count(),
        dtypes,
        scaled_fp8: scan.tensors.iter().any(|(_, t)| {
            t.name == "scaled_fp8"
                || WEIGHT_SCALE_KEYS
                    .iter()
                    .any(|k| t.name.ends_with(&format!(".{k}")))
        }),
        parameter_count: lm()
            .filter(|(_, t)| {
                !t.name
                    .rsplit('.')
                    .next()
                    .is_some_and(|n| n.contains("scale"))
            })
            .map(|(_, t)| t.numel())
            .sum(),
        bytes_on_disk: scan.bytes_on_disk,
    })
}

/// Says what the Qwen2.5-VL text encoder at `path` (a file or its own folder) is. A pipeline's folder is not
/// named after the text encoder inside it.
pub fn identify(path: &Path) -> Result<Qwen25VlFile, Qwen25VlFormatError> {
    describe(path, &scan(path, false)?)
}

/// How to build the language model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Compute dtype.
    pub dtype: DType,
    /// Where it runs.
    pub device: Device,
    /// Linear bases kept in FP8 with these scales (FP8 files stay FP8; dense ones are quantised); `None`: dense.
    pub fp8: Option<Fp8Scale>,
    /// Layers resident on the device or streamed from host memory.
    pub placement: LayerPlacement,
    /// Sizes to build instead of the file's (tests with small models); `None` also requires the 7B model.
    pub config: Option<Qwen25VlTextConfig>,
}

impl LoadOptions {
    /// bf16 on `device`, dense, resident, the file's sizes.
    pub fn new(device: &Device) -> Self {
        Self {
            dtype: DType::BF16,
            device: device.clone(),
            fp8: None,
            placement: LayerPlacement::Resident,
            config: None,
        }
    }
}

/// Builds the language model at `path` (a file, its folder, or a Qwen-Image / HunyuanVideo 1.5 folder holding
/// it), its tensors read from the opened files as the model
/// asks for them.
pub fn load_text_model(
    path: &Path,
    options: &LoadOptions,
) -> Result<Qwen25VlText, Qwen25VlFormatError> {
    let scanned = scan(path, true)?;
    let file = describe(path, &scanned)?;
    let config = match &options.config {
        Some(cfg) => cfg.clone(),
        None if !file.config.is_7b() => {
            return Err(Qwen25VlFormatError::WrongSize {
                hidden: file.config.hidden_size,
                layers: file.config.num_hidden_layers,
                path: path.to_path_buf(),
            })
        }
        None => file.config.clone(),
    };
    let vb = mapped_vb(
        &scanned.files,
        &scanned.tensors,
        |name| lm_name(name, file.prefix),
        options.dtype,
        &options.device,
        options.fp8,
    )?;
    Qwen25VlText::new(&config, &vb, options.placement).map_err(|e| Qwen25VlFormatError::Build {
        problem: e.to_string(),
        path: path.to_path_buf(),
    })
}

impl Qwen25VlFile {
    /// The model, specifically.
    pub fn title(&self) -> String {
        let c = &self.config;
        if c.is_7b() {
            "Qwen2.5-VL-7B text encoder (its language model)".into()
        } else {
            format!(
                "Qwen2.5-VL-style language model (width {}, {} layers: not the 7B model Qwen-Image uses)",
                c.hidden_size, c.num_hidden_layers
            )
        }
    }
}

impl fmt::Display for Qwen25VlFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(f, "{}", self.title())?;
        writeln!(
            f,
            "  {:<11} {} layers, width {}, {} heads / {} key-value heads of {}, vocabulary {}",
            "model",
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim(),
            c.vocab_size
        )?;
        let layout = match (&self.layout, self.prefix) {
            (Layout::SingleFile, "model.") => {
                "single file, ComfyUI / Hugging Face names (`model.layers.*`)".into()
            }
            (Layout::SingleFile, p) => format!("single file (language model under `{p}`)"),
            (Layout::Folder { shards }, _) => {
                format!("Hugging Face / diffusers folder ({shards} safetensors shards)")
            }
        };
        writeln!(f, "  {:<11} {layout}", "layout")?;
        let vision = if self.vision_tensors > 0 {
            format!(
                "the vision tower is present ({} tensors; not used to encode text, Qwen-Image-Edit needs it)",
                self.vision_tensors
            )
        } else {
            "no vision tower (enough for text; Qwen-Image-Edit needs a file with one)".into()
        };
        writeln!(f, "  {:<11} {vision}", "vision")?;
        match (self.dtypes.contains_key("F8_E4M3"), self.scaled_fp8) {
            (true, true) => writeln!(
                f,
                "  {:<11} float8_e4m3fn weights with their scales (scaled_fp8)",
                "fp8"
            )?,
            (true, false) => writeln!(f, "  {:<11} float8_e4m3fn weights", "fp8")?,
            (false, _) => {}
        }
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        let usage = if c.is_7b() {
            "the text encoder of a Qwen-Image or HunyuanVideo 1.5 run (their training is not available yet)".to_string()
        } else {
            format!(
                "not usable: Qwen-Image and HunyuanVideo 1.5 take Qwen2.5-VL-7B-Instruct; {PICK}"
            )
        };
        writeln!(f, "  {:<11} {usage}", "use")?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}

#[cfg(test)]
mod tests;
