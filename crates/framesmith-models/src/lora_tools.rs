//! `framesmith lora`: the tools people use on adapter files. `merge` folds adapters into a base model file,
//! `convert` moves one between musubi-tuner's, ComfyUI's and diffusers' key layouts, `resize` lowers its rank
//! and `norms` measures it per block. Family-neutral routing: each family's key mapping lives in its folder
//! (`wan/lora_keys.rs`, `hunyuan_video15/lora_keys.rs`, FLUX.1's in `framesmith_nn::lora_file`).

pub mod convert;
pub mod family;
mod fp8;
pub mod merge;
pub mod norms;
pub mod resize;
mod svd;
#[cfg(test)]
mod tests;

use std::fs;
use std::path::Path;

use anyhow::{bail, Result};

pub use convert::{convert, ConvertReport, Layout};
pub use merge::{merge, MergeInput, MergeReport};
pub use norms::{block_norms, BlockNorms};
pub use resize::{resize, ModuleResize, ResizeReport};

/// Refuses an output that is the input (by path, or the same file through another path or link): the tools
/// never overwrite their input.
fn refuse_same_file(input: &Path, out: &Path, verb: &str) -> Result<()> {
    let same = match (fs::canonicalize(input), fs::canonicalize(out)) {
        (Ok(a), Ok(b)) => a == b,
        _ => input == out,
    };
    if same {
        bail!(
            "the output is the input itself; `lora {verb}` never overwrites its input, so name a new file: {}",
            out.display()
        );
    }
    Ok(())
}
