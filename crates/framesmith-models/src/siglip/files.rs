//! SigLIP's files as users have them: FLUX.1-Redux-dev's folder (the HunyuanVideo 1.5 release's
//! `vision_encoder/siglip`: `image_encoder/model.safetensors` and its `config.json`), ComfyUI's
//! `sigclip_vision_patch14_384.safetensors`, or a whole SigLIP model (`google/siglip-so400m-patch14-384`, whose
//! text tower is not read). Names are transformers' (`vision_model.*`, the prefix optional); the sizes come from
//! the tensors' shapes, the head count from a `config.json` beside the file or, without one, from the width of
//! the released towers. Finding the file in a folder, loading it, and what `framesmith inspect` says of one
//! (header only).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::{SiglipVision, SiglipVisionConfig};
use crate::wan::weights::{
    read_header, read_whole_file, weights_file_in, write_size_lines, WeightsFileError,
};
use framesmith_nn::file::read_regular;
use framesmith_nn::vb::Vb;

/// ComfyUI's file name (its `clip_vision` folder).
pub const COMFY_FILE: &str = "sigclip_vision_patch14_384.safetensors";
/// Where the weights sit in FLUX.1-Redux-dev's folder.
const REDUX_FILE: &str = "image_encoder/model.safetensors";
/// The prefix of transformers' names, stripped where present.
const PREFIX: &str = "vision_model.";
/// The most of a `config.json` read.
const CONFIG_BYTES: u64 = 1 << 20;
/// What the model is called in messages.
const MODEL: &str = "SigLIP image encoder";
/// What to give instead, for messages.
pub const SIGLIP_FILES: &str =
    "FLUX.1-Redux-dev's folder (the HunyuanVideo 1.5 release's vision_encoder/siglip, or its \
     image_encoder/model.safetensors) or ComfyUI's sigclip_vision_patch14_384.safetensors";

/// The tower's name for a file's name: `vision_model.` stripped; `None` for tensors the tower does not use (the
/// pooling head, a text tower, the logit scale).
fn tower_name(name: &str) -> Option<&str> {
    let name = name.strip_prefix(PREFIX).unwrap_or(name);
    ["embeddings.", "encoder.layers.", "post_layernorm."]
        .iter()
        .any(|p| name.starts_with(p))
        .then_some(name)
}

/// The weights file at `path`: the file itself, or the one a folder holds (FLUX.1-Redux-dev's, the release's
/// `vision_encoder/siglip` or the checkpoint folder above it, or a folder with ComfyUI's file).
pub fn siglip_weights_file(path: &Path) -> Result<PathBuf, WeightsFileError> {
    let candidates = [
        REDUX_FILE,
        "model.safetensors",
        COMFY_FILE,
        "siglip/image_encoder/model.safetensors",
        "vision_encoder/siglip/image_encoder/model.safetensors",
    ];
    weights_file_in(path, &candidates, || {
        format!("this folder holds no SigLIP image encoder ({REDUX_FILE}, or {COMFY_FILE}); give {SIGLIP_FILES}")
    })
}

/// The head count of a released tower of width `width` (so400m 1152, large 1024, base 768: heads of 72 or 64).
fn released_heads(width: usize) -> Option<usize> {
    match width {
        1152 | 1024 => Some(16),
        768 => Some(12),
        _ => None,
    }
}

/// The input side of a released tower of `grid`² patches of `patch` pixels: a whole number of patches, except
/// so400m-patch14-384's 384 pixels (27 patches of 14 see 378 of them).
fn released_image_size(patch: usize, grid: usize) -> usize {
    if (patch, grid) == (14, 27) {
        384
    } else {
        patch * grid
    }
}

/// What a `config.json` may say that the tensors' shapes do not.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct ConfigBeside {
    pub heads: Option<usize>,
    pub eps: Option<f64>,
    pub image_size: Option<usize>,
}

/// `num_attention_heads`, `layer_norm_eps` and `image_size` of the `config.json` beside `file` (a vision config, or
/// a whole SigLIP config's `vision_config`), when there is one.
fn config_beside(file: &Path) -> ConfigBeside {
    let Some(bytes) = file
        .parent()
        .and_then(|d| read_regular(&d.join("config.json"), CONFIG_BYTES).ok())
    else {
        return ConfigBeside::default();
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return ConfigBeside::default();
    };
    let vision = json.get("vision_config").unwrap_or(&json);
    let size = |key: &str| {
        vision
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
    };
    ConfigBeside {
        heads: size("num_attention_heads"),
        eps: vision
            .get("layer_norm_eps")
            .and_then(serde_json::Value::as_f64),
        image_size: size("image_size"),
    }
}

/// The tower's sizes from its tensors' shapes (`shape` of a tower name) and what a config beside says.
pub(super) fn config_from_shapes(
    shape: impl Fn(&str) -> Option<Vec<usize>>,
    layers: usize,
    beside: ConfigBeside,
) -> Result<SiglipVisionConfig, String> {
    let patch = shape("embeddings.patch_embedding.weight")
        .filter(|s| s.len() == 4 && s[1] == 3 && s[2] == s[3])
        .ok_or("no patch embedding [width, 3, p, p] (embeddings.patch_embedding.weight)")?;
    let (width, p) = (patch[0], patch[2]);
    let tokens = shape("embeddings.position_embedding.weight")
        .and_then(|s| s.first().copied())
        .ok_or("no position embedding (embeddings.position_embedding.weight)")?;
    let grid = (1..=tokens).find(|g| g * g >= tokens).unwrap_or(0);
    if grid * grid != tokens {
        return Err(format!("{tokens} positions make no square grid of patches"));
    }
    let intermediate = shape("encoder.layers.0.mlp.fc1.weight")
        .and_then(|s| s.first().copied())
        .ok_or("no encoder layers (encoder.layers.0.mlp.fc1.weight)")?;
    let heads = beside.heads.or_else(|| released_heads(width)).ok_or_else(|| {
        format!("a tower of width {width} is not a released SigLIP; put its config.json beside the file")
    })?;
    let cfg = SiglipVisionConfig {
        hidden_size: width,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        image_size: beside
            .image_size
            .unwrap_or_else(|| released_image_size(p, grid)),
        patch_size: p,
        layer_norm_eps: beside.eps.unwrap_or(1e-6),
    };
    cfg.check()?;
    if cfg.grid() != grid {
        return Err(format!(
            "{tokens} positions do not fit {}-pixel images in {p}-pixel patches (the config.json beside it)",
            cfg.image_size
        ));
    }
    Ok(cfg)
}

/// Layers of a tower whose names are `names` (tower names).
fn layer_count<'a>(names: impl IntoIterator<Item = &'a str>) -> usize {
    names
        .into_iter()
        .filter_map(|n| {
            n.strip_prefix("encoder.layers.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|i| i + 1)
        .max()
        .unwrap_or(0)
}

impl SiglipVision {
    /// The tower from tensors under transformers' names (`vision_model.` optional; other tensors ignored), its sizes
    /// read from their shapes and `config` (what a config beside them says); the error says what is missing or
    /// wrong.
    pub(super) fn from_tensors(
        tensors: HashMap<String, Tensor>,
        config: ConfigBeside,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, String> {
        let tower: HashMap<String, Tensor> = tensors
            .into_iter()
            .filter_map(|(n, t)| tower_name(&n).map(|n| (n.to_string(), t)))
            .collect();
        let layers = layer_count(tower.keys().map(String::as_str));
        let cfg = config_from_shapes(|n| tower.get(n).map(|t| t.dims().to_vec()), layers, config)?;
        Self::new(&cfg, &Vb::from_tensors(tower, dtype, device)).map_err(|e| e.to_string())
    }
}

/// Loads the tower from `path`: a weights file or a folder holding one ([`siglip_weights_file`]).
pub fn load_siglip(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<SiglipVision, WeightsFileError> {
    let file = siglip_weights_file(path)?;
    let tensors = read_whole_file(&file)?;
    SiglipVision::from_tensors(tensors, config_beside(&file), dtype, device).map_err(|detail| {
        WeightsFileError::Mismatch {
            path: file,
            model: MODEL,
            detail,
        }
    })
}

/// What a SigLIP file is, from its header.
#[derive(Debug, Clone)]
pub struct SiglipFile {
    pub path: PathBuf,
    /// The tower's sizes (`None` when they cannot be read: a width no released tower has and no config).
    pub config: Option<SiglipVisionConfig>,
    /// It also holds a text tower (a whole SigLIP model), which is not read.
    pub text_tower: bool,
    pub dtypes: BTreeMap<String, usize>,
    pub parameter_count: u64,
    pub bytes_on_disk: u64,
}

/// The file at `path` (or the one a folder holds) as a SigLIP vision tower, named from its header; `None` for
/// anything else (a CLIP vision tower has a class embedding and a pre-norm, which SigLIP has not).
pub fn identify(path: &Path) -> Option<SiglipFile> {
    let file = if path.is_dir() {
        siglip_weights_file(path).ok()?
    } else {
        path.to_path_buf()
    };
    // Only a regular file: opening a FIFO or a device would wait or never end.
    if !std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let header = read_header(&file).ok()?;
    let shapes: HashMap<&str, &[usize]> = header
        .tensors
        .iter()
        .filter_map(|t| tower_name(&t.name).map(|n| (n, t.shape.as_slice())))
        .collect();
    let siglip = shapes.contains_key("embeddings.patch_embedding.weight")
        && shapes.contains_key("post_layernorm.weight")
        && !shapes.contains_key("embeddings.class_embedding");
    if !siglip {
        return None;
    }
    let layers = layer_count(shapes.keys().copied());
    let config = config_from_shapes(
        |n| shapes.get(n).map(|s| s.to_vec()),
        layers,
        config_beside(&file),
    )
    .ok();
    let mut dtypes = BTreeMap::new();
    for t in &header.tensors {
        *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
    }
    Some(SiglipFile {
        text_tower: header
            .tensors
            .iter()
            .any(|t| t.name.starts_with("text_model.")),
        parameter_count: header.tensors.iter().map(|t| t.numel()).sum(),
        bytes_on_disk: header.file_bytes,
        path: file,
        config,
        dtypes,
    })
}

impl fmt::Display for SiglipFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "SigLIP image encoder")?;
        match &self.config {
            Some(c) => writeln!(
                f,
                "  {:<11} {} layers, width {} ({} heads), {} tokens of {}-pixel images in {}-pixel patches",
                "tower",
                c.num_hidden_layers,
                c.hidden_size,
                c.num_attention_heads,
                c.tokens(),
                c.image_size,
                c.patch_size
            )?,
            None => writeln!(
                f,
                "  {:<11} sizes not recognised (no released SigLIP has this width; a config.json beside it names \
                 the heads)",
                "tower"
            )?,
        }
        if self.text_tower {
            writeln!(
                f,
                "  {:<11} it also holds a text tower, which is not used",
                "note"
            )?;
        }
        write_size_lines(f, &self.dtypes, self.parameter_count, self.bytes_on_disk)?;
        let released = self.config.as_ref() == Some(&SiglipVisionConfig::so400m_patch14_384());
        let usage = if released {
            "the image encoder of HunyuanVideo 1.5 image-to-video (siglip-so400m-patch14-384, FLUX.1-Redux-dev's): \
             --clip for `framesmith cache latents --i2v` and for `framesmith generate --image`"
        } else {
            "not the SigLIP HunyuanVideo 1.5 takes (siglip-so400m-patch14-384: FLUX.1-Redux-dev's image_encoder or \
             ComfyUI's sigclip_vision_patch14_384.safetensors)"
        };
        writeln!(f, "  {:<11} {usage}", "use")?;
        write!(f, "  {:<11} {}", "path", self.path.display())
    }
}
