//! `FluxFormatError`: every way a path can fail to be the FLUX.1 file that was asked for. Each message says what the
//! file is, what was expected and what to pick instead, with the path last.

use std::path::PathBuf;

use crate::wan::weights::ModelFormatError;

/// Why a path could not be used as the FLUX.1 file asked for.
#[derive(Debug, thiserror::Error)]
pub enum FluxFormatError {
    /// The file could not be read as safetensors (missing, truncated, a PyTorch file, an HTML page, …).
    #[error(transparent)]
    File(#[from] ModelFormatError),

    /// A diffusers pipeline folder (`model_index.json`, `transformer/`).
    #[error("this is a diffusers-format pipeline folder (model_index.json, transformer/), not a single FLUX.1 file; \
             give flux1-dev.safetensors from black-forest-labs/FLUX.1-dev (or ComfyUI's repackaged FLUX.1 file) \
             instead: {}", path.display())]
    DiffusersFolder { path: PathBuf },

    /// A FLUX transformer saved with diffusers key names.
    #[error("this is a FLUX.1 transformer in diffusers format (keys like `transformer_blocks.0.attn.to_q`, \
             `x_embedder`), not the official layout; give flux1-dev.safetensors from black-forest-labs/FLUX.1-dev \
             (or ComfyUI's repackaged FLUX.1 file) instead: {}", path.display())]
    DiffusersTransformer { path: PathBuf },

    /// Another FLUX.1 model than the one asked for (schnell or Kontext for dev, …).
    #[error("this is {found}, but {expected} was asked for; {fix}: {}", path.display())]
    WrongVariant {
        found: String,
        expected: String,
        fix: String,
        path: PathBuf,
    },

    /// Another FLUX.1 component (the autoencoder where the DiT was asked for, …).
    #[error("this is {found}, not {expected}; give it as the {found_role} and pick {expected_file} here: {}", path.display())]
    WrongComponent {
        found: String,
        found_role: &'static str,
        expected: String,
        expected_file: &'static str,
        path: PathBuf,
    },

    /// Weights of another model family (Wan, HunyuanVideo, umT5, …).
    #[error("this is {found}, not a FLUX.1 file; {fix}: {}", path.display())]
    OtherFamily {
        found: String,
        fix: String,
        path: PathBuf,
    },

    /// A safetensors file whose tensors match no FLUX.1 component.
    #[error("this is not a FLUX.1 file: {reason}; give flux1-dev.safetensors (DiT), ae.safetensors (autoencoder), \
             clip_l.safetensors or a t5xxl_*.safetensors text encoder: {}", path.display())]
    Unknown { reason: String, path: PathBuf },

    /// A FLUX.1 file that lacks tensors or has tensors of the wrong shape.
    #[error("this {what} file is incomplete or damaged: {problem}; download it again: {}", path.display())]
    Incomplete {
        what: String,
        problem: String,
        path: PathBuf,
    },
}
