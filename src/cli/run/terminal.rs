//! Where a headless run's progress goes: a progress bar on a terminal, plain lines otherwise, or JSON events.

use std::io::IsTerminal;

use framesmith_config::protocol::{wire, Event, Progress};
use indicatif::{ProgressBar, ProgressStyle};

use super::Output;

/// Where a run's progress goes: a progress bar on a terminal, a line every 5% otherwise; with JSON events, each
/// event as a line on stdout and nothing else.
pub(super) struct Terminal {
    bar: Option<ProgressBar>,
    last_printed: usize,
    json: bool,
}

impl Terminal {
    pub(super) fn new(output: Output) -> Self {
        let json = matches!(output, Output::EventsJson { .. });
        let bar = (!json && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta_precise}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        Self {
            bar,
            last_printed: 0,
            json,
        }
    }

    /// With JSON events: `event` on stdout, at once (the app reads it while the run goes on).
    pub(super) fn event(&self, event: &Event) {
        use std::io::Write;
        if !self.json {
            return;
        }
        match wire::event_line(event) {
            Ok(line) => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}").and_then(|()| out.flush());
            }
            Err(err) => eprintln!("warning: {err}"),
        }
    }

    pub(super) fn say(&self, line: String) {
        if self.json {
            return;
        }
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub(super) fn progress(&mut self, p: &Progress) {
        if self.json {
            return;
        }
        let msg = format!(
            "loss {:.4} (avg {:.4})  lr {:.2e}  {:.2}s/step",
            p.loss, p.smoothed_loss, p.learning_rate, p.step_secs
        );
        match &self.bar {
            Some(b) => {
                b.set_length(p.total_steps as u64);
                b.set_position(p.step as u64);
                b.set_message(msg);
            }
            None if p.step == p.total_steps
                || p.step >= self.last_printed + p.total_steps.div_ceil(20) =>
            {
                self.last_printed = p.step;
                eprintln!(
                    "step {}/{}  {msg}  eta {:.0}s",
                    p.step, p.total_steps, p.eta_secs
                );
            }
            None => {}
        }
    }

    pub(super) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }

    pub(super) fn abandon(&self) {
        if let Some(b) = &self.bar {
            b.abandon();
        }
    }
}
