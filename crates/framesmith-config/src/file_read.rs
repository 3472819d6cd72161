//! Opening and reading the files a user names (configs, presets, prompts, run records, captions, JSONL metadata)
//! so that no path can hang or exhaust memory: a FIFO, device, socket or folder is refused without blocking, and
//! a read takes no more than a limit per kind of file, checked from the size before reading and enforced while
//! reading. Errors are `std::io::Error`s, so every caller that names the path for an I/O error names it here too.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The most a reader takes from one kind of file, and how messages call that kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimit {
    /// Largest file accepted.
    pub bytes: u64,
    /// The kind of file, as messages call it (`a TOML file`).
    pub what: &'static str,
}

const MIB: u64 = 1 << 20;

impl ReadLimit {
    /// Run and dataset configs, presets, TOML prompt files.
    pub const TOML: Self = Self {
        bytes: 16 * MIB,
        what: "a TOML file",
    };
    /// Run records, `state.json`, model `config.json` files and other small JSON.
    pub const JSON: Self = Self {
        bytes: 16 * MIB,
        what: "a JSON file",
    };
    /// Prompt lists (`.txt`, one prompt a line).
    pub const PROMPTS: Self = Self {
        bytes: 16 * MIB,
        what: "a prompt file",
    };
    /// One caption file beside an image or video.
    pub const CAPTION: Self = Self {
        bytes: MIB,
        what: "a caption file",
    };
    /// Line-per-record files: dataset metadata and metrics logs, which grow with the dataset or the run.
    pub const JSONL: Self = Self {
        bytes: 256 * MIB,
        what: "a JSONL file",
    };

    /// The error for a file over the limit; `size_bytes` when its size is known before reading.
    fn exceeded(self, size_bytes: Option<u64>) -> io::Error {
        let limit = human_bytes(self.bytes);
        let size = match size_bytes {
            Some(n) => format!("is {}, over", human_bytes(n)),
            None => "holds more than".to_string(),
        };
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "the file {size} the {limit} limit for {}; is this the right file?",
                self.what
            ),
        )
    }
}

/// Opens `path` for reading only if it is a regular file (symlinks followed), without ever blocking: a FIFO, a
/// device, a socket or a folder is refused with what it is. On unix the file is opened non-blocking and checked
/// again once open, so a path swapped between the check and the open cannot block either.
pub fn open_regular(path: &Path) -> io::Result<File> {
    check_regular(&std::fs::metadata(path)?.file_type())?;
    let file = open_nonblocking(path)?;
    check_regular(&file.metadata()?.file_type())?;
    Ok(file)
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; regular files ignore it.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// An error unless `file_type` is a regular file, naming what it is instead.
pub fn check_regular(file_type: &std::fs::FileType) -> io::Result<()> {
    if file_type.is_file() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("this is {}, not a file", special_kind(file_type)),
    ))
}

/// What a file that is not a regular file is (`a FIFO (named pipe)`).
pub fn special_kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a folder"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "a special file"
    }
}

/// Reads the whole of `path` if it is a regular file of at most `limit` bytes ([`open_regular`]). The size is
/// checked before reading and the read stops one byte past the limit, so a file that grows, or whose size the
/// system does not report, cannot be read past it.
pub fn read_bounded(path: &Path, limit: ReadLimit) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    if size > limit.bytes {
        return Err(limit.exceeded(Some(size)));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit.bytes {
        return Err(limit.exceeded(None));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text; text that is not UTF-8 is an `InvalidData` error giving the offset of the
/// first bad byte.
pub fn read_string_bounded(path: &Path, limit: ReadLimit) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the file is not UTF-8 text (bad byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// A short excerpt of `text` for an error message: at most `max_chars` characters, with how much was cut, so a
/// huge value or line read from a file never floods a terminal or a log.
pub fn excerpt(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => std::borrow::Cow::Owned(format!(
            "{}… ({} more bytes)",
            &text[..end],
            text.len() - end
        )),
    }
}

/// `512 bytes`, `16 MiB`, `3.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn small_files_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.toml");
        std::fs::write(&path, "x = 1\n").unwrap();
        assert_eq!(read_bounded(&path, ReadLimit::TOML).unwrap(), b"x = 1\n");
        assert_eq!(
            read_string_bounded(&path, ReadLimit::TOML).unwrap(),
            "x = 1\n"
        );
    }

    #[test]
    fn a_file_over_the_limit_is_refused_before_reading_naming_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.toml");
        // Sparse: 3 GiB of size and no data, so only the size check can refuse it quickly.
        File::create(&path).unwrap().set_len(3 << 30).unwrap();
        let err = read_bounded(&path, ReadLimit::TOML).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            err.to_string(),
            "the file is 3 GiB, over the 16 MiB limit for a TOML file; is this the right file?"
        );
        let limit = ReadLimit {
            bytes: 4,
            what: "a test file",
        };
        std::fs::write(&path, "12345").unwrap();
        assert!(read_bounded(&path, limit)
            .unwrap_err()
            .to_string()
            .contains("over the 4 bytes limit for a test file"));
    }

    #[cfg(unix)]
    #[test]
    fn devices_fifos_and_folders_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_bounded(Path::new("/dev/zero"), ReadLimit::TOML).unwrap_err();
        assert_eq!(err.to_string(), "this is a character device, not a file");
        let fifo = dir.path().join("pipe.toml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening a FIFO for reading blocks until a writer comes; refusing it must not.
        let err = read_bounded(&fifo, ReadLimit::TOML).unwrap_err();
        assert_eq!(err.to_string(), "this is a FIFO (named pipe), not a file");
        let link = dir.path().join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let err = read_bounded(&link, ReadLimit::TOML).unwrap_err();
        assert_eq!(err.to_string(), "this is a character device, not a file");
        let err = read_bounded(dir.path(), ReadLimit::TOML).unwrap_err();
        assert_eq!(err.to_string(), "this is a folder, not a file");
    }

    #[test]
    fn not_utf8_names_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, b"ab\xffcd").unwrap();
        let err = read_string_bounded(&path, ReadLimit::CAPTION).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the file is not UTF-8 text (bad byte at offset 2)"
        );
    }

    #[test]
    fn excerpts_cut_long_text_and_say_how_much() {
        assert_eq!(excerpt("short", 10), "short");
        assert_eq!(excerpt("abcdefgh", 3), "abc… (5 more bytes)");
        assert_eq!(excerpt("ééé", 1), "é… (4 more bytes)");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
