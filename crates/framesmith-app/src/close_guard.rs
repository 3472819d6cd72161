//! Closing the window during a run: ask first; "Stop, save and close" stops the run and closes the window
//! once the engine reports the run saved and over, so no half-written training state is left behind.

use egui::{Context, Ui, ViewportCommand};

/// Where closing the window stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Closing {
    /// Nothing asked.
    #[default]
    Open,
    /// The window was asked to close during a run; the question is on screen.
    Asking,
    /// The run was told to stop; the window closes when it has saved and ended.
    AfterStop,
}

/// What the user answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseChoice {
    StopSaveAndClose,
    KeepTraining,
}

impl Closing {
    /// Holds a close request while a run is active; closes once a requested stop has ended the run.
    pub fn logic(&mut self, ctx: &Context, run_active: bool) {
        if ctx.input(|i| i.viewport().close_requested()) && run_active {
            ctx.send_viewport_cmd(ViewportCommand::CancelClose);
            if *self == Self::Open {
                *self = Self::Asking;
            }
        }
        if *self == Self::AfterStop && !run_active {
            *self = Self::Open;
            ctx.send_viewport_cmd(ViewportCommand::Close);
        }
    }

    /// Records the answer; `true` when the run must be told to stop.
    pub fn answer(&mut self, choice: CloseChoice) -> bool {
        match choice {
            CloseChoice::StopSaveAndClose => {
                *self = Self::AfterStop;
                true
            }
            CloseChoice::KeepTraining => {
                *self = Self::Open;
                false
            }
        }
    }
}

/// The question, while it is asked (or the wait for the save, after it was answered).
pub fn close_dialog_ui(ui: &mut Ui, closing: Closing) -> Option<CloseChoice> {
    let mut choice = None;
    match closing {
        Closing::Open => {}
        Closing::Asking => {
            egui::Modal::new(egui::Id::unique("close-during-run")).show(ui.ctx(), |ui| {
                ui.heading("A run is in progress");
                ui.label("Closing stops it: the LoRA and the training state are saved first, so you can resume it later");
                ui.horizontal(|ui| {
                    if ui.button("Stop, save and close").clicked() {
                        choice = Some(CloseChoice::StopSaveAndClose);
                    }
                    if ui.button("Keep training").clicked() {
                        choice = Some(CloseChoice::KeepTraining);
                    }
                });
            });
        }
        Closing::AfterStop => {
            egui::Modal::new(egui::Id::unique("close-during-run")).show(ui.ctx(), |ui| {
                ui.heading("Saving…");
                ui.label("The window closes when the LoRA and the training state are written");
            });
        }
    }
    choice
}
