//! The app's LoRA tools: `framesmith lora`'s calls (`crate::lora`) on a job thread, their reports as the app's
//! plain data. Outputs are new files only: one that exists is refused, whatever the app asked.

use std::path::Path;

use framesmith_app::{LoraLayout, LoraReport, LoraTask};
use framesmith_models::lora_tools::{Layout, MergeInput};

/// Runs `task`; errors name the file and the fix (`{:#}`).
pub(super) fn lora_tool(task: &LoraTask) -> Result<LoraReport, String> {
    let written = |lines: Vec<String>, output: &Path| LoraReport {
        lines,
        norms: Vec::new(),
        written: Some(output.to_path_buf()),
    };
    let report = match task {
        LoraTask::Inspect { file } => {
            let inspection = crate::lora::inspect(file).map_err(|err| format!("{err:#}"))?;
            LoraReport {
                lines: inspection.summary.lines().map(str::to_owned).collect(),
                norms: inspection
                    .norms
                    .into_iter()
                    .map(|(group, blocks)| (group, blocks.into_iter().collect()))
                    .collect(),
                written: None,
            }
        }
        LoraTask::Convert { input, output, to } => {
            refuse_existing(output)?;
            let lines = crate::lora::convert(input, output, layout(*to), None);
            written(lines.map_err(|err| format!("{err:#}"))?, output)
        }
        LoraTask::Resize {
            input,
            output,
            rank,
        } => {
            refuse_existing(output)?;
            let lines = crate::lora::resize(input, output, *rank);
            written(lines.map_err(|err| format!("{err:#}"))?, output)
        }
        LoraTask::Merge {
            base,
            lora,
            strength,
            output,
        } => {
            refuse_existing(output)?;
            let inputs = [MergeInput {
                path: lora.clone(),
                strength: *strength,
            }];
            let lines = crate::lora::merge(base, output, &inputs);
            written(lines.map_err(|err| format!("{err:#}"))?, output)
        }
    };
    Ok(report)
}

fn layout(layout: LoraLayout) -> Layout {
    match layout {
        LoraLayout::Musubi => Layout::Musubi,
        LoraLayout::ComfyUi => Layout::Comfyui,
        LoraLayout::Diffusers => Layout::Diffusers,
    }
}

fn refuse_existing(output: &Path) -> Result<(), String> {
    if output.exists() {
        return Err(format!(
            "the output exists already and the LoRA tools never write over a file; move it away or run the \
             tool again for a new name: {}",
            output.display()
        ));
    }
    Ok(())
}
