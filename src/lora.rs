//! What `framesmith lora` and the app's LoRA tools report: `framesmith_models::lora_tools`' calls with their
//! reports as the lines the command line prints, shared by the command line and the GUI's backend.

use std::path::Path;

use anyhow::{Context, Result};
use framesmith_models::lora_tools::family::family_name;
use framesmith_models::lora_tools::{self, BlockNorms, Layout, MergeInput};
use framesmith_nn::lora::LoraFamily;

/// Converts `input` to `to`'s key layout at `output` (family detected from the names when `None`).
pub fn convert(
    input: &Path,
    output: &Path,
    to: Layout,
    family: Option<LoraFamily>,
) -> Result<Vec<String>> {
    let r = lora_tools::convert(input, output, to, family)?;
    Ok(vec![format!(
        "converted {} modules of a {} adapter from the {} layout to {}: {}",
        r.modules,
        family_name(r.family),
        r.from,
        r.to,
        output.display()
    )])
}

/// Merges `inputs` in order into a copy of `base` at `output`.
pub fn merge(base: &Path, output: &Path, inputs: &[MergeInput]) -> Result<Vec<String>> {
    let report = lora_tools::merge(base, output, inputs)?;
    let mut lines: Vec<String> = inputs
        .iter()
        .zip(&report.modules_per_file)
        .map(|(input, modules)| {
            format!(
                "merged {modules} modules at strength {}: {}",
                input.strength,
                input.path.display()
            )
        })
        .collect();
    let fp8 = match report.fp8_weights {
        0 => String::new(),
        n => format!(" ({n} FP8, quantised again)"),
    };
    lines.push(format!(
        "wrote {} changed weights{fp8}: {}",
        report.weights,
        output.display()
    ));
    Ok(lines)
}

/// Lowers `input`'s rank to `rank` at `output`, reporting the energy kept.
pub fn resize(input: &Path, output: &Path, rank: usize) -> Result<Vec<String>> {
    let report = lora_tools::resize(input, output, rank)?;
    let cut = report
        .modules
        .iter()
        .filter(|m| m.rank_after < m.rank_before)
        .count();
    let kept = report.modules.len() - cut;
    let mut lines = vec![match report.cut_energy() {
        Some((min, mean)) => format!(
            "cut {cut} modules to rank {rank}: energy kept min {:.2}%, mean {:.2}%, overall {:.2}%",
            100.0 * min,
            100.0 * mean,
            100.0 * report.overall_energy
        ),
        None => format!("no module is above rank {rank}"),
    }];
    if kept > 0 {
        lines.push(format!(
            "{kept} modules at or under rank {rank} copied unchanged"
        ));
    }
    lines.push(format!("wrote {}", output.display()));
    Ok(lines)
}

/// What `inspect` found in an adapter file.
pub struct Inspection {
    /// What the file is (kind, rank, targets, metadata), as `framesmith inspect` says it.
    pub summary: String,
    /// `‖ΔW‖` per block.
    pub norms: BlockNorms,
}

impl Inspection {
    /// The norms as lines, one per block group.
    pub fn norm_lines(&self) -> Vec<String> {
        self.norms
            .iter()
            .map(|(group, blocks)| {
                let values: Vec<String> =
                    blocks.iter().map(|(i, n)| format!("{i}: {n:.3}")).collect();
                format!("‖ΔW‖ per block, {group}: {}", values.join(", "))
            })
            .collect()
    }
}

/// What the adapter file `file` holds and its norms per block.
pub fn inspect(file: &Path) -> Result<Inspection> {
    let summary = framesmith_models::identify::identify(file)?.to_string();
    let norms = lora_tools::block_norms(file).with_context(|| {
        format!(
            "not an adapter file (`framesmith inspect` says what it is): {}",
            file.display()
        )
    })?;
    Ok(Inspection { summary, norms })
}
