//! Reading a file that should be TOML text, and saying what it is when it is not text at all (a video, an image,
//! model weights), so a wrong path gets "this is a video" rather than "invalid UTF-8".

use std::path::Path;

use crate::file_read::{read_bounded, ReadLimit};

/// Why a config file could not be read as text.
#[derive(Debug, thiserror::Error)]
pub enum TextFileError {
    /// The file could not be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The file is binary; holds what it looks like (`a video (MP4/MOV)`).
    #[error("this is not a TOML file: it looks like {0}")]
    NotText(&'static str),
}

/// Reads the TOML file at `path` as UTF-8 text, refusing special files and files over
/// [`ReadLimit::TOML`] without reading them ([`read_bounded`]).
pub fn read_text(path: &Path) -> Result<String, TextFileError> {
    let bytes = read_bounded(path, ReadLimit::TOML)?;
    String::from_utf8(bytes).map_err(|e| TextFileError::NotText(looks_like(e.as_bytes())))
}

/// What a binary file looks like, from its first bytes.
pub fn looks_like(bytes: &[u8]) -> &'static str {
    let at = |range: std::ops::Range<usize>| bytes.get(range).unwrap_or_default();
    let starts = |magic: &[u8]| bytes.starts_with(magic);
    if at(4..8) == b"ftyp" {
        "a video (MP4/MOV)"
    } else if starts(&[0x1a, 0x45, 0xdf, 0xa3]) {
        "a video (Matroska/WebM)"
    } else if starts(b"RIFF") && at(8..12) == b"AVI " {
        "a video (AVI)"
    } else if starts(b"FLV") || starts(&[0x30, 0x26, 0xb2, 0x75]) || starts(&[0, 0, 1, 0xba]) {
        "a video (FLV, WMV or MPEG)"
    } else if starts(b"\x89PNG") {
        "an image (PNG)"
    } else if starts(&[0xff, 0xd8, 0xff]) {
        "an image (JPEG)"
    } else if starts(b"RIFF") && at(8..12) == b"WEBP" {
        "an image (WebP)"
    } else if starts(b"BM") {
        "an image (BMP)"
    } else if starts(b"GGUF") || at(8..9) == b"{" {
        "model weights (safetensors or GGUF)"
    } else if starts(b"PK\x03\x04") {
        "a zip archive (or PyTorch .pth weights)"
    } else if bytes.first() == Some(&0x80) {
        "a Python pickle (PyTorch weights?)"
    } else {
        "a binary file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_files_are_named_by_their_first_bytes() {
        assert_eq!(
            looks_like(b"\0\0\0\x18ftypmp42\0\0\0\0"),
            "a video (MP4/MOV)"
        );
        assert_eq!(
            looks_like(&[0x1a, 0x45, 0xdf, 0xa3, 0x9f]),
            "a video (Matroska/WebM)"
        );
        assert_eq!(looks_like(b"\x89PNG\r\n\x1a\n"), "an image (PNG)");
        assert_eq!(
            looks_like(b"\x10\0\0\0\0\0\0\0{\"a\":"),
            "model weights (safetensors or GGUF)"
        );
        assert_eq!(looks_like(&[0xb7, 0xe2, 0x38]), "a binary file");
    }

    #[test]
    fn text_reads_and_binary_is_refused() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let toml = dir.path().join("run.toml");
        std::fs::write(&toml, "[lora]\nrank = 8\n")?;
        assert_eq!(read_text(&toml)?, "[lora]\nrank = 8\n");
        let video = dir.path().join("clip.toml");
        std::fs::write(&video, b"\0\0\0\x18ftypisom\xff\xfe\0\0")?;
        let err = read_text(&video).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("this is not a TOML file: it looks like a video (MP4/MOV)")
        );
        Ok(())
    }
}
