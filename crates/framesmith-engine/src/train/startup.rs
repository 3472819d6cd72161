//! How long a run took from its start to the end of its first step, and where the time went: the checks and run
//! folder, the family's setup (model, LoRA, training items, sample prompts), joining other ranks, resuming,
//! samples before training, and the first step itself. One log line says it once the first step is done, so a
//! slow start shows which part to look at.

use std::time::Instant;

/// The start of a run, split into named parts as they finish.
#[derive(Debug, Clone)]
pub struct Startup {
    began: Instant,
    last: Instant,
    parts: Vec<(&'static str, f64)>,
    reported: bool,
}

impl Default for Startup {
    fn default() -> Self {
        Self::begin()
    }
}

impl Startup {
    /// A start beginning now.
    pub fn begin() -> Self {
        let now = Instant::now();
        Self {
            began: now,
            last: now,
            parts: Vec::new(),
            reported: false,
        }
    }

    /// Ends the part `name`: the time since the previous part ended (or the start).
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.parts
            .push((name, now.duration_since(self.last).as_secs_f64()));
        self.last = now;
    }

    /// The line for the end of the first step, which took `step_secs`: the time since the start and its parts
    /// (parts under 0.05 s left out), and what the attention-plan cache did; `None` after the first call.
    pub fn first_step_line(&mut self, step_secs: f64) -> Option<String> {
        if std::mem::replace(&mut self.reported, true) {
            return None;
        }
        let total = self.began.elapsed().as_secs_f64();
        let details: Vec<String> = [
            framesmith_nn::attention::plans::plan_counts().and_then(|c| c.describe()),
            framesmith_nn::offload::page_locking().describe(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let details = (!details.is_empty()).then(|| details.join("; "));
        Some(first_step_line(total, &self.parts, step_secs, details))
    }
}

/// "first step done 83.2 s after the start: setup 41.0 s, …, the first step 21.7 s (attention plans: …; 45.0 GiB
/// page-locked in 9.1 s)": the parts, then what the attention-plan cache did and the page-locking so far.
fn first_step_line(
    total: f64,
    parts: &[(&str, f64)],
    step_secs: f64,
    details: Option<String>,
) -> String {
    let mut shown: Vec<String> = parts
        .iter()
        .filter(|(_, secs)| *secs >= 0.05)
        .map(|(name, secs)| format!("{name} {secs:.1} s"))
        .collect();
    shown.push(match details {
        Some(details) => format!("the first step {step_secs:.1} s ({details})"),
        None => format!("the first step {step_secs:.1} s"),
    });
    format!(
        "first step done {total:.1} s after the start: {}",
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_each_part_that_took_time_and_the_first_step() {
        let parts = [("checks", 0.01), ("setup", 41.04), ("resume", 0.4)];
        assert_eq!(
            first_step_line(83.25, &parts, 21.66, None),
            "first step done 83.2 s after the start: setup 41.0 s, resume 0.4 s, the first step 21.7 s"
        );
        assert_eq!(
            first_step_line(2.0, &[], 1.5, Some("attention plans: 4 read from the disk cache, 0 built".into())),
            "first step done 2.0 s after the start: the first step 1.5 s (attention plans: 4 read from the disk \
             cache, 0 built)"
        );
    }

    #[test]
    fn marks_split_the_time_and_the_line_comes_once() {
        let mut startup = Startup::begin();
        startup.mark("a");
        startup.mark("b");
        assert_eq!(startup.parts.len(), 2);
        assert!(startup.parts.iter().all(|(_, s)| *s >= 0.0));
        let line = startup
            .first_step_line(1.0)
            .expect("first call gives the line");
        assert!(line.ends_with("the first step 1.0 s"), "{line}");
        assert_eq!(startup.first_step_line(1.0), None);
    }
}
