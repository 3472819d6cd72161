//! "System check" at the top of the Monitor tab: the report of `framesmith doctor` — GPU, driver, CUDA libraries,
//! attention, memory, ffmpeg, the output folder's disk — with each problem and its fix, in the same words as the
//! command line. Asked of `Backend::system_check` on a job thread when the tab is first shown and again on
//! "Check again".

use egui::{RichText, Ui};

use framesmith_config::protocol::doctor::{Severity, SystemReport};

use super::theme;

/// The latest check and whether one is due or running.
#[derive(Default)]
pub struct SystemCheckView {
    latest: Option<Result<Box<SystemReport>, String>>,
    running: bool,
    /// "Check again" was clicked.
    again: bool,
    /// A check that found a blocking problem opens the section once.
    open_once: bool,
}

impl SystemCheckView {
    /// Whether to start a check now (none yet, or "Check again"); marks it running.
    pub fn needs_check(&mut self) -> bool {
        let due = !self.running && (self.latest.is_none() || self.again);
        if due {
            self.running = true;
            self.again = false;
        }
        due
    }

    /// Keeps the answer of the check that was running.
    pub fn finish(&mut self, result: Result<Box<SystemReport>, String>) {
        self.running = false;
        self.open_once = result.as_ref().is_ok_and(|r| r.blocks_training());
        self.latest = Some(result);
    }

    /// The report shown, once one has arrived.
    pub fn report(&self) -> Option<&SystemReport> {
        match &self.latest {
            Some(Ok(report)) => Some(report),
            _ => None,
        }
    }
}

/// Draws the section: the verdict in the header, the problems with their fixes, then the facts.
pub(super) fn system_check_ui(view: &mut SystemCheckView, ui: &mut Ui) {
    let (title, color) = match &view.latest {
        None => ("System check · checking…".to_owned(), theme::MUTED),
        Some(Err(_)) => ("System check · not available".to_owned(), theme::MUTED),
        Some(Ok(report)) if report.blocks_training() => (
            format!("System check · {}", report.verdict_line()),
            theme::ERROR,
        ),
        Some(Ok(report)) => (
            format!("System check · {}", report.verdict_line()),
            theme::GOOD,
        ),
    };
    // Closed while all is well; opened (once, so it can be closed again) when something blocks training.
    let open = std::mem::take(&mut view.open_once).then_some(true);
    egui::CollapsingHeader::new(RichText::new(title).color(color).strong())
        .id_salt("system check")
        .open(open)
        .show(ui, |ui| {
            match &view.latest {
                None => {
                    ui.label(RichText::new("Checking this machine…").color(theme::MUTED));
                }
                Some(Err(err)) => {
                    ui.label(RichText::new(format!("No system check: {err}")).color(theme::MUTED));
                }
                Some(Ok(report)) => report_ui(ui, report),
            }
            let button = ui.add_enabled(!view.running, egui::Button::new("Check again"));
            if button.clicked() {
                view.again = true;
            }
        });
    ui.separator();
}

fn report_ui(ui: &mut Ui, report: &SystemReport) {
    for finding in &report.findings {
        let (mark, color) = match finding.severity {
            Severity::Blocking => ("Blocks training", theme::ERROR),
            Severity::Warning => ("Warning", theme::WARNING),
        };
        ui.label(RichText::new(format!("{mark}: {}", finding.problem)).color(color));
        ui.label(RichText::new(format!("Fix: {}", finding.fix)).color(theme::MUTED));
    }
    for section in report.sections() {
        ui.add_space(4.0);
        ui.strong(section.title);
        for line in &section.lines {
            ui.label(line);
        }
    }
}
