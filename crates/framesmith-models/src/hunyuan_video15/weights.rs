//! Says what a HunyuanVideo transformer file is, from its headers only (safetensors headers, or a PyTorch
//! archive's pickle read without running it): HunyuanVideo 1.5 in any of its layouts — the official release
//! (`tencent/HunyuanVideo-1.5` `transformer/<variant>/` folders), ComfyUI's repackaged single files (bf16 or
//! float8_e4m3fn, bare or under `model.diffusion_model.`), diffusers folders — and HunyuanVideo 1.0 in its own
//! (the official `.pt` release, its safetensors and ComfyUI forms, diffusers), which Framesmith names and does not
//! train. Sizes come from the shapes (a diffusers folder's from its `config.json`). [`load`] builds the 1.5
//! transformer from any of its layouts.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::config::HunyuanVideo15Config;
use super::layout::KeyLayout;
use crate::checkpoint::{comfy_prefix, read_shards, Names, Tally};
use crate::wan::weights::{
    pickle_reason, read_header, write_size_lines, ModelFormatError, TensorInfo,
};

mod keys;
mod load;
mod pickle_check;

pub use keys::official_shapes;
pub use load::{load_dit, load_dit_streamed, open, OpenedHunyuanVideo15};

/// diffusers' class name of the 1.5 transformer in a folder's `config.json`.
const DIFFUSERS_CLASS: &str = "HunyuanVideo15Transformer3DModel";
/// Where the 1.5 release is, for the message that names a 1.0 file.
const GET_15: &str =
    "Framesmith trains HunyuanVideo 1.5: download a transformer of tencent/HunyuanVideo-1.5 \
     (transformer/480p_t2v, 480p_i2v, 720p_t2v or 720p_i2v) or one of ComfyUI's repackaged \
     hunyuanvideo1.5_*.safetensors files";

/// Why a path is not a HunyuanVideo 1.5 transformer Framesmith can use.
#[derive(Debug, thiserror::Error)]
pub enum HunyuanVideoFormatError {
    /// The file could not be read as safetensors.
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// Not a HunyuanVideo transformer: other readers may name it.
    #[error("this is not a HunyuanVideo transformer: {}", path.display())]
    NotHunyuanVideo { path: PathBuf },

    /// A HunyuanVideo 1.0 transformer, which Framesmith names but does not train.
    #[error("this is a HunyuanVideo 1.0 transformer ({layout}), which Framesmith does not train; {GET_15}: {}", path.display())]
    Version10 { layout: String, path: PathBuf },

    /// A PyTorch archive whose pickle names more than tensors need (it would run code in `torch.load`), or
    /// that cannot be checked; nothing of it was run.
    #[error("this PyTorch file is refused without running it: {reason}; download the safetensors release instead: {}", path.display())]
    UnsafePickle { reason: String, path: PathBuf },

    /// HunyuanVideo 1.5 tensors, but not the whole transformer (one shard of a folder, a damaged file).
    #[error("this HunyuanVideo 1.5 transformer file is incomplete: {problem}; {fix}: {}", path.display())]
    Incomplete {
        problem: String,
        fix: &'static str,
        path: PathBuf,
    },

    /// A 1.5 transformer whose tensors do not make the model.
    #[error("cannot build the HunyuanVideo 1.5 transformer from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// Whether `err` only says the path is something else (so a caller trying other families goes on).
pub fn is_unrecognised(err: &HunyuanVideoFormatError) -> bool {
    matches!(
        err,
        HunyuanVideoFormatError::NotHunyuanVideo { .. } | HunyuanVideoFormatError::File(_)
    )
}

/// Which HunyuanVideo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HunyuanVideo 1.5 (8.3B): double-stream blocks only, glyph and image conditioning.
    V15,
    /// HunyuanVideo 1.0 (13B): double- and single-stream blocks, CLIP-pooled text.
    V10,
}

/// How the files hold the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Container {
    /// One safetensors file, its names under a ComfyUI prefix or none.
    SingleFile { prefix: Option<&'static str> },
    /// A folder of safetensors shards beside a `config.json` (the official release, diffusers).
    Folder { shards: usize },
    /// A PyTorch archive (`.pt`), listed without running its pickle.
    PyTorch,
}

impl Container {
    /// The prefix before the model's names, if any.
    pub fn prefix(&self) -> Option<&'static str> {
        match self {
            Self::SingleFile { prefix } => *prefix,
            Self::Folder { .. } | Self::PyTorch => None,
        }
    }
}

/// What [`identify`] found.
#[derive(Debug, Clone)]
pub struct HunyuanVideoFile {
    pub path: PathBuf,
    pub version: Version,
    pub keys: KeyLayout,
    pub container: Container,
    /// The 1.5 transformer's sizes (`None` for 1.0).
    pub config: Option<HunyuanVideo15Config>,
    /// Number of tensors per dtype (safetensors spelling).
    pub dtypes: BTreeMap<String, usize>,
    /// FP8 weights stored with their scales (ComfyUI `scaled_fp8`, or `weight_scale` beside the weights).
    pub scaled_fp8: bool,
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
}

/// Which HunyuanVideo and which key layout names are.
trait Classify {
    fn classify(&self) -> Option<(Version, KeyLayout)>;
}

impl Classify for Names<'_> {
    /// Which HunyuanVideo and which key layout these names are, if any.
    fn classify(&self) -> Option<(Version, KeyLayout)> {
        let refiner = self.any_prefix("txt_in.individual_token_refiner.");
        if self.any_prefix("double_blocks.") && refiner {
            let fused = self.has("double_blocks.0.img_attn_qkv.weight");
            if self.has("cond_type_embedding.weight") || self.any_prefix("byt5_in.") {
                let keys = if fused {
                    KeyLayout::ComfyUi
                } else {
                    KeyLayout::Official
                };
                return Some((Version::V15, keys));
            }
            return fused.then_some((Version::V10, KeyLayout::Official));
        }
        if self.any_prefix("context_embedder.token_refiner.") {
            if self.has("cond_type_embed.weight") || self.any_prefix("context_embedder_2.") {
                return Some((Version::V15, KeyLayout::Diffusers));
            }
            if self.any_prefix("transformer_blocks.") {
                return Some((Version::V10, KeyLayout::Diffusers));
            }
        }
        None
    }
}

/// The official tensor names of the sizes [`config_from_shapes`] reads, in `keys`' layout.
fn stored_name(keys: KeyLayout, official: &str) -> String {
    match keys {
        KeyLayout::Diffusers => super::layout::diffusers_name(official),
        KeyLayout::Official | KeyLayout::ComfyUi => official.to_string(),
    }
}

/// The 1.5 sizes the shapes say (the RoPE split is the release's: it is not stored).
fn config_from_shapes(
    names: &Names,
    keys: KeyLayout,
    path: &Path,
) -> Result<HunyuanVideo15Config, HunyuanVideoFormatError> {
    let need = |official: &str, axis: usize| {
        let name = stored_name(keys, official);
        names.dim(&name, axis).ok_or_else(|| HunyuanVideoFormatError::Incomplete {
            problem: format!("tensor `{name}` is missing"),
            fix: if path.to_string_lossy().contains("-of-") {
                "this looks like one shard of a transformer folder: give the folder that holds all of them"
            } else {
                "download it again"
            },
            path: path.to_path_buf(),
        })
    };
    let dim = need("cond_type_embedding.weight", 1)?;
    let head_dim = need("double_blocks.0.img_attn_q_norm.weight", 0)?;
    let (pt, p) = (
        need("img_in.proj.weight", 2)?,
        need("img_in.proj.weight", 3)?,
    );
    let (blocks, refiner) = match keys {
        KeyLayout::Diffusers => (
            "transformer_blocks.",
            "context_embedder.token_refiner.refiner_blocks.",
        ),
        _ => ("double_blocks.", "txt_in.individual_token_refiner.blocks."),
    };
    // The release's RoPE split (16, 56, 56 for heads of 128), scaled to other head widths.
    let hw = 2 * (7 * head_dim / 32);
    let defaults = HunyuanVideo15Config {
        rope_axes_dim: vec![head_dim.saturating_sub(2 * hw), hw, hw],
        ..HunyuanVideo15Config::hunyuan_video15()
    };
    Ok(HunyuanVideo15Config {
        in_channels: need("img_in.proj.weight", 1)?,
        out_channels: need("final_layer.linear.weight", 0)? / (pt * p * p).max(1),
        num_attention_heads: dim / head_dim.max(1),
        attention_head_dim: head_dim,
        num_layers: names.count(blocks),
        num_refiner_layers: names.count(refiner),
        mlp_ratio: need("double_blocks.0.img_mlp.fc1.weight", 0)? as f64 / dim.max(1) as f64,
        patch_size: p,
        patch_size_t: pt,
        text_embed_dim: need("txt_in.input_embedder.weight", 1)?,
        text_embed_2_dim: need("byt5_in.fc1.weight", 1)?,
        byt5_hidden_dim: need("byt5_in.fc1.weight", 0)?,
        image_embed_dim: need("vision_in.proj.1.weight", 1)?,
        use_meanflow: names.any_prefix("time_r_in.")
            || names.any_prefix("time_embed.timestep_embedder_r."),
        ..defaults
    })
}

/// The safetensors files at `path` and their tensors, as [`identify`] reads them.
pub(crate) struct Scan {
    pub files: Vec<PathBuf>,
    /// Each tensor with the index of its file in `files`.
    pub tensors: Vec<(usize, TensorInfo)>,
    pub bytes_on_disk: u64,
    pub container: Container,
    /// A diffusers folder's `config.json`.
    pub folder_config: Option<HunyuanVideo15Config>,
}

/// The transformer folder at `path` (itself, or its `transformer/`) with its safetensors files.
fn folder_files(path: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    [path.to_path_buf(), path.join("transformer")]
        .into_iter()
        .find_map(|dir| {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .ok()?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            (!files.is_empty()).then_some((dir, files))
        })
}

/// A diffusers `config.json` of the 1.5 transformer in `dir`.
fn diffusers_config(dir: &Path) -> Option<HunyuanVideo15Config> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    (json["_class_name"] == DIFFUSERS_CLASS)
        .then(|| HunyuanVideo15Config::from_json(&text).ok())
        .flatten()
}

/// The tensors of a PyTorch archive, at the top level or under `module` (the official 1.0 release's
/// `mp_rank_00_model_states.pt`), `state_dict` or `model`; candle's pickle reader never runs the pickle's code.
fn pytorch_listing(path: &Path) -> Result<Vec<TensorInfo>, HunyuanVideoFormatError> {
    let unreadable = |e: &candle_core::Error| ModelFormatError::UnreadablePickle {
        reason: pickle_reason(e),
        path: path.to_path_buf(),
    };
    let mut infos =
        candle_core::pickle::read_pth_tensor_info(path, false, None).map_err(|e| unreadable(&e))?;
    for key in ["module", "state_dict", "model"] {
        if !infos.is_empty() {
            break;
        }
        infos =
            candle_core::pickle::read_pth_tensor_info(path, false, Some(key)).unwrap_or_default();
    }
    Ok(infos
        .into_iter()
        .map(|t| TensorInfo {
            name: t.name,
            dtype: format!("{:?}", t.dtype).to_ascii_uppercase(),
            shape: t.layout.dims().to_vec(),
            len_bytes: 0,
            data_start: 0,
        })
        .collect())
}

/// Whether `path` looks like a PyTorch archive (a zip file).
fn is_pytorch(path: &Path) -> bool {
    // Only a regular file is opened here: opening a FIFO would wait for a writer, and a device never ends.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut head = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| &head == b"PK\x03\x04")
}

/// Reads the headers at `path`: one file, or a transformer folder's shards.
pub(crate) fn scan(path: &Path) -> Result<Scan, HunyuanVideoFormatError> {
    if path.is_dir() {
        let not_ours = || HunyuanVideoFormatError::NotHunyuanVideo {
            path: path.to_path_buf(),
        };
        let (dir, files) = folder_files(path).ok_or_else(not_ours)?;
        let (tensors, bytes_on_disk) = read_shards(&files)?;
        let container = Container::Folder {
            shards: files.len(),
        };
        let folder_config = diffusers_config(&dir);
        return Ok(Scan {
            files,
            tensors,
            bytes_on_disk,
            container,
            folder_config,
        });
    }
    if is_pytorch(path) {
        let tensors = pytorch_listing(path)?;
        if Names::new(&tensors, None).classify().is_none() {
            return Err(HunyuanVideoFormatError::NotHunyuanVideo {
                path: path.to_path_buf(),
            });
        }
        // Named from the listing alone, but not vouched for: a pickle that names more than tensors is refused.
        pickle_check::check(path).map_err(|reason| HunyuanVideoFormatError::UnsafePickle {
            reason,
            path: path.to_path_buf(),
        })?;
        let bytes_on_disk = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        return Ok(Scan {
            files: vec![path.to_path_buf()],
            tensors: tensors.into_iter().map(|t| (0, t)).collect(),
            bytes_on_disk,
            container: Container::PyTorch,
            folder_config: None,
        });
    }
    let header = read_header(path)?;
    let container = Container::SingleFile {
        prefix: comfy_prefix(&header.tensors, "_blocks.0."),
    };
    Ok(Scan {
        files: vec![path.to_path_buf()],
        tensors: header.tensors.into_iter().map(|t| (0, t)).collect(),
        bytes_on_disk: header.file_bytes,
        container,
        folder_config: None,
    })
}

/// What the scanned tensors at `path` are.
pub(crate) fn describe(
    path: &Path,
    scan: &Scan,
) -> Result<HunyuanVideoFile, HunyuanVideoFormatError> {
    let tensors = || scan.tensors.iter().map(|(_, t)| t);
    let names = Names::new(tensors(), scan.container.prefix());
    let Some((version, keys)) = names.classify() else {
        return Err(HunyuanVideoFormatError::NotHunyuanVideo {
            path: path.to_path_buf(),
        });
    };
    let config = match version {
        Version::V10 => None,
        Version::V15 => {
            let mut config = config_from_shapes(&names, keys, path)?;
            if let Some(folder) = &scan.folder_config {
                // diffusers' config has no glyph hidden width: the shapes' stays.
                config = HunyuanVideo15Config {
                    byt5_hidden_dim: config.byt5_hidden_dim,
                    ..folder.clone()
                };
            }
            Some(config)
        }
    };
    let tally = Tally::of(tensors());
    Ok(HunyuanVideoFile {
        path: path.to_path_buf(),
        version,
        keys,
        container: scan.container.clone(),
        config,
        dtypes: tally.dtypes,
        scaled_fp8: tally.scaled_fp8,
        parameter_count: tally.parameter_count,
        bytes_on_disk: scan.bytes_on_disk,
    })
}

/// Says what the HunyuanVideo transformer at `path` is (a file or a folder).
pub fn identify(path: &Path) -> Result<HunyuanVideoFile, HunyuanVideoFormatError> {
    describe(path, &scan(path)?)
}

impl HunyuanVideoFile {
    /// The layout in words.
    pub fn layout_label(&self) -> String {
        let keys = match self.keys {
            KeyLayout::Official => "official key names",
            KeyLayout::ComfyUi => "official key names with q, k, v stacked (ComfyUI)",
            KeyLayout::Diffusers => "diffusers key names",
        };
        match &self.container {
            Container::SingleFile { prefix: Some(p) } => {
                format!("ComfyUI single file under `{p}`, {keys}")
            }
            Container::SingleFile { prefix: None } => format!("single file, {keys}"),
            Container::Folder { shards } => {
                format!("transformer folder of {shards} safetensors file(s), {keys}")
            }
            Container::PyTorch => {
                format!("PyTorch archive (.pt, read without running its pickle), {keys}")
            }
        }
    }
}

impl fmt::Display for HunyuanVideoFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.version, &self.config) {
            (Version::V15, Some(c)) => {
                let released = c.inner_dim() == 2048 && c.num_layers == 54;
                let size = if released {
                    "8.3B"
                } else {
                    "not a released size"
                };
                writeln!(f, "HunyuanVideo 1.5 transformer ({size})")?;
                writeln!(
                    f,
                    "  {:<11} {} double-stream, width {}, {} heads of {}",
                    "blocks",
                    c.num_layers,
                    c.inner_dim(),
                    c.num_attention_heads,
                    c.attention_head_dim
                )?;
                writeln!(
                    f,
                    "  {:<11} {}-channel latents (noisy, condition, mask), text width {}, glyph width {}",
                    "input", c.in_channels, c.text_embed_dim, c.text_embed_2_dim
                )?;
            }
            _ => writeln!(
                f,
                "HunyuanVideo 1.0 transformer (13B; not trained by Framesmith)"
            )?,
        }
        writeln!(f, "  {:<11} {}", "layout", self.layout_label())?;
        match (self.dtypes.contains_key("F8_E4M3"), self.scaled_fp8) {
            (true, true) => writeln!(f, "  {:<11} float8_e4m3fn weights with their scales", "fp8")?,
            (true, false) => writeln!(f, "  {:<11} float8_e4m3fn weights", "fp8")?,
            (false, _) => {}
        }
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        let usage = match self.version {
            Version::V15 => {
                "the diffusion model of a HunyuanVideo 1.5 run (T2V and I2V share these tensors)"
            }
            Version::V10 => GET_15,
        };
        writeln!(f, "  {:<11} {usage}", "use")?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}

#[cfg(test)]
mod tests;
