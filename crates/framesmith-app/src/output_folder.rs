//! What the configured output folder holds, shown before Start: a new run never writes over an earlier one
//! (it takes a `run-N` folder beside it), and "Continue from saved state…" resumes one.

use std::path::{Path, PathBuf};

use egui::{RichText, Ui};

use super::theme;
use framesmith_config::outputs::FoundRun;

/// The last reading of the output folder, and the one being read.
#[derive(Debug, Default)]
pub struct OutputFolderView {
    /// The folder, its runs, and where Start would write.
    shown: Option<(PathBuf, Vec<FoundRun>, PathBuf)>,
    reading: Option<PathBuf>,
    stale: bool,
}

impl OutputFolderView {
    /// The folder to read now, when `dir` was not read yet (or a run ended since), and no read is under way.
    pub fn needs_read(&mut self, dir: &Path) -> Option<PathBuf> {
        let current = self.shown.as_ref().is_some_and(|(d, ..)| d == dir) && !self.stale;
        if current || self.reading.as_deref() == Some(dir) {
            return None;
        }
        self.stale = false;
        self.reading = Some(dir.to_path_buf());
        Some(dir.to_path_buf())
    }

    pub fn finish(&mut self, dir: PathBuf, runs: Vec<FoundRun>, next: PathBuf) {
        if self.reading.as_ref() == Some(&dir) {
            self.reading = None;
        }
        self.shown = Some((dir, runs, next));
    }

    /// A run ended: the folder holds something new.
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// The line shown under the controls, once the folder was read.
    pub fn summary(&self) -> Option<String> {
        let (dir, runs, next) = self.shown.as_ref()?;
        let Some(newest) = runs.last() else {
            return Some(format!("Start writes the run to {}", dir.display()));
        };
        let held = if runs.len() == 1 {
            newest.describe()
        } else {
            format!("{} runs; the newest is {}", runs.len(), newest.describe())
        };
        Some(format!(
            "{} holds {held}. Start begins a new run in {} and leaves it as it is; \"Continue from saved state…\" \
             resumes it",
            dir.display(),
            next.display()
        ))
    }
}

/// The output folder line.
pub fn output_folder_ui(view: &OutputFolderView, ui: &mut Ui) {
    if let Some(line) = view.summary() {
        ui.label(RichText::new(line).color(theme::MUTED));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_read_once_until_a_run_ends() {
        let mut view = OutputFolderView::default();
        let dir = Path::new("out");
        assert_eq!(view.needs_read(dir), Some(dir.to_path_buf()));
        assert_eq!(view.needs_read(dir), None, "a read is under way");
        view.finish(dir.to_path_buf(), Vec::new(), dir.to_path_buf());
        assert_eq!(view.needs_read(dir), None);
        assert!(view
            .summary()
            .unwrap()
            .contains("Start writes the run to out"));
        view.mark_stale();
        assert_eq!(view.needs_read(dir), Some(dir.to_path_buf()));
        assert_eq!(
            view.needs_read(Path::new("other")),
            Some(PathBuf::from("other"))
        );
    }
}
