//! The Monitor tab: the system check, VRAM (a chart per GPU), RAM and (on Windows) shared GPU memory charts from
//! the telemetry history, per-GPU readings, and the spilling warning. "Framesmith" is the run's own memory: the
//! app's and its rank processes'.

use egui::{RichText, Ui};

use framesmith_telemetry::{GpuSample, History, Sample, SpillWarning, Telemetry};

use super::charts::{chart_ui, Series};
use super::standalone::format_bytes;
use super::system_check_panel::{system_check_ui, SystemCheckView};
use super::theme;

const GIB: f64 = (1u64 << 30) as f64;

/// Draws the Monitor tab.
pub fn monitor_ui(
    ui: &mut Ui,
    system_check: &mut SystemCheckView,
    telemetry: Option<&Telemetry>,
    spill: Option<&SpillWarning>,
) {
    if let Some(spill) = spill {
        spill_banner_ui(ui, spill);
    }
    system_check_ui(system_check, ui);
    let Some(telemetry) = telemetry else {
        ui.label("Telemetry is off in this session");
        return;
    };
    let processes = telemetry.counted_processes().len();
    telemetry.read(|history| {
        gpu_ui(ui, history, processes);
        ui.separator();
        ram_ui(ui, history);
        ui.separator();
        shared_ui(ui, history);
    });
}

/// The red line shown when the driver spills; also used by the Train tab.
pub fn spill_banner_ui(ui: &mut Ui, spill: &SpillWarning) {
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.label(
            RichText::new(spill.message())
                .color(theme::WARNING)
                .strong(),
        );
    });
}

/// x = seconds before the latest sample (negative), so the charts scroll.
fn series(history: &History, value: impl Fn(&Sample) -> Option<f64>) -> Vec<[f64; 2]> {
    let now = history.latest().map_or(0.0, |s| s.at_secs);
    history
        .iter()
        .filter_map(|s| value(s).map(|v| [s.at_secs - now, v]))
        .collect()
}

/// One line per GPU, the run's memory over all GPUs and processes, and a VRAM chart per GPU.
fn gpu_ui(ui: &mut Ui, history: &History, processes: usize) {
    ui.heading("GPU");
    if let Err(reason) = &history.gpu_status {
        ui.label(format!("GPU charts are off: {reason}"));
        return;
    }
    let Some(latest) = history.latest() else {
        return;
    };
    for gpu in &latest.gpus {
        // Under a VRAM budget the card reads as one of the budget's size: the hold is no one's memory.
        let budget = if gpu.budget_hold.is_some() {
            " budget"
        } else {
            ""
        };
        let mut line = format!(
            "GPU {} · {} · {} of {}{budget}",
            gpu.index,
            gpu.name,
            format_bytes(gpu.used_without_hold()),
            format_bytes(gpu.card_bytes())
        );
        if let Some(ours) = gpu.process_without_hold() {
            line += &format!(" (Framesmith {})", format_bytes(ours));
        }
        if let Some(hold) = gpu.budget_hold {
            line += &format!(" · {} held back", format_bytes(hold.held_bytes));
        }
        if let Some(util) = gpu.utilization_percent {
            line += &format!(" · {util}% busy");
        }
        if let Some(temp) = gpu.temperature_celsius {
            line += &format!(" · {temp} °C");
        }
        if let Some(watts) = gpu.power_watts {
            line += &format!(" · {watts:.0} W");
        }
        if let (Some(tx), Some(rx)) = (gpu.pcie_tx_bytes_per_sec, gpu.pcie_rx_bytes_per_sec) {
            line += &format!(
                " · PCIe out {}/s, in {}/s",
                format_bytes(tx),
                format_bytes(rx)
            );
        }
        ui.label(line);
    }
    if let Some(ours) = latest
        .gpus
        .iter()
        .filter_map(GpuSample::process_without_hold)
        .reduce(|a, b| a + b)
    {
        let across = if latest.gpus.len() > 1 {
            " on all GPUs"
        } else {
            ""
        };
        let count = if processes > 1 {
            format!(" ({processes} processes)")
        } else {
            String::new()
        };
        ui.label(format!("Framesmith{across}: {}{count}", format_bytes(ours)));
    }
    // One chart per GPU: a run over several GPUs fills each, and a busy one stands out.
    for gpu in &latest.gpus {
        gpu_chart_ui(ui, history, gpu.index, gpu.card_bytes());
    }
}

/// The VRAM chart of the GPU `index`: all its memory in use, and the run's (all of the run's processes).
fn gpu_chart_ui(ui: &mut Ui, history: &History, index: u32, total_bytes: u64) {
    let on_gpu = |s: &Sample| -> Option<(u64, Option<u64>)> {
        s.gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| (g.used_without_hold(), g.process_without_hold()))
    };
    ui.label(RichText::new(format!("VRAM of GPU {index}")).color(theme::MUTED));
    chart_ui(
        ui,
        &format!("vram chart {index}"),
        "VRAM (GiB)",
        vec![
            Series {
                name: "VRAM used",
                color: theme::VRAM,
                points: series(history, |s| on_gpu(s).map(|(used, _)| used as f64 / GIB)),
            },
            Series {
                name: "Framesmith",
                color: theme::VRAM_PROCESS,
                points: series(history, |s| {
                    on_gpu(s).and_then(|(_, ours)| ours).map(|b| b as f64 / GIB)
                }),
            },
        ],
        Some(total_bytes as f64 / GIB),
    );
}

fn ram_ui(ui: &mut Ui, history: &History) {
    ui.heading("RAM");
    let Some(latest) = history.latest() else {
        ui.label("Waiting for the first sample");
        return;
    };
    ui.label(format!(
        "{} of {} used · Framesmith {}",
        format_bytes(latest.ram_used_bytes),
        format_bytes(latest.ram_total_bytes),
        format_bytes(latest.process_resident_bytes)
    ));
    chart_ui(
        ui,
        "ram chart",
        "RAM (GiB)",
        vec![
            Series {
                name: "RAM used",
                color: theme::RAM,
                points: series(history, |s| Some(s.ram_used_bytes as f64 / GIB)),
            },
            Series {
                name: "Framesmith resident",
                color: theme::RAM_PROCESS,
                points: series(history, |s| Some(s.process_resident_bytes as f64 / GIB)),
            },
        ],
        Some(latest.ram_total_bytes as f64 / GIB),
    );
}

fn shared_ui(ui: &mut Ui, history: &History) {
    ui.heading("Shared GPU memory");
    if let Err(reason) = &history.shared_status {
        ui.label(RichText::new(format!("Not charted: {reason}")).color(theme::MUTED));
        return;
    }
    ui.label("System RAM the Windows driver maps for the GPU; growth here while VRAM is full means spilling");
    chart_ui(
        ui,
        "shared chart",
        "Shared (GiB)",
        vec![
            Series {
                name: "All processes",
                color: theme::SHARED,
                points: series(history, |s| s.shared.map(|m| m.adapter_bytes as f64 / GIB)),
            },
            Series {
                name: "Framesmith",
                color: theme::SHARED_PROCESS,
                points: series(history, |s| s.shared.map(|m| m.process_bytes as f64 / GIB)),
            },
        ],
        None,
    );
}
