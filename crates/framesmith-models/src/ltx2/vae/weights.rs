//! LTX-2's video VAE from its files: the official single files (`ltx-2-19b-*.safetensors`,
//! `ltx-2.3-22b-*.safetensors`: the VAE under `vae.` beside the transformer, the architecture in the `config`
//! metadata entry's `vae` section), and a VAE-only extract keeping those keys with or without the `vae.` prefix
//! (ComfyUI's split files: bare `encoder.*` / `decoder.*`). Only the VAE's tensors are read, from the mapped file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::{Ltx2Vae, Ltx2VaeConfig};
use crate::checkpoint::entries;
use crate::wan::weights::{read_header, MappedTensors, ModelFormatError};
use framesmith_nn::vb::{TensorSource, Vb};

/// The probe every layout has: the encoder's first convolution.
const PROBE: &str = "encoder.conv_in.conv.weight";

/// Why a file gives no LTX-2 video VAE.
#[derive(Debug, thiserror::Error)]
pub enum Ltx2VaeError {
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// The file holds no LTX-2 video VAE.
    #[error("this file holds no LTX-2 video VAE (no `vae.{PROBE}`); give the official ltx-2-19b-* or \
             ltx-2.3-22b-* checkpoint, which holds it: {}", path.display())]
    NoVae { path: PathBuf },

    /// The VAE's architecture is not known.
    #[error("this LTX-2 VAE's architecture cannot be read: {problem}; give the official checkpoint, whose `config` \
             metadata describes it: {}", path.display())]
    Config { problem: String, path: PathBuf },

    /// The tensors do not make the VAE the config describes.
    #[error("cannot build the LTX-2 video VAE from this file: {problem}: {}", path.display())]
    Build { problem: String, path: PathBuf },
}

/// What an LTX-2 VAE file is: where, the prefix of its VAE keys, and the architecture.
#[derive(Debug, Clone)]
pub struct Ltx2VaeFile {
    pub path: PathBuf,
    /// `"vae."` for the official files, `""` for a bare extract.
    pub prefix: &'static str,
    pub config: Ltx2VaeConfig,
    /// Elements of its tensors (the encoder's, the decoder's and the statistics).
    pub parameters: u64,
}

/// The prefix of the VAE's keys among `names`, if it has them.
fn prefix_of<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let mut found = None;
    for name in names {
        if name == format!("vae.{PROBE}") {
            return Some("vae.");
        }
        if name == PROBE {
            found = Some("");
        }
    }
    found
}

/// The architecture from a file's metadata.
fn config_of(metadata: &BTreeMap<String, String>) -> Result<Ltx2VaeConfig, String> {
    let text = metadata
        .get("config")
        .ok_or("the file carries no `config` metadata")?;
    Ltx2VaeConfig::from_metadata_config(text)
}

/// Says whether and how `path` holds LTX-2's video VAE, from its header only.
pub fn identify_vae(path: &Path) -> Result<Ltx2VaeFile, Ltx2VaeError> {
    let header = read_header(path)?;
    let prefix = prefix_of(header.tensors.iter().map(|t| t.name.as_str())).ok_or_else(|| {
        Ltx2VaeError::NoVae {
            path: path.to_path_buf(),
        }
    })?;
    let config = config_of(&header.metadata).map_err(|problem| Ltx2VaeError::Config {
        problem,
        path: path.to_path_buf(),
    })?;
    let parameters = header
        .tensors
        .iter()
        .filter(|t| {
            t.name.strip_prefix(prefix).is_some_and(|n| {
                ["encoder.", "decoder.", "per_channel_statistics."]
                    .iter()
                    .any(|p| n.starts_with(p))
            })
        })
        .map(|t| t.numel())
        .sum();
    Ok(Ltx2VaeFile {
        path: path.to_path_buf(),
        prefix,
        config,
        parameters,
    })
}

/// Loads the video VAE of `path` (an official LTX-2 / LTX-2.3 checkpoint or a VAE extract with its metadata) in
/// `dtype` on `device`, reading only its tensors.
pub fn load_ltx2_vae(path: &Path, dtype: DType, device: &Device) -> Result<Ltx2Vae, Ltx2VaeError> {
    let file = identify_vae(path)?;
    let header = read_header(path)?;
    let listed = entries(
        header
            .tensors
            .iter()
            .filter(|t| t.name.starts_with(file.prefix))
            .map(|t| (0, t)),
        Some(file.prefix),
    );
    let mapped = MappedTensors::open(&[path.to_path_buf()], &listed)?;
    let source: Arc<dyn TensorSource> = Arc::new(mapped);
    let vb = Vb::from_source(source, dtype, device);
    Ltx2Vae::new(&file.config, &vb).map_err(|e| Ltx2VaeError::Build {
        problem: e.to_string(),
        path: path.to_path_buf(),
    })
}

/// Builds the VAE of `config` from a state dict (keys with or without `vae.`).
pub fn vae_from_tensors(
    tensors: HashMap<String, Tensor>,
    config: &Ltx2VaeConfig,
    dtype: DType,
    device: &Device,
) -> Result<Ltx2Vae, String> {
    let prefix = prefix_of(tensors.keys().map(String::as_str))
        .ok_or_else(|| format!("no `{PROBE}` among the tensors"))?;
    let tensors = tensors
        .into_iter()
        .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| (k.to_string(), v)))
        .collect();
    let vb = Vb::from_tensors(tensors, dtype, device);
    Ltx2Vae::new(config, &vb).map_err(|e| e.to_string())
}
