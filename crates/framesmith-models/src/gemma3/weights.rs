//! Says what a Gemma 3 text-encoder file is, from safetensors headers only, and builds the language model from
//! it. Layouts: the official Hugging Face folder (`google/gemma-3-12b-it`: `config.json`, sharded safetensors with
//! the language model under `language_model.model.`, or `model.language_model.` as transformers 5 saves it),
//! ComfyUI's single text-encoder file (`gemma_3_12B_it.safetensors`: `model.layers.*`; bf16 or scaled FP8), and
//! ltx-core's packed single file (the Hugging Face config in the `gemma_config` metadata entry, the tokenizer in a
//! `tokenizer_json` tensor). The vision tower, its projector and `lm_head` are not read.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::config::Gemma3TextConfig;
use super::model::{Gemma3Text, LayerPlacement};
use super::tokenizer::EMBEDDED_TOKENIZER;
use crate::checkpoint::{mapped_vb, read_shards, Tally};
use crate::wan::weights::{
    read_header, read_tensor_data, write_size_lines, ModelFormatError, TensorInfo,
};
use framesmith_nn::fp8::Fp8Scale;

/// Prefixes of the language model's names, most specific first.
const PREFIXES: [&str; 4] = [
    "language_model.model.",
    "model.language_model.",
    "model.",
    "",
];
/// The tensor only Gemma 3's language model has (Gemma 2 has no q / k norms), under its prefix.
const PROBE: &str = "layers.0.self_attn.q_norm.weight";
/// What to download instead of a wrong file.
const PICK: &str =
    "give the google/gemma-3-12b-it folder (its safetensors shards, config.json and \
    tokenizer.json), or ComfyUI's gemma_3_12B_it.safetensors";
/// The metadata entry ltx-core's packed text-encoder files keep the Hugging Face config in.
const GEMMA_CONFIG_METADATA: &str = "gemma_config";

/// Why a path is not a Gemma 3 text encoder Framesmith can use.
#[derive(Debug, thiserror::Error)]
pub enum Gemma3FormatError {
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// Not Gemma 3's language model (another family's file): other readers may name it.
    #[error("this is not a Gemma 3 text encoder (no `{PROBE}`); {PICK}: {}", path.display())]
    NotGemma3 { path: PathBuf },

    /// A Gemma 3 of another size than the 12B one LTX-2 uses.
    #[error("this is Gemma 3 of width {hidden} with {layers} layers, not Gemma 3 12B, which LTX-2 was trained with; {PICK}: {}", path.display())]
    WrongSize {
        hidden: usize,
        layers: usize,
        path: PathBuf,
    },

    /// The model could not be built from the tensors (a tensor missing or misshapen, a bad config.json).
    #[error("cannot build the Gemma 3 text encoder from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// Whether `err` only says the path is something else (so a caller trying other families goes on).
pub fn is_unrecognised(err: &Gemma3FormatError) -> bool {
    matches!(
        err,
        Gemma3FormatError::NotGemma3 { .. } | Gemma3FormatError::File(_)
    )
}

/// What [`identify`] found.
#[derive(Debug, Clone)]
pub struct Gemma3File {
    pub path: PathBuf,
    pub config: Gemma3TextConfig,
    /// Safetensors shards (1 for a single file).
    pub shards: usize,
    /// Whether the sizes come from a config (`config.json` or the `gemma_config` metadata) or from the shapes.
    pub config_source: &'static str,
    /// The language model's key prefix.
    pub prefix: &'static str,
    /// Number of vision-tower and projector tensors (not used to encode text).
    pub vision_tensors: usize,
    /// Whether a `tokenizer_json` tensor is embedded.
    pub embedded_tokenizer: bool,
    tally: Tally,
    bytes_on_disk: u64,
    /// Parameters of the language model alone.
    pub parameter_count: u64,
}

/// The files at a path, their tensors and the config text they carry.
struct Scan {
    files: Vec<PathBuf>,
    tensors: Vec<(usize, TensorInfo)>,
    bytes_on_disk: u64,
    config: Option<(String, &'static str)>,
}

/// Whether the `config.json` text is Gemma 3's.
fn is_gemma3_config(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text).is_ok_and(|json| {
        matches!(json["model_type"].as_str(), Some("gemma3" | "gemma3_text"))
            || json["architectures"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x.as_str().is_some_and(|s| s.starts_with("Gemma3")))
            })
    })
}

fn scan(path: &Path) -> Result<Scan, Gemma3FormatError> {
    if !path.is_dir() {
        let header = read_header(path)?;
        let config = header
            .metadata
            .get(GEMMA_CONFIG_METADATA)
            .map(|c| (c.clone(), "the file's gemma_config metadata"));
        return Ok(Scan {
            files: vec![path.to_path_buf()],
            tensors: header.tensors.into_iter().map(|t| (0, t)).collect(),
            bytes_on_disk: header.file_bytes,
            config,
        });
    }
    let not = || Gemma3FormatError::NotGemma3 {
        path: path.to_path_buf(),
    };
    let config = std::fs::read_to_string(path.join("config.json"))
        .ok()
        .filter(|c| is_gemma3_config(c))
        .ok_or_else(not)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|_| not())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let (tensors, bytes_on_disk) = read_shards(&files)?;
    Ok(Scan {
        files,
        tensors,
        bytes_on_disk,
        config: Some((config, "config.json")),
    })
}

/// The language model's name of a stored tensor, when it is one.
fn lm_name<'a>(stored: &'a str, prefix: &str) -> Option<&'a str> {
    let name = stored.strip_prefix(prefix)?;
    ["embed_tokens.", "layers.", "norm."]
        .iter()
        .any(|k| name.starts_with(k))
        .then_some(name)
}

/// The sizes a file's shapes give; what shapes do not tell (RoPE, window) is Gemma 3 12B's.
fn config_from_shapes(
    shapes: &BTreeMap<&str, &[usize]>,
    path: &Path,
) -> Result<Gemma3TextConfig, Gemma3FormatError> {
    let need = |name: &str, axis: usize| {
        shapes
            .get(name)
            .and_then(|s| s.get(axis).copied())
            .ok_or_else(|| Gemma3FormatError::Build {
                problem: format!(
                    "tensor `{name}` is missing (one shard of a folder? give the folder that holds all of them)"
                ),
                path: path.to_path_buf(),
            })
    };
    let head_dim = need("layers.0.self_attn.q_norm.weight", 0)?.max(1);
    let layers = (0..)
        .take_while(|i| shapes.contains_key(format!("layers.{i}.self_attn.q_proj.weight").as_str()))
        .count();
    let base = Gemma3TextConfig::gemma3_12b();
    let mut cfg = Gemma3TextConfig {
        vocab_size: need("embed_tokens.weight", 0)?,
        hidden_size: need("embed_tokens.weight", 1)?,
        intermediate_size: need("layers.0.mlp.gate_proj.weight", 0)?,
        num_hidden_layers: layers,
        num_attention_heads: need("layers.0.self_attn.q_proj.weight", 0)? / head_dim,
        num_key_value_heads: need("layers.0.self_attn.k_proj.weight", 0)? / head_dim,
        head_dim,
        query_pre_attn_scalar: head_dim as f64,
        layer_types: base
            .layer_types
            .iter()
            .copied()
            .cycle()
            .take(layers)
            .collect(),
        ..base
    };
    if cfg.is_12b() {
        cfg.query_pre_attn_scalar = Gemma3TextConfig::gemma3_12b().query_pre_attn_scalar;
    }
    need("norm.weight", 0)?;
    Ok(cfg)
}

fn describe(path: &Path, scan: &Scan) -> Result<Gemma3File, Gemma3FormatError> {
    let has = |name: &str| scan.tensors.iter().any(|(_, t)| t.name == name);
    let prefix = PREFIXES
        .into_iter()
        .find(|p| {
            has(&format!("{p}{PROBE}"))
                && has(&format!("{p}layers.0.pre_feedforward_layernorm.weight"))
        })
        .ok_or_else(|| Gemma3FormatError::NotGemma3 {
            path: path.to_path_buf(),
        })?;
    let shapes: BTreeMap<&str, &[usize]> = scan
        .tensors
        .iter()
        .filter_map(|(_, t)| Some((lm_name(&t.name, prefix)?, t.shape.as_slice())))
        .collect();
    let (config, config_source) = match &scan.config {
        Some((text, source)) => (
            Gemma3TextConfig::from_hf_json(text).map_err(|problem| Gemma3FormatError::Build {
                problem,
                path: path.to_path_buf(),
            })?,
            *source,
        ),
        None => (config_from_shapes(&shapes, path)?, "the tensors' shapes"),
    };
    let lm = scan
        .tensors
        .iter()
        .filter(|(_, t)| lm_name(&t.name, prefix).is_some() && !t.name.ends_with("scale_weight"))
        .map(|(_, t)| t.numel())
        .sum();
    Ok(Gemma3File {
        path: path.to_path_buf(),
        config,
        shards: scan.files.len(),
        config_source,
        prefix,
        vision_tensors: scan
            .tensors
            .iter()
            .filter(|(_, t)| {
                t.name.contains("vision_tower.") || t.name.contains("multi_modal_projector.")
            })
            .count(),
        embedded_tokenizer: has(EMBEDDED_TOKENIZER),
        tally: Tally::of(scan.tensors.iter().map(|(_, t)| t)),
        bytes_on_disk: scan.bytes_on_disk,
        parameter_count: lm,
    })
}

/// Says what the Gemma 3 text encoder at `path` (a single file or the Hugging Face folder) is.
pub fn identify(path: &Path) -> Result<Gemma3File, Gemma3FormatError> {
    describe(path, &scan(path)?)
}

/// The bytes of the `tokenizer_json` tensor a packed single file embeds, if it has one.
pub fn embedded_tokenizer(path: &Path) -> Option<Vec<u8>> {
    let header = read_header(path).ok()?;
    let info = header
        .tensors
        .iter()
        .find(|t| t.name == EMBEDDED_TOKENIZER)?;
    read_tensor_data(path, info).ok()
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
    /// Whether a Gemma 3 of another size than 12B is built (tests with small models); `false` refuses it.
    pub any_size: bool,
}

impl LoadOptions {
    /// bf16 on `device`, dense, resident, 12B only.
    pub fn new(device: &Device) -> Self {
        Self {
            dtype: DType::BF16,
            device: device.clone(),
            fp8: None,
            placement: LayerPlacement::Resident,
            any_size: false,
        }
    }
}

/// Builds the language model at `path` (a file or its folder), its tensors read from the mapped files as the
/// model asks for them.
pub fn load_text_model(
    path: &Path,
    options: &LoadOptions,
) -> Result<(Gemma3File, Gemma3Text), Gemma3FormatError> {
    let scanned = scan(path)?;
    let file = describe(path, &scanned)?;
    if !options.any_size && !file.config.is_12b() {
        return Err(Gemma3FormatError::WrongSize {
            hidden: file.config.hidden_size,
            layers: file.config.num_hidden_layers,
            path: path.to_path_buf(),
        });
    }
    let vb = mapped_vb(
        &scanned.files,
        &scanned.tensors,
        |name| lm_name(name, file.prefix),
        options.dtype,
        &options.device,
        options.fp8,
    )?;
    let model = Gemma3Text::new(&file.config, &vb, options.placement).map_err(|e| {
        Gemma3FormatError::Build {
            problem: e.to_string(),
            path: path.to_path_buf(),
        }
    })?;
    Ok((file, model))
}

impl Gemma3File {
    /// The model, specifically.
    pub fn title(&self) -> String {
        if self.config.is_12b() {
            "Gemma 3 12B text encoder (its language model), LTX-2's and LTX-2.3's".into()
        } else {
            format!(
                "Gemma 3 language model (width {}, {} layers: not the 12B model LTX-2 uses)",
                self.config.hidden_size, self.config.num_hidden_layers
            )
        }
    }
}

impl fmt::Display for Gemma3File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(f, "{}", self.title())?;
        writeln!(
            f,
            "  {:<11} {} layers, width {}, {} heads / {} key-value heads of {}, vocabulary {} (from {})",
            "model",
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.vocab_size,
            self.config_source
        )?;
        let layout = match (self.shards, self.prefix) {
            (1, "model.") => "single file, ComfyUI's names (`model.layers.*`)".to_string(),
            (1, p) => format!("single file (language model under `{p}`)"),
            (n, p) => {
                format!("Hugging Face folder ({n} safetensors shards, language model under `{p}`)")
            }
        };
        writeln!(f, "  {:<11} {layout}", "layout")?;
        if self.vision_tensors > 0 {
            writeln!(
                f,
                "  {:<11} the vision tower is present ({} tensors; not used to encode text)",
                "vision", self.vision_tensors
            )?;
        }
        if self.embedded_tokenizer {
            writeln!(f, "  {:<11} embedded (`tokenizer_json`)", "tokenizer")?;
        }
        if self.tally.dtypes.contains_key("F8_E4M3") {
            let scaled = if self.tally.scaled_fp8 {
                " with their scales"
            } else {
                ""
            };
            writeln!(f, "  {:<11} float8_e4m3fn weights{scaled}", "fp8")?;
        }
        write_size_lines(
            f,
            &self.tally.dtypes,
            self.parameter_count,
            self.bytes_on_disk,
        )?;
        let usage = if c.is_12b() {
            "the text encoder of `framesmith cache text` for LTX-2 / LTX-2.3 (--text-encoder, with --dit)"
        } else {
            "not usable: LTX-2 takes Gemma 3 12B"
        };
        writeln!(f, "  {:<11} {usage}", "use")?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}
