//! The Train tab: run controls, progress and ETA, loss and learning-rate charts, the queue and the log.

use egui::{Button, RichText, Ui};

use framesmith_config::protocol::{Command, LogLevel};

use super::charts::{chart_ui, Series};
use super::fit_panel::fit_ui;
use super::jobs::PickPurpose;
use super::monitor_panel::spill_banner_ui;
use super::run_view::{format_duration, state_name, RunView};
use super::theme;
use super::window::FramesmithApp;

/// Draws the Train tab.
pub(super) fn train_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    if app.run.can_start() && !app.preparing {
        fit_ui(&app.fit, ui);
    }
    controls_ui(app, ui);
    if app.run.can_start() && !app.preparing {
        super::output_folder::output_folder_ui(&app.output_folder, ui);
    }
    if let Some(spill) = &app.spill {
        spill_banner_ui(ui, spill);
    }
    failure_ui(app, ui);
    ui.separator();
    progress_ui(app, ui);
    ui.separator();
    charts_ui(app, ui);
    ui.separator();
    queue_ui(app, ui);
    ui.separator();
    log_ui(app, ui);
}

fn controls_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    let can_start = app.run.can_start() && !app.preparing;
    ui.horizontal(|ui| {
        if ui.add_enabled(can_start, Button::new("Start")).clicked() {
            app.start(None);
        }
        if ui
            .add_enabled(app.run.can_pause(), Button::new("Pause"))
            .clicked()
        {
            app.send(Command::Pause);
        }
        if ui
            .add_enabled(app.run.can_resume(), Button::new("Resume"))
            .clicked()
        {
            app.send(Command::Resume);
        }
        if ui
            .add_enabled(app.run.is_active(), Button::new("Stop"))
            .clicked()
        {
            app.send(Command::Stop);
        }
        if ui
            .add_enabled(app.run.can_save_or_sample(), Button::new("Save now"))
            .clicked()
        {
            app.send(Command::SaveNow);
        }
        if ui
            .add_enabled(app.run.can_save_or_sample(), Button::new("Sample now"))
            .clicked()
        {
            app.send(Command::SampleNow);
        }
        ui.separator();
        let resume = ui
            .add_enabled(can_start, Button::new("Continue from saved state…"))
            .on_hover_text("Resume a stopped run at its exact step from a training-state folder");
        if resume.clicked() {
            app.jobs.pick(PickPurpose::ResumeState);
        }
    });
    let problems = app.editor.blocking_problems();
    if !problems.is_empty() {
        ui.label(
            RichText::new(format!(
                "The config has {} problem(s); see the Config tab",
                problems.len()
            ))
            .color(theme::ERROR),
        );
    }
}

fn failure_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    let Some(message) = app.run.failure.clone() else {
        return;
    };
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.label(RichText::new("Run failed").color(theme::ERROR).strong());
        ui.label(message);
        if ui.button("Dismiss").clicked() {
            app.run.failure = None;
        }
    });
}

fn progress_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    let run = &app.run;
    ui.horizontal(|ui| {
        ui.label(format!("State: {}", state_name(run.state)));
        if let Some(name) = &app.run_name {
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

fn charts_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    ui.horizontal(|ui| {
        ui.heading("Loss");
        ui.checkbox(&mut app.settings.smoothed_only, "Smoothed only");
    });
    let loss = loss_series(&app.run, app.settings.smoothed_only);
    chart_ui(ui, "loss chart", "Loss", loss, None);
    let points = &app.run.points;
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

fn queue_ui(app: &mut FramesmithApp, ui: &mut Ui) {
    ui.horizontal(|ui| {
        ui.heading("Queue");
        if ui
            .button("Add to queue")
            .on_hover_text("Queue the current config; queued runs start one after another")
            .clicked()
        {
            app.enqueue();
        }
        let can_start = app.run.can_start() && !app.preparing && !app.queue.is_empty();
        if ui
            .add_enabled(can_start, Button::new("Start queue"))
            .clicked()
        {
            if let Some(next) = app.queue.take_next() {
                app.start_queued(next);
            }
        }
    });
    if app.queue.is_held() {
        ui.label(RichText::new("The queue waits: the last run was stopped").color(theme::MUTED));
    }
    let mut remove = None;
    for (i, run) in app.queue.iter().enumerate() {
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
        app.queue.remove(i);
    }
}

fn log_ui(app: &FramesmithApp, ui: &mut Ui) {
    ui.heading("Log");
    egui::ScrollArea::vertical()
        .id_salt("log")
        .max_height(220.0)
        .stick_to_bottom(true)
        .auto_shrink([false, true])
        .show(ui, |ui| {
            for line in &app.run.log {
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
