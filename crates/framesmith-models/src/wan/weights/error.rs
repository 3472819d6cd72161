//! `ModelFormatError`: every way a path can fail to be the Wan DiT checkpoint that was asked for. Each message says
//! what the file is, what was expected and how to fix it, with the path last.

use std::fmt;
use std::path::PathBuf;

/// Why a checkpoint path could not be read as a Wan DiT.
#[derive(Debug, thiserror::Error)]
pub enum ModelFormatError {
    /// Nothing exists at the path.
    #[error("no file or folder at this path; check the spelling, or download the weights first: {}", path.display())]
    NotFound { path: PathBuf },

    /// The file or folder exists but could not be read.
    #[error("cannot read this ({cause}); check the file's permissions and that its disk is still attached: {}", path.display())]
    Unreadable {
        cause: std::io::Error,
        path: PathBuf,
    },

    /// A FIFO, device or socket where a model file or folder belongs: never opened (it would block or never end).
    #[error("this is {what}, not a model file: give the path of the .safetensors (or .pth) file, or of its folder: {}", path.display())]
    NotAFile { what: &'static str, path: PathBuf },

    /// A zero-byte file.
    #[error("the file is empty (0 bytes), probably an interrupted download; download it again: {}", path.display())]
    Empty { path: PathBuf },

    /// The header or the tensor data run past the end of the file.
    #[error("the file is cut short: {detail}; it is probably an interrupted download or copy, download it again: {}", path.display())]
    Truncated { detail: String, path: PathBuf },

    /// Not a safetensors file at all.
    #[error("{kind}: {}", path.display())]
    NotSafetensors { kind: NotSafetensors, path: PathBuf },

    /// A safetensors file whose JSON header is malformed or inconsistent.
    #[error("the safetensors header is damaged ({reason}); download the file again: {}", path.display())]
    BadHeader { reason: String, path: PathBuf },

    /// A tensor stored in a number format Framesmith cannot compute with.
    #[error("tensor `{tensor}` is stored as {dtype}, which Framesmith cannot read; use the bf16, fp16 or float8_e4m3fn release of these weights: {}", path.display())]
    UnsupportedDtype {
        tensor: String,
        dtype: String,
        path: PathBuf,
    },

    /// A diffusers pipeline folder (`model_index.json`, `transformer/`).
    #[error("this is a diffusers-format pipeline folder (model_index.json, transformer/), not the official Wan layout; download the official Wan-AI repository (the one without `-Diffusers` in its name) or a ComfyUI repackaged diffusion model file: {}", path.display())]
    DiffusersFolder { path: PathBuf },

    /// A Wan transformer saved with diffusers key names.
    #[error("this is a Wan transformer in diffusers format (keys like `condition_embedder.` and `blocks.0.attn1.to_q`), not the official Wan key layout; download the official Wan-AI repository (the one without `-Diffusers` in its name) or a ComfyUI repackaged diffusion model file: {}", path.display())]
    DiffusersTransformer { path: PathBuf },

    /// Weights of another model family, or another component of Wan.
    #[error("this is {what}, not a Wan diffusion transformer (DiT); {}: {}", what.fix(), path.display())]
    NotTheDit { what: ForeignModel, path: PathBuf },

    /// Safetensors whose tensors match no known model.
    #[error("this is not a Wan diffusion transformer: {reason}; point to the DiT weights (diffusion_pytorch_model*.safetensors, or a file from ComfyUI's models/diffusion_models): {}", path.display())]
    UnknownModel { reason: String, path: PathBuf },

    /// A Wan DiT checkpoint that lacks tensors or has tensors of the wrong shape.
    #[error("this Wan DiT checkpoint ({variant}) is incomplete or damaged: {problem}; download it again: {}", path.display())]
    Incomplete {
        variant: String,
        problem: String,
        path: PathBuf,
    },

    /// An image-to-video model where a text-to-video one was asked for, or the reverse.
    #[error("this is {found}, but {expected} was asked for; choose weights of the requested kind or switch the run to {found_kind}: {}", path.display())]
    WrongTask {
        found: String,
        expected: String,
        found_kind: &'static str,
        path: PathBuf,
    },

    /// A Wan DiT of another size or generation than the one asked for.
    #[error("this is {found}, but {expected} was asked for; choose the matching weights or switch the run's model to {found}: {}", path.display())]
    WrongVariant {
        found: String,
        expected: String,
        path: PathBuf,
    },

    /// The shard index names a file that is not in the folder.
    #[error("the shard `{shard}` is missing from the folder ({detail}), probably an incomplete download; download the missing file into the folder: {}", path.display())]
    MissingShard {
        shard: String,
        detail: String,
        path: PathBuf,
    },

    /// The shard index file is malformed or disagrees with the shards.
    #[error("the shard index is damaged ({reason}); download the index file and its shards again: {}", path.display())]
    BadIndex { reason: String, path: PathBuf },

    /// A folder with no safetensors weights in it.
    #[error("the folder holds no .safetensors weights{found}; point to the folder with diffusion_pytorch_model*.safetensors or to a single .safetensors file: {}", path.display())]
    NoWeights { found: String, path: PathBuf },

    /// A folder with several unrelated checkpoints.
    #[error("the folder holds several separate checkpoints ({files}); pass the one file to use: {}", path.display())]
    SeveralCheckpoints { files: String, path: PathBuf },

    /// The root folder of a Wan2.2 A14B download, which holds two experts.
    #[error("this is a Wan2.2 A14B folder with two experts (high_noise_model/ and low_noise_model/); pass one expert's folder: {}", path.display())]
    TwoExperts { path: PathBuf },

    /// A PyTorch `.pth` file that the safe pickle reader cannot read.
    #[error("this PyTorch file cannot be read: {reason}; convert it to .safetensors, or download the official .pth release or ComfyUI's repackaged .safetensors: {}", path.display())]
    UnreadablePickle { reason: String, path: PathBuf },

    /// Reading tensor data failed after the header was accepted.
    #[error("could not load the tensor data ({reason}); check free memory and download the file again if this repeats: {}", path.display())]
    Load { reason: String, path: PathBuf },
}

/// What a non-safetensors file turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotSafetensors {
    /// A PyTorch zip archive (`.pth` / `.pt` / `.ckpt` saved by `torch.save`).
    PyTorchZip,
    /// A legacy PyTorch pickle.
    PyTorchPickle,
    /// A GGUF file (llama.cpp / ComfyUI-GGUF quantised weights).
    Gguf,
    /// A Git LFS pointer stub instead of the real file.
    LfsPointer,
    /// An HTML page saved by a failed download.
    Html,
    /// Some other text file; holds its first line (shortened).
    Text(String),
    /// Unrecognised binary content; holds the first bytes in hex.
    Unknown(String),
}

impl fmt::Display for NotSafetensors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PyTorchZip => f.write_str(
                "this is a PyTorch archive (.pth/.pt, zip format), not safetensors; Framesmith reads the DiT only \
                 from .safetensors, so download the safetensors release (the official Wan-AI repository or ComfyUI's \
                 repackaged files)",
            ),
            Self::PyTorchPickle => f.write_str(
                "this is a legacy PyTorch pickle (.pth/.bin), not safetensors; Framesmith reads the DiT only from \
                 .safetensors, so download the safetensors release (the official Wan-AI repository or ComfyUI's \
                 repackaged files)",
            ),
            Self::Gguf => f.write_str(
                "this is a GGUF file (quantised weights for llama.cpp / ComfyUI-GGUF), not safetensors; Framesmith \
                 trains from safetensors, so use the bf16, fp16 or fp8 .safetensors release",
            ),
            Self::LfsPointer => f.write_str(
                "this is a Git LFS pointer (a small text stub), not the weights; run `git lfs pull` in the cloned \
                 repository or download the file from the model page",
            ),
            Self::Html => f.write_str(
                "this is a web page (HTML), not weights: the download saved an error or login page; download the \
                 file again (log in to Hugging Face first if the repository asks for it)",
            ),
            Self::Text(first_line) => write!(
                f,
                "this is a text file (it starts with \"{first_line}\"), not safetensors weights; point to the \
                 .safetensors file"
            ),
            Self::Unknown(hex) => write!(
                f,
                "this is not a safetensors file (its first bytes are {hex}); point to the .safetensors weights"
            ),
        }
    }
}

/// A model that is not the Wan DiT, recognised from its tensor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignModel {
    /// The Wan 2.1 / 2.2 video VAE.
    WanVae,
    /// Another VAE (encoder / decoder weights).
    Vae,
    /// The umT5 text encoder (official or Hugging Face key names).
    Umt5,
    /// A CLIP vision encoder (used by Wan2.1 I2V for image tokens).
    ClipVision,
    /// A LoRA adapter.
    Lora,
    /// HunyuanVideo's transformer.
    HunyuanVideo,
    /// FLUX's transformer.
    Flux,
    /// The AdamW moments of a training state (`optimizer.safetensors`).
    OptimizerState,
    /// A dataset item's VAE latents, as `framesmith cache latents` writes them (Wan or FLUX.1).
    LatentCache,
    /// A caption's text-encoder output, as `framesmith cache text` writes it (Wan or FLUX.1).
    TextCache,
}

impl ForeignModel {
    /// The sentence fragment that says what to do instead.
    pub fn fix(self) -> &'static str {
        match self {
            Self::WanVae | Self::Vae | Self::Umt5 | Self::ClipVision => {
                "give the DiT file here (diffusion_pytorch_model*.safetensors, or a file from ComfyUI's \
                 models/diffusion_models) and this file under its own setting"
            }
            Self::Lora => {
                "a LoRA goes on top of a base model: give the base Wan DiT here and the LoRA under the LoRA settings"
            }
            Self::HunyuanVideo => {
                "Framesmith trains Wan 2.1 / 2.2 and FLUX.1: download a Wan DiT (the official Wan-AI repository or \
                 ComfyUI's repackaged files)"
            }
            Self::Flux => {
                "give a Wan DiT for a Wan run (the official Wan-AI repository or ComfyUI's repackaged files), or pick \
                 the FLUX.1 model family to use this file"
            }
            Self::OptimizerState => {
                "it belongs in its training state folder, which `framesmith train --resume` reads; give the base Wan \
                 DiT here"
            }
            Self::LatentCache | Self::TextCache => {
                "training reads caches from the dataset's cache_directory; give the base Wan DiT here"
            }
        }
    }
}

impl fmt::Display for ForeignModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::WanVae => "the Wan VAE (video encoder/decoder)",
            Self::Vae => "a VAE (encoder/decoder weights)",
            Self::Umt5 => "the umT5 text encoder",
            Self::ClipVision => "a CLIP vision encoder",
            Self::Lora => "a LoRA adapter",
            Self::HunyuanVideo => "HunyuanVideo weights (keys like `double_blocks.0.img_attn_qkv`)",
            Self::Flux => {
                "FLUX weights (keys like `double_blocks`, `single_blocks.0.linear1`, `img_in`)"
            }
            Self::OptimizerState => {
                "the AdamW optimizer state of a training checkpoint (not a LoRA)"
            }
            Self::LatentCache => "a latent cache (one dataset item's VAE latents)",
            Self::TextCache => "a text-encoder cache (one caption's encoded text)",
        })
    }
}
