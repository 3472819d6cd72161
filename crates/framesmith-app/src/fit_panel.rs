//! "Will it fit?": the memory plan of the edited config before Start — the verdict, peak VRAM and RAM against
//! the budget, the blocks the planner streams, what to change when it does not fit, and the breakdown. The plan
//! comes from `Backend::plan_memory` on a job thread, recomputed with validation whenever the config changes.

use egui::{Color32, ProgressBar, RichText, Ui};

use framesmith_config::protocol::memory::{format_gib, Placement, PlanReport, Verdict};

use super::theme;

/// The latest plan, tagged with the request it answers.
#[derive(Default)]
pub struct FitView {
    latest: Option<(u64, Result<Box<PlanReport>, String>)>,
    /// The config generation and dataset TOML of the last request.
    planned_for: Option<(u64, Option<String>)>,
    requests: u64,
}

impl FitView {
    /// A new request number when the config (`generation`) or the Project tab's dataset changed since the last.
    pub fn needs_plan(&mut self, generation: u64, dataset_toml: Option<&str>) -> Option<u64> {
        let key = (generation, dataset_toml.map(str::to_owned));
        if self.planned_for.as_ref() == Some(&key) {
            return None;
        }
        self.planned_for = Some(key);
        self.requests += 1;
        Some(self.requests)
    }

    /// Keeps a plan unless a newer request's is already here (background jobs may finish out of order).
    pub fn finish(&mut self, generation: u64, result: Result<Box<PlanReport>, String>) {
        if self.latest.as_ref().is_none_or(|(g, _)| *g <= generation) {
            self.latest = Some((generation, result));
        }
    }

    /// The plan shown, if one has arrived.
    pub fn report(&self) -> Option<&PlanReport> {
        match &self.latest {
            Some((_, Ok(report))) => Some(report),
            _ => None,
        }
    }
}

/// Draws the section.
pub(super) fn fit_ui(fit: &FitView, ui: &mut Ui) {
    egui::CollapsingHeader::new("Will it fit?")
        .default_open(true)
        .show(ui, |ui| match &fit.latest {
            None => {
                ui.label(RichText::new("Planning…").color(theme::MUTED));
            }
            Some((_, Err(err))) => {
                ui.label(RichText::new(format!("No memory plan: {err}")).color(theme::MUTED));
            }
            Some((_, Ok(report))) => report_ui(ui, report),
        });
    ui.separator();
}

fn verdict_color(verdict: Verdict) -> Color32 {
    match verdict {
        Verdict::Fits => theme::GOOD,
        Verdict::DoesNotFit => theme::ERROR,
        Verdict::NoBudget => theme::MUTED,
    }
}

fn report_ui(ui: &mut Ui, r: &PlanReport) {
    ui.label(
        RichText::new(r.verdict_line())
            .color(verdict_color(r.verdict))
            .strong(),
    );
    ui.label(RichText::new(format!("{} · {}", r.model, r.workload)).color(theme::MUTED));
    if r.blocks_to_swap > 0 || r.blocks_chosen {
        let who = if r.blocks_chosen {
            " (chosen by the planner)"
        } else {
            ""
        };
        ui.label(format!(
            "Streams {} of {} blocks{who}",
            r.blocks_to_swap, r.num_blocks
        ));
    }
    if !r.on_cpu {
        bar_ui(
            ui,
            "VRAM",
            r.peak_vram_bytes,
            r.vram_budget_bytes,
            theme::VRAM,
        );
    }
    bar_ui(
        ui,
        "RAM",
        r.machine_ram_bytes(),
        r.ram_budget_bytes.or(r.host_ram_bytes),
        theme::RAM,
    );
    if r.pinned_ram_bytes > 0 {
        ui.label(
            RichText::new(format!(
                "{} of it page-locked (shown as shared GPU memory on Windows)",
                format_gib(r.pinned_ram_bytes)
            ))
            .color(theme::MUTED),
        );
    }
    for s in &r.suggestions {
        ui.label(RichText::new(format!("Try: {s}")).color(theme::WARNING));
    }
    for n in &r.notes {
        ui.label(RichText::new(n).color(theme::MUTED));
    }
    breakdown_ui(ui, r);
}

/// `used` against `limit` as a bar, or a plain line when the limit is unknown.
fn bar_ui(ui: &mut Ui, what: &str, used: u64, limit: Option<u64>, color: Color32) {
    match limit.filter(|&l| l > 0) {
        Some(limit) => {
            let fraction = used as f32 / limit as f32;
            let fill = if used > limit { theme::ERROR } else { color };
            let text = format!("{what} {} of {}", format_gib(used), format_gib(limit));
            ui.add(
                ProgressBar::new(fraction.min(1.0))
                    .fill(fill)
                    .text(text)
                    .desired_width(theme::MARK_WIDTH),
            );
        }
        None => {
            ui.label(format!("{what} {}", format_gib(used)));
        }
    }
}

fn breakdown_ui(ui: &mut Ui, r: &PlanReport) {
    egui::CollapsingHeader::new("Breakdown")
        .id_salt("fit breakdown")
        .show(ui, |ui| {
            egui::Grid::new("fit breakdown grid")
                .striped(true)
                .num_columns(3)
                .show(ui, |ui| {
                    ui.strong("Component");
                    ui.strong("VRAM");
                    ui.strong("RAM");
                    ui.end_row();
                    for line in &r.breakdown {
                        ui.label(&line.label);
                        let size = format_gib(line.bytes);
                        match line.placement {
                            Placement::Device => {
                                ui.label(size);
                                ui.label("");
                            }
                            Placement::Host => {
                                ui.label("");
                                ui.label(size);
                            }
                            Placement::HostPinned => {
                                ui.label("");
                                ui.label(format!("{size} (page-locked)"));
                            }
                        }
                        ui.end_row();
                    }
                });
        });
}
