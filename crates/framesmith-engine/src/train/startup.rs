//! How long a run took from its start to the end of its first step, and where the time went: the checks and run
//! folder, the family's setup (model, LoRA, training items, sample prompts), joining other ranks, resuming,
//! samples before training, and the first step itself, with what ran beside the setup on threads of its own
//! (the activation buffers' page-locking). One log line says it once the first step is done, so a slow start
//! shows which part to look at.

use std::time::Instant;

use framesmith_nn::offload::{page_locking, PageLocking};

/// The start of a run, split into named parts as they finish.
#[derive(Debug, Clone)]
pub struct Startup {
    began: Instant,
    last: Instant,
    parts: Vec<(&'static str, f64)>,
    /// What ran beside the parts on threads of its own ("activation buffers 45.0 GiB page-locked in 17.9 s").
    beside: Vec<String>,
    /// The page-locking so far when the first step began: what the step locked itself is what came after.
    locked_before_step: Option<PageLocking>,
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
            beside: Vec::new(),
            locked_before_step: None,
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

    /// Notes `what` ran beside the parts, on a thread of its own (named after the first step's own details).
    pub fn ran_beside(&mut self, what: String) {
        self.beside.push(what);
    }

    /// The first step begins now: what is page-locked from here on is the step's own.
    pub fn step_begins(&mut self) {
        self.locked_before_step = Some(page_locking());
    }

    /// The line for the end of the first step, which took `step_secs`: the time since the start and its parts
    /// (parts under 0.05 s left out), what the attention-plan cache did and what the step page-locked itself,
    /// then what ran beside the setup; `None` after the first call.
    pub fn first_step_line(&mut self, step_secs: f64) -> Option<String> {
        if std::mem::replace(&mut self.reported, true) {
            return None;
        }
        let total = self.began.elapsed().as_secs_f64();
        let locked = page_locking();
        let locked_in_step = match &self.locked_before_step {
            Some(before) => locked.since(before),
            None => locked,
        };
        let details: Vec<String> = [
            framesmith_nn::attention::plans::plan_counts().and_then(|c| c.describe()),
            framesmith_nn::attention::fp8_calls_line(),
            locked_in_step.describe(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let details = (!details.is_empty()).then(|| details.join("; "));
        let line = first_step_line(total, &self.parts, step_secs, details);
        Some(if self.beside.is_empty() {
            line
        } else {
            format!("{line}; beside the setup: {}", self.beside.join(", "))
        })
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

    #[test]
    fn what_ran_beside_the_setup_follows_the_first_step() {
        let mut startup = Startup::begin();
        startup.mark("setup");
        startup.ran_beside("activation buffers 45.0 GiB page-locked in 17.9 s".into());
        startup.step_begins();
        let line = startup
            .first_step_line(6.0)
            .expect("first call gives the line");
        // Nothing is page-locked on the CPU: the step's own details stay empty, whatever came before it.
        assert!(
            line.ends_with(
                "the first step 6.0 s; beside the setup: activation buffers 45.0 GiB page-locked in 17.9 s"
            ),
            "{line}"
        );
    }
}
