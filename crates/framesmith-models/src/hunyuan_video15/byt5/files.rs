//! The glyph encoder's files: the official release's `text_encoder/Glyph-SDXL-v2/checkpoints/byt5_model.pt` (the
//! encoder's `T5Stack` state dict: `embed_tokens.weight`, `block.N.*`, `final_layer_norm.weight`; or a training
//! checkpoint's `state_dict` under `module.text_tower.encoder.`, which the official loader strips) read without
//! running its pickle, and ComfyUI's `byt5_small_glyphxl_fp16.safetensors` (Hugging Face names: `shared.weight`,
//! `encoder.*`). Finding the file in a folder, and what `framesmith inspect` says of one (headers only).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::wan::weights::{read_header, weights_file_in, write_size_lines, WeightsFileError};

use super::tokenizer::{BASE_VOCAB, GLYPH_VOCAB};
use super::WIDTH;

/// The official checkpoint under the release's `text_encoder/` folder.
const OFFICIAL_FILE: &str = "Glyph-SDXL-v2/checkpoints/byt5_model.pt";
/// ComfyUI's file name.
pub const COMFY_FILE: &str = "byt5_small_glyphxl_fp16.safetensors";
/// The prefix of the official training checkpoint's names.
const TRAINING_PREFIX: &str = "module.text_tower.encoder.";

/// Renames the tensors of any glyph-encoder layout to a Hugging Face T5 encoder's names (`shared.weight`,
/// `encoder.*`); decoder and head tensors are dropped.
pub fn hf_encoder_names<T>(tensors: HashMap<String, T>) -> HashMap<String, T> {
    tensors
        .into_iter()
        .filter_map(|(name, t)| hf_name(&name).map(|n| (n, t)))
        .collect()
}

fn hf_name(name: &str) -> Option<String> {
    let name = name.strip_prefix(TRAINING_PREFIX).unwrap_or(name);
    if name == "shared.weight" || name.starts_with("encoder.") {
        return Some(name.to_string());
    }
    let stack = name == "embed_tokens.weight"
        || name.starts_with("block.")
        || name.starts_with("final_layer_norm.");
    stack.then(|| format!("encoder.{name}"))
}

/// The weights file at `path`: the file itself, or the official checkpoint in a folder (the release's
/// `text_encoder/`, `Glyph-SDXL-v2/` or its `checkpoints/`), or ComfyUI's file in one.
pub fn glyph_weights_file(path: &Path) -> Result<PathBuf, WeightsFileError> {
    let candidates = [
        OFFICIAL_FILE,
        "checkpoints/byt5_model.pt",
        "byt5_model.pt",
        "text_encoder/Glyph-SDXL-v2/checkpoints/byt5_model.pt",
        COMFY_FILE,
    ];
    weights_file_in(path, &candidates, || {
        format!(
            "this folder holds no glyph encoder ({OFFICIAL_FILE} of the release's text_encoder/, or ComfyUI's \
             {COMFY_FILE}); point to the byT5 weights file"
        )
    })
}

/// The glyph encoder beside a text encoder: the release's `text_encoder/` holds `Glyph-SDXL-v2/` next to
/// `llm/`, and ComfyUI's `text_encoders/` holds its file next to the Qwen2.5-VL file.
pub fn glyph_beside(text_encoder: &Path) -> Option<PathBuf> {
    text_encoder
        .ancestors()
        .take(3)
        .flat_map(|dir| [dir.join(OFFICIAL_FILE), dir.join(COMFY_FILE)])
        .find(|p| p.is_file())
}

/// How the file names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlyphLayout {
    /// The official `byt5_model.pt`: the encoder's own (`T5Stack`) names.
    Official,
    /// Hugging Face names (`shared.weight`, `encoder.*`), as ComfyUI's file has them.
    HuggingFace,
}

/// What a glyph-encoder file is, from its header.
#[derive(Debug, Clone)]
pub struct GlyphFile {
    pub path: PathBuf,
    pub layout: GlyphLayout,
    pub vocab: usize,
    pub layers: usize,
    pub dtypes: BTreeMap<String, usize>,
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
    /// A PyTorch archive (read without running its pickle) rather than safetensors.
    pub pytorch: bool,
}

/// The file at `path` as a byT5 encoder (byT5-small's width 1472, or Glyph-SDXL-v2's vocabulary 1510), named from
/// its header or pickle listing; `None` for anything else.
pub fn identify(path: &Path) -> Option<GlyphFile> {
    // Only a regular file: a folder is not one file, and opening a FIFO or a device would wait or never end.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let (listed, pytorch, bytes_on_disk) = match read_header(path) {
        Ok(h) => {
            let listed: Vec<(String, String, Vec<usize>)> = h
                .tensors
                .into_iter()
                .map(|t| (t.name, t.dtype, t.shape))
                .collect();
            (listed, false, h.file_bytes)
        }
        Err(_) => {
            let listed = crate::wan::weights::pth_listing(path).ok()?;
            let bytes = std::fs::metadata(path).ok()?.len();
            let listed = listed
                .into_iter()
                .map(|t| (t.name, t.dtype, t.shape))
                .collect();
            (listed, true, bytes)
        }
    };
    let layout = if listed
        .iter()
        .any(|(n, _, _)| n == "shared.weight" || n.starts_with("encoder."))
    {
        GlyphLayout::HuggingFace
    } else {
        GlyphLayout::Official
    };
    let mut dtypes = BTreeMap::new();
    let mut parameter_count = 0u64;
    let mut shapes = HashMap::new();
    for (name, dtype, shape) in listed {
        parameter_count += shape.iter().map(|&d| d as u64).product::<u64>();
        *dtypes.entry(dtype).or_insert(0) += 1;
        shapes.insert(name, shape);
    }
    let hf = hf_encoder_names(shapes);
    let cfg = crate::t5::v1_1::t5_config_from_hf_shapes(|n| hf.get(n).cloned()).ok()?;
    (cfg.dim == WIDTH || cfg.vocab == GLYPH_VOCAB).then(|| GlyphFile {
        path: path.to_path_buf(),
        layout,
        vocab: cfg.vocab,
        layers: cfg.num_layers,
        dtypes,
        parameter_count,
        bytes_on_disk,
        pytorch,
    })
}

impl fmt::Display for GlyphFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let glyph = self.vocab == GLYPH_VOCAB;
        if glyph {
            writeln!(
                f,
                "byT5-small glyph encoder with Glyph-SDXL-v2's colour and font tokens"
            )?;
        } else {
            writeln!(
                f,
                "byT5-small text encoder (vocabulary {}), not Glyph-SDXL-v2's",
                self.vocab
            )?;
        }
        writeln!(
            f,
            "  {:<11} {} layers, width {WIDTH}, vocabulary {}",
            "encoder", self.layers, self.vocab
        )?;
        let layout = match (self.layout, self.pytorch) {
            (GlyphLayout::Official, true) => {
                "official byt5_model.pt (PyTorch archive, read without running its pickle)"
            }
            (GlyphLayout::Official, false) => {
                "the encoder's own names (as the official byt5_model.pt)"
            }
            (GlyphLayout::HuggingFace, _) => {
                "Hugging Face names (as ComfyUI's byt5_small_glyphxl file)"
            }
        };
        writeln!(f, "  {:<11} {layout}", "layout")?;
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        let usage = if glyph {
            "the glyph (byT5) encoder of HunyuanVideo 1.5: encodes the quoted text of prompts for caching, \
             samples and generation"
                .to_string()
        } else if self.vocab == BASE_VOCAB {
            "google/byt5-small is the base the glyph encoder was trained from; HunyuanVideo 1.5 needs \
             Glyph-SDXL-v2's checkpoints/byt5_model.pt or ComfyUI's byt5_small_glyphxl_fp16.safetensors"
                .to_string()
        } else {
            format!(
                "not a glyph encoder HunyuanVideo 1.5 can use: it needs vocabulary {GLYPH_VOCAB}"
            )
        };
        writeln!(f, "  {:<11} {usage}", "use")?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}
