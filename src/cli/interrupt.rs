//! Ctrl-C (and SIGTERM) during a headless run: the first asks the run to stop and save (the LoRA and the training
//! state at the last completed step), the second exits at once and says what was kept. One handler per process;
//! each run registers its engine while it runs. Closing the console window on Windows is not covered: Windows ends
//! the process as soon as the handler returns, so only the files already written (atomically) remain.

use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

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

/// The shared state, with the process's handler installed on first use. When no handler can be installed
/// (another one owns the signals) the run ends on Ctrl-C as any process does, and a warning says so.
fn watched() -> &'static Arc<Mutex<Watched>> {
    WATCHED.get_or_init(|| {
        let shared = Arc::new(Mutex::new(Watched::default()));
        let for_handler = Arc::clone(&shared);
        if let Err(err) = ctrlc::set_handler(move || on_interrupt(&for_handler)) {
            eprintln!("warning: Ctrl-C will end the run without saving ({err})");
        }
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
    }
}

#[cfg(test)]
mod tests {
    use super::exit_now_message;
    use std::path::Path;

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
