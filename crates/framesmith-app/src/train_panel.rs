//! The Train tab: run controls, progress and ETA, loss and learning-rate charts, the queue and the log.

use egui::{Button, RichText, Ui};

use framesmith_config::protocol::{Command, LogLevel};
use framesmith_telemetry::SpillWarning;

use super::charts::{chart_ui, Series};
use super::config_editor::ConfigEditor;
use super::fit_panel::{fit_ui, FitView};
use super::gpu_panel::{gpu_picker_ui, GpuPicker};
use super::jobs::{Jobs, PickPurpose};
use super::monitor_panel::spill_banner_ui;
use super::output_folder::{output_folder_ui, OutputFolderView};
use super::queue::RunQueue;
use super::run_view::{format_duration, state_name, RunView};
use super::theme;

/// What the Train tab reads and writes. Starting a run and commanding the engine are the app's: the tab asks for
/// them with a [`TrainRequest`].
pub(super) struct TrainContext<'a> {
    /// The run's state, progress, log and failure (which the tab can dismiss).
    pub run: &'a mut RunView,
    pub run_name: Option<&'a str>,
    /// A run is being prepared (its dataset TOML written).
    pub preparing: bool,
    pub fit: &'a FitView,
    pub output_folder: &'a OutputFolderView,
    pub spill: Option<&'a SpillWarning>,
    /// The edited config, for its blocking problems.
    pub editor: &'a ConfigEditor,
    /// The loss chart's "Smoothed only" setting.
    pub smoothed_only: &'a mut bool,
    /// The machine's GPUs, and the ones chosen for the next run (a setting).
    pub gpus: GpuPicker<'a>,
    pub chosen_gpus: &'a mut Vec<usize>,
    pub queue: &'a mut RunQueue,
    pub jobs: &'a mut Jobs,
}

impl TrainContext<'_> {
    fn can_start(&self) -> bool {
        self.run.can_start() && !self.preparing
    }
}

/// What a Train tab button asks the app to do.
pub(super) enum TrainRequest {
    /// Start the edited config (the Start button).
    Start,
    /// Start the next queued run.
    StartQueue,
    /// Queue the edited config.
    Enqueue,
    /// Send the engine a command.
    Send(Command),
}

/// Draws the Train tab; returns what its buttons asked for.
pub(super) fn train_ui(ctx: &mut TrainContext, ui: &mut Ui) -> Option<TrainRequest> {
    if ctx.can_start() {
        fit_ui(ctx.fit, ui);
        gpu_picker_ui(&ctx.gpus, ctx.chosen_gpus, ui);
    }
    let control = controls_ui(ctx, ui);
    if ctx.can_start() {
        output_folder_ui(ctx.output_folder, ui);
    }
    if let Some(spill) = ctx.spill {
        spill_banner_ui(ui, spill);
    }
    failure_ui(ctx.run, ui);
    ui.separator();
    progress_ui(ctx.run, ctx.run_name, ui);
    ui.separator();
    charts_ui(ctx.run, ctx.smoothed_only, ui);
    ui.separator();
    let queued = queue_ui(ctx, ui);
    ui.separator();
    log_ui(ctx.run, ui);
    control.or(queued)
}

fn controls_ui(ctx: &mut TrainContext, ui: &mut Ui) -> Option<TrainRequest> {
    let can_start = ctx.can_start();
    let run = &ctx.run;
    let mut request = None;
    ui.horizontal(|ui| {
        let shortcut = ui.ctx().format_shortcut(&super::window::START_SHORTCUT);
        if ui
            .add_enabled(can_start, Button::new("Start"))
            .on_hover_text(format!("Start training ({shortcut}, from any tab)"))
            .clicked()
        {
            request = Some(TrainRequest::Start);
        }
        let commands = [
            (run.can_pause(), "Pause", Command::Pause),
            (run.can_resume(), "Resume", Command::Resume),
            (run.is_active(), "Stop", Command::Stop),
            (run.can_save_or_sample(), "Save now", Command::SaveNow),
            (run.can_save_or_sample(), "Sample now", Command::SampleNow),
        ];
        for (enabled, label, command) in commands {
            if ui.add_enabled(enabled, Button::new(label)).clicked() {
                request = Some(TrainRequest::Send(command));
            }
        }
        ui.separator();
        let resume = ui
            .add_enabled(can_start, Button::new("Continue from saved state…"))
            .on_hover_text("Resume a stopped run at its exact step from a training-state folder");
        if resume.clicked() {
            ctx.jobs.pick(PickPurpose::ResumeState);
        }
    });
    let problems = ctx.editor.blocking_problems();
    if !problems.is_empty() {
        ui.label(
            RichText::new(format!(
                "The config has {} problem(s); see the Config tab",
                problems.len()
            ))
            .color(theme::ERROR),
        );
    }
    request
}

fn failure_ui(run: &mut RunView, ui: &mut Ui) {
    let Some(message) = run.failure.clone() else {
        return;
    };
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.label(RichText::new("Run failed").color(theme::ERROR).strong());
        ui.label(message);
        if ui.button("Dismiss").clicked() {
            run.failure = None;
        }
    });
}

fn progress_ui(run: &RunView, run_name: Option<&str>, ui: &mut Ui) {
    ui.horizontal(|ui| {
        ui.label(format!("State: {}", state_name(run.state)));
        if let Some(name) = run_name {
            ui.label(RichText::new(format!("Run: {name}")).color(theme::MUTED));
        }
    });
    let text = run.step_text().unwrap_or_else(|| "No steps yet".into());
    ui.add(egui::ProgressBar::new(run.fraction_done()).text(text));
    ui.horizontal(|ui| {
        let step_time = run
            .progress
            .as_ref()
            .map_or_else(|| "—".into(), |p| format_secs(p.step_secs));
        ui.label(format!("Step time {step_time}"));
        ui.separator();
        ui.label(run.eta_text());
        if let Some(p) = &run.progress {
            ui.separator();
            ui.label(format!(
                "Loss {:.4} (smoothed {:.4})",
                p.loss, p.smoothed_loss
            ));
            ui.separator();
            ui.label(format!("LR {:.2e}", p.learning_rate));
        }
    });
}

fn format_secs(secs: f64) -> String {
    if secs < 60.0 {
        format!("{secs:.2} s")
    } else {
        format_duration(secs)
    }
}

fn charts_ui(run: &RunView, smoothed_only: &mut bool, ui: &mut Ui) {
    ui.horizontal(|ui| {
        ui.heading("Loss");
        ui.checkbox(smoothed_only, "Smoothed only");
    });
    let loss = loss_series(run, *smoothed_only);
    chart_ui(ui, "loss chart", "Loss", loss, None);
    let points = &run.points;
    ui.heading("Learning rate");
    chart_ui(
        ui,
        "lr chart",
        "LR",
        vec![Series {
            name: "Learning rate",
            color: theme::LEARNING_RATE,
            points: points
                .iter()
                .map(|p| [p.step as f64, p.learning_rate])
                .collect(),
        }],
        None,
    );
}

fn queue_ui(ctx: &mut TrainContext, ui: &mut Ui) -> Option<TrainRequest> {
    let mut request = None;
    ui.horizontal(|ui| {
        ui.heading("Queue");
        if ui
            .button("Add to queue")
            .on_hover_text("Queue the current config; queued runs start one after another")
            .clicked()
        {
            request = Some(TrainRequest::Enqueue);
        }
        let can_start = ctx.can_start() && !ctx.queue.is_empty();
        if ui
            .add_enabled(can_start, Button::new("Start queue"))
            .clicked()
        {
            request = Some(TrainRequest::StartQueue);
        }
    });
    if ctx.queue.is_held() {
        ui.label(RichText::new("The queue waits: the last run was stopped").color(theme::MUTED));
    }
    let mut remove = None;
    for (i, run) in ctx.queue.iter().enumerate() {
        ui.horizontal(|ui| {
            ui.label(format!("{}. {}", i + 1, run.name));
            if ui
                .small_button("Remove")
                .on_hover_text("Remove from the queue")
                .clicked()
            {
                remove = Some(i);
            }
        });
    }
    if let Some(i) = remove {
        ctx.queue.remove(i);
    }
    request
}

fn log_ui(run: &RunView, ui: &mut Ui) {
    ui.heading("Log");
    egui::ScrollArea::vertical()
        .id_salt("log")
        .max_height(220.0)
        .stick_to_bottom(true)
        .auto_shrink([false, true])
        .show(ui, |ui| {
            for line in &run.log {
                let (tag, color) = match line.level {
                    LogLevel::Info => ("info", theme::MUTED),
                    LogLevel::Warn => ("warn", theme::WARNING),
                    LogLevel::Error => ("error", theme::ERROR),
                };
                ui.label(
                    RichText::new(format!("[{tag}] {}", line.message))
                        .color(color)
                        .monospace(),
                );
            }
        });
}

/// The loss chart's series: the raw loss (unless `smoothed_only`), the smoothed loss, and the validation loss
/// when the run evaluates one.
pub(crate) fn loss_series(run: &RunView, smoothed_only: bool) -> Vec<Series> {
    let points = &run.points;
    let mut loss = Vec::new();
    if !smoothed_only {
        loss.push(Series {
            name: "Loss",
            color: theme::LOSS_RAW,
            points: points.iter().map(|p| [p.step as f64, p.loss]).collect(),
        });
    }
    loss.push(Series {
        name: "Smoothed",
        color: theme::LOSS_SMOOTHED,
        points: points
            .iter()
            .map(|p| [p.step as f64, p.smoothed_loss])
            .collect(),
    });
    if !run.validation.is_empty() {
        loss.push(Series {
            name: "Validation",
            color: theme::LOSS_VALIDATION,
            points: run
                .validation
                .iter()
                .map(|v| [v.step as f64, v.loss])
                .collect(),
        });
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use framesmith_config::protocol::{Event, Progress, ValidationLoss};

    fn progress(step: usize, loss: f64) -> Event {
        Event::Progress(Progress {
            step,
            total_steps: 10,
            epoch: 1,
            loss,
            smoothed_loss: loss,
            learning_rate: 1e-4,
            step_secs: 0.1,
            eta_secs: 1.0,
        })
    }

    fn validated(step: usize, loss: f64) -> Event {
        Event::Validated(ValidationLoss {
            step,
            loss,
            items: 2,
            timesteps: 4,
        })
    }

    #[test]
    fn validation_losses_are_a_series_of_their_own_beside_the_training_loss() {
        let mut run = RunView::default();
        for step in 1..=4 {
            run.apply(progress(step, 1.0 / step as f64));
        }
        let names = |series: &[Series]| series.iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(&loss_series(&run, false)), ["Loss", "Smoothed"]);
        run.apply(validated(2, 0.75));
        run.apply(validated(4, 0.5));
        // A resumed run evaluates step 4 again: the newest value stands.
        run.apply(validated(4, 0.45));
        let series = loss_series(&run, false);
        assert_eq!(names(&series), ["Loss", "Smoothed", "Validation"]);
        let validation = &series[2];
        assert_eq!(validation.points, vec![[2.0, 0.75], [4.0, 0.45]]);
        assert_eq!(validation.color, theme::LOSS_VALIDATION);
        assert_ne!(validation.color, theme::LOSS_SMOOTHED);
        assert_eq!(
            names(&loss_series(&run, true)),
            ["Smoothed", "Validation"],
            "smoothed only hides the raw loss, not the validation loss"
        );
        run.begin_run();
        assert_eq!(names(&loss_series(&run, false)), ["Loss", "Smoothed"]);
    }
}
