//! How long a run took from its start to the end of its first step, and where the time went: the checks and run
//! folder, the family's setup (model, LoRA, training items, sample prompts), joining other ranks, resuming,
//! samples before training, and the first step itself, with what ran beside the setup on threads of its own
//! (the activation buffers' page-locking). One log line says it once the first step is done, so a slow start
//! shows which part to look at.

use std::cell::RefCell;
use std::sync::Mutex;
use std::time::Instant;

use framesmith_nn::offload::{page_locking, PageLocking};

/// When the program started, until the first run takes it ([`program_started`]).
static PROGRAM_START: Mutex<Option<Instant>> = Mutex::new(None);

thread_local! {
    /// The parts of the setup of the run being started on this thread that have ended, and when each ended.
    static SETUP_PARTS: RefCell<Vec<(&'static str, Instant)>> = const { RefCell::new(Vec::new()) };
}

/// Notes that the program starts now (the first thing `main` does): the first run started after it counts its
/// time to the first step from here, what came before the run (reading the config and presets, starting the
/// engine thread) as its first part.
pub fn program_started() {
    *PROGRAM_START
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
}

/// Ends the part `name` ("the model", "the training items") of the setup of the run being started on this
/// thread: a family's setup calls it as each of its parts ends, and the first-step line shows those parts in the
/// setup's place.
pub fn setup_part_done(name: &'static str) {
    SETUP_PARTS.with(|parts| parts.borrow_mut().push((name, Instant::now())));
}

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

    /// The start of a run on this thread beginning now: from the program's start when this is the first run
    /// since it ([`program_started`]), that time its first part; the setup parts noted before are forgotten.
    pub fn begin_run() -> Self {
        let program = PROGRAM_START
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        Self::begin_after(program)
    }

    /// [`Startup::begin_run`] for a program that started at `program` (`None`: not this run's concern).
    fn begin_after(program: Option<Instant>) -> Self {
        let mut startup = Self::begin();
        SETUP_PARTS.with(|parts| parts.borrow_mut().clear());
        if let Some(program) = program.filter(|&p| p <= startup.began) {
            startup.began = program;
            startup.last = program;
            startup.mark("starting the program");
        }
        startup
    }

    /// Ends the setup: each part its family noted ([`setup_part_done`]) since the previous part ended, then
    /// `rest` for the time after the last of them.
    pub fn mark_setup(&mut self, rest: &'static str) {
        let parts = SETUP_PARTS.with(|parts| std::mem::take(&mut *parts.borrow_mut()));
        for (name, ended) in parts {
            if ended >= self.last {
                self.parts
                    .push((name, ended.duration_since(self.last).as_secs_f64()));
                self.last = ended;
            }
        }
        self.mark(rest);
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
    fn the_setup_is_split_into_the_parts_its_family_noted() {
        let mut startup = Startup::begin_after(None);
        startup.mark("checks");
        setup_part_done("the model");
        setup_part_done("the training items");
        startup.mark_setup("the rest of the setup");
        let names: Vec<&str> = startup.parts.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "checks",
                "the model",
                "the training items",
                "the rest of the setup"
            ]
        );
        assert!(startup.parts.iter().all(|(_, secs)| *secs >= 0.0));
        // Noted parts are taken once; a part noted before a run began is not that run's.
        setup_part_done("a part of an earlier run");
        let mut next = Startup::begin_after(None);
        next.mark_setup("setup");
        let names: Vec<&str> = next.parts.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["setup"]);
    }

    #[test]
    fn the_first_run_counts_from_the_program_start() {
        let program = Instant::now();
        let startup = Startup::begin_after(Some(program));
        assert_eq!(startup.began, program);
        assert_eq!(
            startup.parts.first().map(|(name, _)| *name),
            Some("starting the program")
        );
        assert!(Startup::begin_after(None).parts.is_empty());
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
