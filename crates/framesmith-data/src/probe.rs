//! Recognising media files by extension, reading image sizes from headers only, loading images as RGB, and
//! folders of images used as videos (a JSONL `video_path` may name one).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use framesmith_config::file_read::open_regular;

use image::RgbImage;

use super::media::{MediaError, MediaTools};

/// Image extensions read (musubi-tuner also reads AVIF and, with plugins, JPEG XL; those are not supported).
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "webp", "bmp"];
/// Video extensions read, as musubi-tuner's list.
pub const VIDEO_EXTENSIONS: &[&str] = &[
    "mp4", "webm", "avi", "mkv", "mov", "flv", "wmv", "m4v", "mpg", "mpeg",
];

fn has_extension(path: &Path, list: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| list.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Whether `path` has an image extension (any letter case).
pub fn is_image(path: &Path) -> bool {
    has_extension(path, IMAGE_EXTENSIONS)
}

/// Whether `path` has a video extension (any letter case).
pub fn is_video(path: &Path) -> bool {
    has_extension(path, VIDEO_EXTENSIONS)
}

/// Files directly in `dir` (not in subfolders) accepted by `keep`, sorted by path as musubi-tuner sorts them.
pub fn list_files(dir: &Path, keep: fn(&Path) -> bool) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() && keep(&path) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// An image could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the image ({message}): {path}")]
pub struct ImageReadError {
    /// What the decoder said.
    pub message: String,
    /// The image.
    pub path: PathBuf,
}

impl ImageReadError {
    /// What went wrong, without the file path.
    pub fn reason(&self) -> String {
        format!("cannot read the image ({})", self.message)
    }
}

fn image_error(path: &Path, e: impl std::fmt::Display) -> ImageReadError {
    ImageReadError {
        message: e.to_string(),
        path: path.to_path_buf(),
    }
}

/// A reader for the image at `path`, its format taken from the extension as `ImageReader::open` does; a FIFO or
/// device is refused instead of opened (opening a FIFO blocks).
fn open_image(path: &Path) -> Result<image::ImageReader<BufReader<File>>, ImageReadError> {
    let file = open_regular(path).map_err(|e| image_error(path, e))?;
    let mut reader = image::ImageReader::new(BufReader::new(file));
    if let Ok(format) = image::ImageFormat::from_path(path) {
        reader.set_format(format);
    }
    Ok(reader)
}

/// `(width, height)` from the image header, without decoding pixels.
pub fn image_size(path: &Path) -> Result<(u32, u32), ImageReadError> {
    let reader = open_image(path)?;
    let reader = reader
        .with_guessed_format()
        .map_err(|e| image_error(path, e))?;
    let (w, h) = reader.into_dimensions().map_err(|e| image_error(path, e))?;
    if w == 0 || h == 0 {
        return Err(image_error(path, "the image is 0 pixels wide or high"));
    }
    Ok((w, h))
}

/// Decodes an image as 8-bit RGB; an alpha channel is dropped, as musubi-tuner's RGB conversion does.
pub fn load_rgb(path: &Path) -> Result<RgbImage, ImageReadError> {
    let reader = open_image(path)?;
    let reader = reader
        .with_guessed_format()
        .map_err(|e| image_error(path, e))?;
    Ok(reader.decode().map_err(|e| image_error(path, e))?.to_rgb8())
}

/// Size and length of an image or video.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaInfo {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Frames, for videos.
    pub frame_count: Option<u32>,
    /// Frame rate, for video files that state one.
    pub fps: Option<f64>,
}

/// Why a video could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum VideoProbeError {
    /// A video file: ffprobe failed, timed out or is missing.
    #[error(transparent)]
    Media(#[from] MediaError),
    /// A frame of an image-folder video.
    #[error(transparent)]
    Image(#[from] ImageReadError),
    /// An image-folder video with no images, or a folder that cannot be listed.
    #[error("the folder has no images to use as video frames: {0}")]
    EmptyFolder(PathBuf),
}

impl VideoProbeError {
    /// What went wrong, without the file path.
    pub fn reason(&self) -> String {
        match self {
            VideoProbeError::Media(e) => e.reason(),
            VideoProbeError::Image(e) => format!("a frame in the folder is unreadable: {}", e),
            VideoProbeError::EmptyFolder(_) => {
                "the folder has no images to use as video frames".into()
            }
        }
    }
}

/// Measures a video file (through ffprobe) or a folder of frames (count, and the first frame's size; no
/// ffprobe needed).
pub fn probe_video(tools: Option<&MediaTools>, path: &Path) -> Result<MediaInfo, VideoProbeError> {
    if path.is_dir() {
        let frames = list_files(path, is_image).unwrap_or_default();
        let first = frames
            .first()
            .ok_or_else(|| VideoProbeError::EmptyFolder(path.to_path_buf()))?;
        let (width, height) = image_size(first)?;
        return Ok(MediaInfo {
            width,
            height,
            frame_count: Some(u32::try_from(frames.len()).unwrap_or(u32::MAX)),
            fps: None,
        });
    }
    let info = require(tools, "ffprobe")?.probe(path)?;
    Ok(MediaInfo {
        width: info.width,
        height: info.height,
        frame_count: Some(info.frame_count),
        fps: info.fps,
    })
}

/// Decodes the first `max_frames` frames (all when `None`) of a video file or folder of frames.
pub fn decode_video(
    tools: Option<&MediaTools>,
    path: &Path,
    max_frames: Option<usize>,
) -> Result<Vec<RgbImage>, VideoProbeError> {
    if path.is_dir() {
        let frames = list_files(path, is_image).unwrap_or_default();
        let take = max_frames.unwrap_or(frames.len());
        return Ok(frames
            .iter()
            .take(take)
            .map(|f| load_rgb(f))
            .collect::<Result<_, _>>()?);
    }
    let tools = require(tools, "ffmpeg")?;
    let info = tools.probe(path)?;
    Ok(tools.decode(path, &info, max_frames)?)
}

fn require<'a>(tools: Option<&'a MediaTools>, tool: &str) -> Result<&'a MediaTools, MediaError> {
    tools.ok_or_else(|| MediaError::ToolMissing { tool: tool.into() })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn extensions_ignore_case() {
        assert!(
            is_image(Path::new("a/B.PNG"))
                && is_image(Path::new("x.JpEg"))
                && is_image(Path::new("x.webp"))
        );
        assert!(is_video(Path::new("c.MP4")) && is_video(Path::new("c.mkv")));
        assert!(
            !is_image(Path::new("a.txt"))
                && !is_video(Path::new("a"))
                && !is_image(Path::new("mp4"))
        );
    }

    #[test]
    fn header_size_and_broken_images() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.png");
        RgbImage::new(24, 16).save(&good).unwrap();
        assert_eq!(image_size(&good).unwrap(), (24, 16));
        assert_eq!(load_rgb(&good).unwrap().dimensions(), (24, 16));

        let broken = dir.path().join("broken.png");
        std::fs::write(&broken, b"\x89PNG\r\n\x1a\nnot really").unwrap();
        let err = image_size(&broken).unwrap_err().to_string();
        assert!(err.ends_with("broken.png"), "{err}");
        let empty = dir.path().join("empty.jpg");
        std::fs::write(&empty, b"").unwrap();
        assert!(image_size(&empty).is_err());
    }

    #[test]
    fn folder_of_frames_is_a_video() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..3 {
            RgbImage::new(32, 16)
                .save(dir.path().join(format!("f{i}.png")))
                .unwrap();
        }
        let info = probe_video(None, dir.path()).unwrap();
        assert_eq!(
            (info.width, info.height, info.frame_count),
            (32, 16, Some(3))
        );
        assert_eq!(decode_video(None, dir.path(), Some(2)).unwrap().len(), 2);
        let file = dir.path().join("f0.png");
        let err = probe_video(None, &file).unwrap_err().to_string();
        assert!(err.contains("ffprobe was not found"), "{err}");
    }
}
