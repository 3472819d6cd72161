//! Where an LTX-2 transformer's tensors are in its files: ltx-core's names (the official single files, bare or
//! under `model.diffusion_model.` / ComfyUI's `diffusion_model.`) or diffusers' (`proj_in`, `time_embed`,
//! `prompt_adaln`, `norm_q` / `norm_k`; everything else the same), read under ltx-core's names
//! ([`DiffusersSource`]); and which files and metadata a path holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Result, Shape, Tensor};

use super::weights::Ltx2FormatError;
use crate::wan::weights::read_header;
use framesmith_nn::vb::TensorSource;

/// The key layout of a transformer file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// ltx-core's names under `prefix` (`model.diffusion_model.`, `diffusion_model.` or none).
    LtxCore { prefix: String },
    /// diffusers' `LTX2VideoTransformer3DModel`.
    Diffusers,
}

impl Layout {
    /// The stored name of the tensor ltx-core calls `name`.
    pub fn stored(&self, name: &str) -> String {
        match self {
            Self::LtxCore { prefix } => format!("{prefix}{name}"),
            Self::Diffusers => diffusers_name(name),
        }
    }

    /// How `inspect` says it.
    pub fn label(&self) -> String {
        match self {
            Self::LtxCore { prefix } if prefix == "model.diffusion_model." => {
                "official single file (ltx-core names under model.diffusion_model.; ComfyUI loads it as is)".into()
            }
            Self::LtxCore { prefix } if prefix.is_empty() => "ltx-core names, no prefix".into(),
            Self::LtxCore { prefix } => format!("ltx-core names under {prefix}"),
            Self::Diffusers => "diffusers (LTX2VideoTransformer3DModel)".into(),
        }
    }
}

/// diffusers' name of the video-stream tensor ltx-core calls `name` (the inverse of diffusers'
/// `convert_ltx2_to_diffusers.py` renames).
pub fn diffusers_name(name: &str) -> String {
    let name = if let Some(rest) = name.strip_prefix("patchify_proj.") {
        format!("proj_in.{rest}")
    } else if let Some(rest) = name.strip_prefix("adaln_single.") {
        format!("time_embed.{rest}")
    } else if let Some(rest) = name.strip_prefix("prompt_adaln_single.") {
        format!("prompt_adaln.{rest}")
    } else {
        name.to_string()
    };
    name.replace(".q_norm.", ".norm_q.")
        .replace(".k_norm.", ".norm_k.")
}

/// A diffusers transformer's tensors read under ltx-core's names.
pub struct DiffusersSource {
    inner: Arc<dyn TensorSource>,
}

impl DiffusersSource {
    pub fn new(inner: Arc<dyn TensorSource>) -> Self {
        Self { inner }
    }
}

impl TensorSource for DiffusersSource {
    fn contains(&self, key: &str) -> bool {
        self.inner.contains(&diffusers_name(key))
    }

    fn read(&self, key: &str) -> Result<Option<Tensor>> {
        self.inner.read(&diffusers_name(key))
    }

    fn read_shaped(&self, key: &str, shape: &Shape) -> Result<Option<Tensor>> {
        self.inner.read_shaped(&diffusers_name(key), shape)
    }

    fn read_fp8_codes(&self, key: &str) -> Result<Option<Tensor>> {
        self.inner.read_fp8_codes(&diffusers_name(key))
    }
}

/// The safetensors files at `path` (the file itself, or a folder's `*.safetensors` sorted by name), the first
/// file's metadata, and a folder's `config.json` (diffusers' sizes).
pub(crate) type PathFiles = (Vec<PathBuf>, BTreeMap<String, String>, Option<String>);

/// [`PathFiles`] of `path`.
pub(crate) fn files_of(path: &Path) -> std::result::Result<PathFiles, Ltx2FormatError> {
    let not = || Ltx2FormatError::NotLtx2 {
        path: path.to_path_buf(),
    };
    if !path.is_dir() {
        let metadata = read_header(path)?.metadata;
        return Ok((vec![path.to_path_buf()], metadata, None));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|_| not())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let config = std::fs::read_to_string(path.join("config.json")).ok();
    if files.is_empty() || config.is_none() {
        return Err(not());
    }
    Ok((files, BTreeMap::new(), config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffusers_names_follow_the_conversion_script() {
        for (ours, theirs) in [
            ("patchify_proj.weight", "proj_in.weight"),
            (
                "adaln_single.emb.timestep_embedder.linear_1.bias",
                "time_embed.emb.timestep_embedder.linear_1.bias",
            ),
            (
                "prompt_adaln_single.linear.weight",
                "prompt_adaln.linear.weight",
            ),
            (
                "transformer_blocks.3.attn2.k_norm.weight",
                "transformer_blocks.3.attn2.norm_k.weight",
            ),
            (
                "transformer_blocks.3.attn1.to_out.0.weight",
                "transformer_blocks.3.attn1.to_out.0.weight",
            ),
            (
                "caption_projection.linear_1.weight",
                "caption_projection.linear_1.weight",
            ),
        ] {
            assert_eq!(diffusers_name(ours), theirs);
        }
        let layout = Layout::LtxCore {
            prefix: "model.diffusion_model.".into(),
        };
        assert_eq!(
            layout.stored("proj_out.bias"),
            "model.diffusion_model.proj_out.bias"
        );
    }
}
