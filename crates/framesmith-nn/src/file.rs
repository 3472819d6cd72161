//! Opening model files (weights, LoRAs, tokenizers) without blocking: a FIFO, device, socket or folder given as a
//! model path is refused with what it is, from its metadata, instead of opened (opening a FIFO waits for a writer
//! forever, reading a device never ends). The same rule as the config crate's `file_read`, which nn cannot use.
//! Reads at an offset ([`read_exact_at`]) for readers that copy parts of a large file into their own buffers,
//! several threads at once, instead of mapping it.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Opens `path` for reading only if it is a regular file (symlinks followed); anything else is an
/// `InvalidInput` error saying what it is. The opened file is checked again, so a path swapped between the check
/// and the open is refused too (on Linux it is opened non-blocking, so that open cannot block either).
pub fn open_regular(path: &Path) -> io::Result<File> {
    check_regular(&std::fs::metadata(path)?.file_type())?;
    let file = open_nonblocking(path)?;
    check_regular(&file.metadata()?.file_type())?;
    Ok(file)
}

/// The whole of the regular file at `path` ([`open_regular`]) if it holds at most `max_bytes`, checked from its
/// size before reading and enforced while reading; a larger file is a `FileTooLarge` error.
pub fn read_regular(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    let too_large = || {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("the file is larger than the {max_bytes} bytes read from a file of this kind"),
        )
    };
    if size > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Fills `buf` from the bytes of `file` starting at `offset`, without moving a shared cursor: threads may read
/// different parts of one file at once. A file that ends first is an `UnexpectedEof` error.
#[cfg(unix)]
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Fills `buf` from the bytes of `file` starting at `offset` (see the Unix version).
#[cfg(windows)]
pub fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ended before the bytes asked for",
                ))
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

fn check_regular(file_type: &std::fs::FileType) -> io::Result<()> {
    if file_type.is_file() {
        return Ok(());
    }
    let what = if file_type.is_dir() {
        "a folder"
    } else {
        special_kind(file_type)
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("this is {what}, not a file"),
    ))
}

/// What a file that is neither a regular file nor a folder is (`a FIFO (named pipe)`), from its metadata.
#[cfg(unix)]
pub fn special_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a FIFO (named pipe)"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// What a file that is neither a regular file nor a folder is, from its metadata.
#[cfg(not(unix))]
pub fn special_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

#[cfg(all(test, unix))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_folders_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.safetensors");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = open_regular(&fifo).unwrap_err();
        assert_eq!(err.to_string(), "this is a FIFO (named pipe), not a file");
        let err = read_regular(Path::new("/dev/zero"), u64::MAX).unwrap_err();
        assert_eq!(err.to_string(), "this is a character device, not a file");
        let err = open_regular(dir.path()).unwrap_err();
        assert_eq!(err.to_string(), "this is a folder, not a file");
        let file = dir.path().join("a.bin");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(read_regular(&file, 3).unwrap(), b"abc");
        let err = read_regular(&file, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
    }
}
