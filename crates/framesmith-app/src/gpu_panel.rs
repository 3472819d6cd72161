//! The Train tab's GPU picker: the GPUs the telemetry sees (index, name, memory, what other processes use), the
//! ones the next run trains on, and what that means: one GPU, or one process per GPU as `framesmith train --gpus`
//! starts them. The choice itself is plain data, kept in the settings and in each queued run.

use egui::{RichText, Ui};

use framesmith_telemetry::{GpuSample, Telemetry};

use super::standalone::format_bytes;
use super::theme;

/// Memory other processes hold on a GPU above which the picker marks it busy (a desktop's own use stays below).
pub const BUSY_BYTES: u64 = 2 << 30;

/// What the picker knows of the machine's GPUs.
pub(super) struct GpuPicker<'a> {
    /// The latest telemetry sample's GPUs (empty: none found, or telemetry is off).
    pub seen: &'a [GpuSample],
    /// Why there are none, when there are none.
    pub status: Result<(), String>,
}

/// The GPUs `telemetry` sees now (none when it is off), and why there are none.
pub(super) fn seen_gpus(telemetry: Option<&Telemetry>) -> (Vec<GpuSample>, Result<(), String>) {
    match telemetry {
        Some(telemetry) => telemetry.read(|h| {
            let gpus = h.latest().map(|s| s.gpus.clone()).unwrap_or_default();
            (gpus, h.gpu_status.clone())
        }),
        None => (
            Vec::new(),
            Err("No GPU readings: telemetry is off in this session".into()),
        ),
    }
}

/// Memory on `gpu` held by processes other than the run's (the app and its rank processes).
pub fn others_bytes(gpu: &GpuSample) -> u64 {
    gpu.memory_used_bytes
        .saturating_sub(gpu.process_memory_bytes.unwrap_or(0))
}

/// Whether other processes hold more than [`BUSY_BYTES`] of `gpu`.
pub fn is_busy(gpu: &GpuSample) -> bool {
    others_bytes(gpu) > BUSY_BYTES
}

/// One line per GPU: "GPU 1 · NVIDIA H100 · 80 GiB · 30 GiB used by other processes (busy)".
pub fn gpu_line(gpu: &GpuSample) -> String {
    let mut line = format!(
        "GPU {} · {} · {} · {} used by other processes",
        gpu.index,
        gpu.name,
        format_bytes(gpu.memory_total_bytes),
        format_bytes(others_bytes(gpu))
    );
    if is_busy(gpu) {
        line += " (busy)";
    }
    line
}

/// The GPUs a run trains on: the chosen ones the telemetry sees, in index order (rank 0 on the first); none when
/// it sees no GPU, and the run trains as its config says (`training.device`).
pub fn gpus_for_run(chosen: &[usize], seen: &[GpuSample]) -> Vec<usize> {
    let mut gpus: Vec<usize> = chosen
        .iter()
        .copied()
        .filter(|&c| seen.iter().any(|g| g.index as usize == c))
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

/// What a run on `gpus` will be, in one line.
pub fn run_line(gpus: &[usize], seen_any: bool) -> String {
    match gpus {
        [] if !seen_any => {
            "No NVIDIA GPU found: the run trains on the CPU, as its config says".into()
        }
        [] => "No GPU chosen: the run trains on the config's training.device".into(),
        [one] => format!("Trains on GPU {one}"),
        many => {
            let list = many
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            format!(
                "Trains on GPUs {}: one process per GPU, world size {} (as framesmith train --gpus {list})",
                list.replace(',', ", "),
                many.len()
            )
        }
    }
}

/// Draws the picker; ticking a GPU adds it to `chosen`.
pub(super) fn gpu_picker_ui(picker: &GpuPicker, chosen: &mut Vec<usize>, ui: &mut Ui) {
    ui.heading("GPUs");
    if picker.seen.is_empty() {
        if let Err(reason) = &picker.status {
            ui.label(RichText::new(reason).color(theme::MUTED));
        }
    }
    for gpu in picker.seen {
        let index = gpu.index as usize;
        let mut on = chosen.contains(&index);
        let mut text = RichText::new(gpu_line(gpu));
        if is_busy(gpu) {
            text = text.color(theme::WARNING);
        }
        let mut response = ui.checkbox(&mut on, text);
        if is_busy(gpu) {
            response = response.on_hover_text(
                "Another program holds this GPU's memory: a run here may not fit, or slows both",
            );
        }
        if response.changed() {
            chosen.retain(|&c| c != index);
            if on {
                chosen.push(index);
                chosen.sort_unstable();
            }
        }
    }
    let gpus = gpus_for_run(chosen, picker.seen);
    ui.label(RichText::new(run_line(&gpus, !picker.seen.is_empty())).color(theme::MUTED));
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, used: u64, ours: Option<u64>) -> GpuSample {
        GpuSample {
            index,
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_used_bytes: used,
            memory_total_bytes: 80 * GIB,
            process_memory_bytes: ours,
            ..GpuSample::default()
        }
    }

    #[test]
    fn a_gpu_whose_memory_others_hold_is_marked_busy() {
        let idle = gpu(0, GIB / 2, None);
        assert!(!is_busy(&idle));
        assert_eq!(
            gpu_line(&idle),
            "GPU 0 · NVIDIA H100 80GB HBM3 · 80 GiB · 512 MiB used by other processes"
        );
        // Our own run's memory is not another process's.
        assert!(!is_busy(&gpu(1, 60 * GIB, Some(59 * GIB))));
        let taken = gpu(2, 30 * GIB, Some(GIB));
        assert!(is_busy(&taken));
        assert!(gpu_line(&taken).ends_with("29 GiB used by other processes (busy)"));
    }

    #[test]
    fn the_choice_becomes_the_runs_gpus_in_order() {
        let seen: Vec<GpuSample> = (0..4).map(|i| gpu(i, 0, None)).collect();
        assert_eq!(gpus_for_run(&[3, 1, 3], &seen), vec![1, 3]);
        // A GPU chosen on another machine, or no GPU at all, trains as the config says.
        assert_eq!(gpus_for_run(&[7], &seen), Vec::<usize>::new());
        assert_eq!(gpus_for_run(&[0, 1], &[]), Vec::<usize>::new());
        assert_eq!(
            run_line(&[0, 1, 2, 3], true),
            "Trains on GPUs 0, 1, 2, 3: one process per GPU, world size 4 (as framesmith train --gpus 0,1,2,3)"
        );
        assert_eq!(run_line(&[2], true), "Trains on GPU 2");
        assert!(run_line(&[], false).starts_with("No NVIDIA GPU found"));
        assert!(run_line(&[], true).starts_with("No GPU chosen"));
    }
}
