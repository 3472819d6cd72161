//! Ctrl-C (and SIGTERM, SIGHUP) during a headless run: the first asks the run to stop and save (the LoRA and the
//! training state at the last completed step), a second one later exits at once and says what was kept. One stop
//! is often delivered more than once — `timeout`, process supervisors, a closing terminal and wrapper scripts
//! signal the process and then its whole process group — so every signal within [`SAME_STOP_WINDOW`] of the
//! first counts as that same stop; only a press after it is the deliberate "exit now". One handler per
//! process; each run registers its engine while it runs. Closing the console window on Windows (or logging off,
//! shutting down) stops the run the same way and holds the process open until the save is written — Windows
//! allows about 5 s; a save that takes longer is cut off, and the files written before it (atomically) remain.

use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use framesmith_config::protocol::Command;

/// The exit code of a process ended by a second interrupt (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Signals this close to the first stop are the same stop delivered again (to the process, then to its group),
/// not a second press: a person's second Ctrl-C comes later than this.
pub const SAME_STOP_WINDOW: Duration = Duration::from_secs(2);

/// What the handler needs to know about the run in progress.
#[derive(Default)]
struct Watched {
    engine: Option<SyncSender<Command>>,
    /// When the stop was first asked for.
    stopping_since: Option<Instant>,
    /// Whether a repeat within the window was already reported.
    repeat_reported: bool,
    /// The run is still loading (nothing trained yet): a stop ends the process at once, there is nothing to save.
    preparing: bool,
    last_lora: Option<PathBuf>,
    last_state: Option<PathBuf>,
}

/// What one interrupt does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Press {
    /// The first: ask the run to stop and save.
    Stop,
    /// The same stop delivered again within [`SAME_STOP_WINDOW`]: nothing more to do.
    Repeat,
    /// A deliberate second press, or no run to stop: end the process now.
    ExitNow,
    /// The first, while the run is still loading: nothing was trained, so the process ends at once.
    ExitBeforeTraining,
}

impl Watched {
    /// Counts an interrupt received at `now`.
    fn press(&mut self, now: Instant) -> Press {
        if self.engine.is_none() {
            return Press::ExitNow;
        }
        match self.stopping_since {
            None if self.preparing => Press::ExitBeforeTraining,
            None => {
                self.stopping_since = Some(now);
                Press::Stop
            }
            Some(first) if now.saturating_duration_since(first) < SAME_STOP_WINDOW => Press::Repeat,
            Some(_) => Press::ExitNow,
        }
    }
}

static WATCHED: OnceLock<Arc<Mutex<Watched>>> = OnceLock::new();

/// Signalled when the watched run ends (its last save written).
static RUN_ENDED: Condvar = Condvar::new();

/// How long a console close waits for the run to save: a little under the 5 s Windows gives before it ends the
/// process regardless.
const CONSOLE_CLOSE_WAIT: Duration = Duration::from_millis(4500);

/// The shared state, with the process's handler installed on first use. When no handler can be installed
/// (another one owns the signals) the run ends on Ctrl-C as any process does, and a warning says so.
fn watched() -> &'static Arc<Mutex<Watched>> {
    WATCHED.get_or_init(|| {
        let shared = Arc::new(Mutex::new(Watched::default()));
        let for_handler = Arc::clone(&shared);
        if let Err(err) = ctrlc::set_handler(move || on_interrupt(&for_handler)) {
            eprintln!("warning: Ctrl-C will end the run without saving ({err})");
        }
        // Registered after Ctrl-C's handler, so Windows asks it first about a closing console.
        crate::platform::on_console_close(on_console_close);
        shared
    })
}

fn lock(shared: &Mutex<Watched>) -> std::sync::MutexGuard<'_, Watched> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

fn on_interrupt(shared: &Mutex<Watched>) {
    let mut w = lock(shared);
    match w.press(Instant::now()) {
        Press::Stop => {
            eprintln!(
                "\nstopping: saving the LoRA and the training state at the last completed step (press Ctrl-C \
                 again to exit at once)"
            );
            // A full command queue already holds work for the engine; the Stop is then seen with it or not at
            // all, and a second press still exits.
            if let Some(engine) = &w.engine {
                let _ = engine.try_send(Command::Stop);
            }
        }
        Press::Repeat if !w.repeat_reported => {
            w.repeat_reported = true;
            eprintln!(
                "(the stop arrived again at once — from the terminal or a supervisor — and counts once; press \
                 Ctrl-C again in a moment to exit without saving)"
            );
        }
        Press::Repeat => {}
        Press::ExitBeforeTraining => {
            eprintln!(
                "\nstopped while the run was loading: no step of it was trained, so there is nothing new to save"
            );
            std::process::exit(EXIT_INTERRUPTED.into());
        }
        Press::ExitNow => {
            eprintln!(
                "\n{}",
                exit_now_message(w.last_lora.as_deref(), w.last_state.as_deref())
            );
            std::process::exit(EXIT_INTERRUPTED.into());
        }
    }
}

/// The console is closing (Windows): stop the run as the first Ctrl-C does and wait for its save.
fn on_console_close() {
    if !stop_and_wait(CONSOLE_CLOSE_WAIT) {
        eprintln!(
            "\nthe console is closing before the run could save; the last saved files are kept"
        );
    }
}

/// Asks the run in progress to stop and save, then waits up to `limit` for it to end. True when it ended (or no
/// run was in progress).
fn stop_and_wait(limit: Duration) -> bool {
    let Some(shared) = WATCHED.get() else {
        return true;
    };
    let mut w = lock(shared);
    let Some(engine) = w.engine.clone() else {
        return true;
    };
    if w.stopping_since.is_none() {
        w.stopping_since = Some(Instant::now());
        eprintln!("\nstopping: saving the LoRA and the training state at the last completed step");
        let _ = engine.try_send(Command::Stop);
    }
    let (w, _) = RUN_ENDED
        .wait_timeout_while(w, limit, |w| w.engine.is_some())
        .unwrap_or_else(PoisonError::into_inner);
    w.engine.is_none()
}

/// What a second interrupt says on its way out.
fn exit_now_message(lora: Option<&std::path::Path>, state: Option<&std::path::Path>) -> String {
    match (lora, state) {
        (Some(lora), Some(state)) => format!(
            "exiting now; kept the last saved LoRA {} and training state {} (a save in progress was dropped; \
             what was written before it is intact)",
            lora.display(),
            state.display()
        ),
        (Some(lora), None) => format!(
            "exiting now; kept the last saved LoRA {} (no training state was saved)",
            lora.display()
        ),
        _ => "exiting now; nothing had been saved in this run yet".to_string(),
    }
}

/// Registers the run in progress: interrupts now stop it through `engine`.
pub fn watch(engine: &SyncSender<Command>) {
    *lock(watched()) = Watched {
        engine: Some(engine.clone()),
        preparing: true,
        ..Watched::default()
    };
}

/// Records whether the run is still loading (its state `Preparing`) or has begun training.
pub fn preparing(loading: bool) {
    if let Some(shared) = WATCHED.get() {
        lock(shared).preparing = loading;
    }
}

/// Records a checkpoint the run saved (what a second interrupt reports as kept).
pub fn saved(lora: &std::path::Path, state: Option<&std::path::Path>) {
    if let Some(shared) = WATCHED.get() {
        let mut w = lock(shared);
        w.last_lora = Some(lora.to_path_buf());
        if let Some(state) = state {
            w.last_state = Some(state.to_path_buf());
        }
    }
}

/// Whether the run was asked to stop by an interrupt.
pub fn interrupted() -> bool {
    WATCHED
        .get()
        .is_some_and(|shared| lock(shared).stopping_since.is_some())
}

/// The run is over: interrupts end the process again.
pub fn unwatch() {
    if let Some(shared) = WATCHED.get() {
        lock(shared).engine = None;
        RUN_ENDED.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::{
        exit_now_message, stop_and_wait, unwatch, watch, Press, Watched, SAME_STOP_WINDOW,
    };
    use framesmith_config::protocol::Command;
    use std::path::Path;
    use std::time::{Duration, Instant};

    #[test]
    fn a_stop_delivered_twice_at_once_is_one_stop() {
        let (tx, _rx) = std::sync::mpsc::sync_channel(4);
        let mut w = Watched {
            engine: Some(tx),
            ..Watched::default()
        };
        let t0 = Instant::now();
        assert_eq!(w.press(t0), Press::Stop);
        assert_eq!(w.press(t0 + Duration::from_millis(1)), Press::Repeat);
        assert_eq!(w.press(t0 + SAME_STOP_WINDOW / 2), Press::Repeat);
        // A press after the window is a person asking to exit now.
        assert_eq!(w.press(t0 + SAME_STOP_WINDOW), Press::ExitNow);
        // No run in progress: an interrupt ends the process as usual.
        assert_eq!(Watched::default().press(t0), Press::ExitNow);
        // A run still loading has nothing to save: the first stop ends it.
        let (tx, _rx) = std::sync::mpsc::sync_channel(4);
        let mut loading = Watched {
            engine: Some(tx),
            preparing: true,
            ..Watched::default()
        };
        assert_eq!(loading.press(t0), Press::ExitBeforeTraining);
    }

    #[test]
    fn a_closing_console_stops_the_run_and_waits_for_its_end() {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        watch(&tx);
        // The engine: takes the Stop, saves for a moment, and the run ends.
        let engine = std::thread::spawn(move || {
            let command = rx.recv_timeout(Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(200));
            unwatch();
            command
        });
        assert!(
            stop_and_wait(Duration::from_secs(10)),
            "the run's end was not waited for"
        );
        assert!(matches!(engine.join().unwrap(), Ok(Command::Stop)));
        // No run in progress: nothing to wait for.
        assert!(stop_and_wait(Duration::from_millis(10)));
    }

    #[test]
    fn the_second_interrupt_says_what_was_kept() {
        let both = exit_now_message(
            Some(Path::new("o/l-000010.safetensors")),
            Some(Path::new("o/l-state-000010")),
        );
        assert!(
            both.contains("o/l-000010.safetensors") && both.contains("o/l-state-000010"),
            "{both}"
        );
        let lora = exit_now_message(Some(Path::new("o/l.safetensors")), None);
        assert!(lora.contains("no training state"), "{lora}");
        assert!(exit_now_message(None, None).contains("nothing had been saved"));
    }
}
