//! The media entries of a dataset folder, and why an entry cannot be used — a symbolic link whose target is gone,
//! a link loop, a FIFO, a socket or a device — found from metadata alone, without opening anything (opening a FIFO
//! blocks), so no entry is dropped without a word.

use std::io;
use std::path::{Path, PathBuf};

use framesmith_config::file_read::special_kind;

use super::config::DatasetKind;

/// One file of a folder whose name has a media extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaEntry {
    /// The file as listed (a symbolic link stays a link).
    pub path: PathBuf,
    /// Why it cannot be read as media; `None` when it is a regular file (or a link to one).
    pub unusable: Option<String>,
}

/// Every entry directly in `dir` whose name `keep` accepts, sorted by path as musubi-tuner sorts them, each with
/// why it cannot be used when it cannot.
pub fn list_media(
    dir: &Path,
    keep: fn(&Path) -> bool,
    kind: DatasetKind,
) -> io::Result<Vec<MediaEntry>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if keep(&path) {
            let unusable = unusable_reason(&path, kind, false);
            entries.push(MediaEntry { path, unusable });
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// Why `path` cannot be read as an image or video of a `kind` dataset, from metadata only; `None` when it can.
/// `folder_ok`: a folder is accepted (a JSONL `video_path` may name a folder of frames).
pub fn unusable_reason(path: &Path, kind: DatasetKind, folder_ok: bool) -> Option<String> {
    let link = std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_symlink());
    let target = || {
        std::fs::read_link(path)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "an unreadable target".to_string())
    };
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if link.is_some() && e.kind() == io::ErrorKind::NotFound => {
            return Some(format!(
                "is a symbolic link to {}, which does not exist (moved, deleted, or on a drive that is not \
                 connected); reconnect or restore it, or remove the link",
                target()
            ));
        }
        Err(e) if link.is_some() => {
            return Some(format!(
                "is a symbolic link that cannot be followed ({e}; a link that leads back to itself?); fix or \
                 remove the link"
            ));
        }
        Err(e) => return Some(format!("cannot be looked at ({e})")),
    };
    let file_type = metadata.file_type();
    if file_type.is_file() || (folder_ok && file_type.is_dir()) {
        return None;
    }
    let what = special_kind(&file_type);
    let is = match link {
        Some(_) => format!("is a symbolic link to {what} ({})", target()),
        None => format!("is {what}"),
    };
    Some(format!(
        "{is}, not {} file; replace it with the file or remove it from the dataset",
        match kind {
            DatasetKind::Image => "an image",
            DatasetKind::Video => "a video",
        }
    ))
}

#[cfg(all(test, unix))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::probe::is_image;
    use std::os::unix::fs::symlink;

    #[test]
    fn every_kind_of_unusable_entry_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.png"), b"png").unwrap();
        std::fs::write(d.join("notes.txt"), b"not media").unwrap();
        symlink(d.join("gone.png"), d.join("b.png")).unwrap();
        symlink("/dev/null", d.join("c.png")).unwrap();
        symlink(d.join("d.png"), d.join("d.png")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(d.join("e.png"))
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::create_dir(d.join("f.png")).unwrap();
        let listed = list_media(d, is_image, DatasetKind::Image).unwrap();
        let names: Vec<String> = listed
            .iter()
            .map(|e| e.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["a.png", "b.png", "c.png", "d.png", "e.png", "f.png"]
        );
        let why: Vec<&str> = listed
            .iter()
            .map(|e| e.unusable.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(why[0], "");
        assert!(why[1].contains("gone.png, which does not exist"), "{why:?}");
        assert!(
            why[2].starts_with(
                "is a symbolic link to a character device (/dev/null), not an image file"
            ),
            "{why:?}"
        );
        assert!(why[3].contains("cannot be followed"), "{why:?}");
        assert!(
            why[4].starts_with("is a FIFO (named pipe), not an image"),
            "{why:?}"
        );
        assert!(why[5].starts_with("is a folder, not an image"), "{why:?}");
        assert_eq!(
            unusable_reason(&d.join("f.png"), DatasetKind::Video, true),
            None
        );
    }
}
