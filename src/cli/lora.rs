//! `framesmith lora …`: convert, merge, resize and inspect adapter files. Parses and reports only; the work is
//! `framesmith_models::lora_tools`'.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use framesmith_models::lora_tools::family::{family_name, parse_family};
use framesmith_models::lora_tools::{self, Layout, MergeInput};
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
    match action {
        LoraAction::Convert {
            input,
            output,
            to,
            family,
        } => {
            let r = lora_tools::convert(&input, &output, to, family)?;
            println!(
                "converted {} modules of a {} adapter from the {} layout to {}: {}",
                r.modules,
                family_name(r.family),
                r.from,
                r.to,
                output.display()
            );
        }
        LoraAction::Merge {
            base,
            output,
            loras,
        } => merge(&base, &output, &loras)?,
        LoraAction::Resize {
            input,
            output,
            rank,
        } => resize(&input, &output, rank)?,
        LoraAction::Inspect { file } => inspect(&file)?,
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

fn merge(base: &Path, output: &Path, loras: &[String]) -> Result<()> {
    let inputs: Vec<MergeInput> = loras.iter().map(|a| parse_lora(a)).collect();
    let report = lora_tools::merge(base, output, &inputs)?;
    for (input, modules) in inputs.iter().zip(&report.modules_per_file) {
        println!(
            "merged {modules} modules at strength {}: {}",
            input.strength,
            input.path.display()
        );
    }
    let fp8 = match report.fp8_weights {
        0 => String::new(),
        n => format!(" ({n} FP8, quantised again)"),
    };
    println!(
        "wrote {} changed weights{fp8}: {}",
        report.weights,
        output.display()
    );
    Ok(())
}

fn resize(input: &Path, output: &Path, rank: usize) -> Result<()> {
    let report = lora_tools::resize(input, output, rank)?;
    let cut = report
        .modules
        .iter()
        .filter(|m| m.rank_after < m.rank_before)
        .count();
    let kept = report.modules.len() - cut;
    match report.cut_energy() {
        Some((min, mean)) => println!(
            "cut {cut} modules to rank {rank}: energy kept min {:.2}%, mean {:.2}%, overall {:.2}%",
            100.0 * min,
            100.0 * mean,
            100.0 * report.overall_energy
        ),
        None => println!("no module is above rank {rank}"),
    }
    if kept > 0 {
        println!("{kept} modules at or under rank {rank} copied unchanged");
    }
    println!("wrote {}", output.display());
    Ok(())
}

fn inspect(file: &Path) -> Result<()> {
    let report = framesmith_models::identify::identify(file)?;
    let norms = lora_tools::block_norms(file).with_context(|| {
        format!(
            "not an adapter file (`framesmith inspect` says what it is): {}",
            file.display()
        )
    })?;
    println!("{report}");
    for (group, blocks) in &norms {
        let values: Vec<String> = blocks.iter().map(|(i, n)| format!("{i}: {n:.3}")).collect();
        println!("‖ΔW‖ per block, {group}: {}", values.join(", "));
    }
    Ok(())
}
