//! `framesmith lora …`: convert, merge, resize and inspect adapter files. Parses and prints only; the work and its
//! report are `framesmith::lora`'s (which the app's LoRA tools call too).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use framesmith::lora;
use framesmith_models::lora_tools::family::parse_family;
use framesmith_models::lora_tools::{Layout, MergeInput};
use framesmith_nn::lora::LoraFamily;

/// What `framesmith lora` does.
#[derive(Subcommand, Debug)]
pub enum LoraAction {
    /// Convert an adapter between musubi-tuner (`lora_unet_…`), ComfyUI (`diffusion_model.…`) and diffusers / PEFT
    /// (`transformer.….lora_A.weight`, alphas in the `lora_adapter_metadata` header) key layouts; a round trip
    /// gives back the same tensors. LoKr, LoHa and DoRA convert between musubi-tuner and ComfyUI only
    Convert {
        input: PathBuf,
        output: PathBuf,
        /// The layout to write: musubi, comfyui or diffusers
        #[arg(long, value_parser = clap::value_parser!(Layout))]
        to: Layout,
        /// The model family, when the module names cannot tell (an unknown name lists the choices)
        #[arg(long, value_parser = parse_family)]
        family: Option<LoraFamily>,
    },
    /// Merge adapters (LoRA, LoKr, LoHa, DoRA; any layout) into a base model file, writing a new file with the
    /// base's tensors, dtypes and metadata. bf16, f16 and f32 weights get W + strength·ΔW rounded once to their
    /// dtype; FP8 weights are dequantised, merged and quantised again with the file's own scale layout (new
    /// scales), so each merged FP8 weight is rounded a second time. Streams one tensor at a time; never writes
    /// over the base
    Merge {
        base: PathBuf,
        output: PathBuf,
        /// An adapter to merge, with its strength (default 1); repeat for several, merged in order
        #[arg(long = "lora", value_name = "FILE[:STRENGTH]", required = true)]
        loras: Vec<String>,
    },
    /// Lower a LoRA's (or DoRA's) rank by the SVD of each module's up · down, with alpha rescaled so the scale
    /// stays; reports the share of ‖ΔW‖² kept. Modules already at or under the rank are copied unchanged, so
    /// resizing to the same rank changes nothing. LoKr and LoHa are refused
    Resize {
        input: PathBuf,
        output: PathBuf,
        /// The rank to cut to
        #[arg(long)]
        rank: usize,
    },
    /// What an adapter file holds (kind, rank, targets, metadata) and the norm of its weight change per block
    Inspect { file: PathBuf },
}

/// Runs `action`, printing what it did.
pub fn run(action: LoraAction) -> Result<ExitCode> {
    let lines = match action {
        LoraAction::Convert {
            input,
            output,
            to,
            family,
        } => lora::convert(&input, &output, to, family)?,
        LoraAction::Merge {
            base,
            output,
            loras,
        } => {
            let inputs: Vec<MergeInput> = loras.iter().map(|a| parse_lora(a)).collect();
            lora::merge(&base, &output, &inputs)?
        }
        LoraAction::Resize {
            input,
            output,
            rank,
        } => lora::resize(&input, &output, rank)?,
        LoraAction::Inspect { file } => {
            let inspection = lora::inspect(&file)?;
            let mut lines = vec![inspection.summary.clone()];
            lines.extend(inspection.norm_lines());
            lines
        }
    };
    for line in lines {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `FILE[:STRENGTH]`: a trailing `:number` is the strength, anything else is part of the path.
fn parse_lora(arg: &str) -> MergeInput {
    if let Some((path, strength)) = arg.rsplit_once(':') {
        if let Ok(strength) = strength.parse::<f64>() {
            return MergeInput {
                path: PathBuf::from(path),
                strength,
            };
        }
    }
    MergeInput {
        path: PathBuf::from(arg),
        strength: 1.0,
    }
}
