//! Ctrl-C (and SIGTERM, SIGHUP) during a headless run: the first asks the run to stop and save (the LoRA and the
//! training state at the last completed step), the second exits at once and says what was kept. One handler per
//! process; each run registers its engine while it runs. Closing the console window on Windows (or logging off,
//! shutting down) stops the run the same way and holds the process open until the save is written — Windows
//! allows about 5 s; a save that takes longer is cut off, and the files written before it (atomically) remain.

use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use framesmith_config::protocol::Command;

/// The exit code of a process ended by a second interrupt (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// What the handler needs to know about the run in progress.
#[derive(Default)]
struct Watched {
    engine: Option<SyncSender<Command>>,
    presses: usize,
    last_lora: Option<PathBuf>,
    last_state: Option<PathBuf>,
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
    w.presses += 1;
    let Some(engine) = w.engine.clone().filter(|_| w.presses == 1) else {
        eprintln!(
            "\n{}",
            exit_now_message(w.last_lora.as_deref(), w.last_state.as_deref())
        );
        std::process::exit(EXIT_INTERRUPTED.into());
    };
    eprintln!(
        "\nstopping: saving the LoRA and the training state at the last completed step (press Ctrl-C again to \
         exit at once)"
    );
    // A full command queue already holds work for the engine; the Stop is then seen with it or not at all,
    // and the second press still exits.
    let _ = engine.try_send(Command::Stop);
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
    w.presses += 1;
    if w.presses == 1 {
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
        ..Watched::default()
    };
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
    WATCHED.get().is_some_and(|shared| lock(shared).presses > 0)
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
    use super::{exit_now_message, stop_and_wait, unwatch, watch};
    use framesmith_config::protocol::Command;
    use std::path::Path;
    use std::time::Duration;

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
