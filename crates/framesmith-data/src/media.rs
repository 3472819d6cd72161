//! Video probing and decoding through `ffprobe` / `ffmpeg` subprocesses, each with a time limit after which the
//! process is killed and the file reported. Finds the tools beside the executable first, then on `PATH`; on
//! Windows without ffmpeg, videos are read with Windows' own Media Foundation (`media_foundation`).

pub mod audio;
mod process;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use image::RgbImage;
use serde::Deserialize;

use super::tool_message::one_line_reason;
pub use process::{find_tool, tool_version};
use process::{run_with_timeout, Finished};

/// How to get ffmpeg, shown whenever it is missing.
pub const FFMPEG_INSTALL_HINT: &str =
    "install ffmpeg (Debian/Ubuntu: `sudo apt install ffmpeg`; on Windows nothing is needed: \
     Framesmith reads videos with Media Foundation, or ffmpeg.exe beside framesmith.exe or on the PATH)";

/// A video could not be probed or decoded.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// `ffmpeg` or `ffprobe` is not installed.
    #[error("{tool} was not found; {FFMPEG_INSTALL_HINT}")]
    ToolMissing {
        /// `ffmpeg` or `ffprobe`.
        tool: String,
    },
    /// The subprocess ran past its time limit and was killed.
    #[error(
        "{tool} did not finish within {secs} s and was stopped; the file may be damaged: {path}"
    )]
    Timeout {
        /// `ffmpeg` or `ffprobe`.
        tool: String,
        /// The limit.
        secs: u64,
        /// The video.
        path: PathBuf,
    },
    /// The tool ran and failed, or its output made no sense.
    #[error("{tool} cannot read this video ({message}): {path}")]
    Unreadable {
        /// `ffmpeg` or `ffprobe`.
        tool: String,
        /// ffmpeg's own words, or what was wrong with the output.
        message: String,
        /// The video.
        path: PathBuf,
    },
    /// The container lists more frames than can be read: the end of the file is missing.
    #[error("{}: {path}", cut_short(*listed, *read))]
    CutShort {
        /// Frames the container lists.
        listed: u32,
        /// Frames that can be read.
        read: u32,
        /// The video.
        path: PathBuf,
    },
    /// The file has no bytes.
    #[error("the video file is empty (0 bytes): {path}")]
    Empty {
        /// The video.
        path: PathBuf,
    },
    /// Starting the tool or reading the file failed.
    #[error("cannot run {tool}: {path}")]
    Io {
        /// `ffmpeg` or `ffprobe`.
        tool: String,
        /// The video.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl MediaError {
    /// What went wrong, without the file path (for messages that show the path separately).
    pub fn reason(&self) -> String {
        match self {
            MediaError::ToolMissing { .. } => self.to_string(),
            MediaError::Timeout { tool, secs, .. } => {
                format!("{tool} did not finish within {secs} s and was stopped; the file may be damaged")
            }
            MediaError::Unreadable { tool, message, .. } => {
                format!("{tool} cannot read this video ({message})")
            }
            MediaError::CutShort { listed, read, .. } => cut_short(*listed, *read),
            MediaError::Empty { .. } => "the video file is empty (0 bytes)".into(),
            MediaError::Io { tool, source, .. } => format!("cannot run {tool} ({source})"),
        }
    }
}

fn cut_short(listed: u32, read: u32) -> String {
    format!(
        "the video is cut short: it lists {listed} frames but only {read} can be read (an interrupted download or \
         copy?); export or download it again"
    )
}

/// Which decoder reads videos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaBackend {
    /// `ffprobe` / `ffmpeg` subprocesses.
    Ffmpeg,
    /// Windows' own Media Foundation, in process (nothing to install).
    #[cfg(windows)]
    MediaFoundation,
}

/// Where ffmpeg and ffprobe are (or that Media Foundation reads videos), and how long each call may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaTools {
    /// The `ffmpeg` executable (unused with Media Foundation).
    pub ffmpeg: PathBuf,
    /// The `ffprobe` executable (unused with Media Foundation).
    pub ffprobe: PathBuf,
    /// The decoder in use.
    pub backend: MediaBackend,
    /// Limit for one probe.
    pub probe_timeout: Duration,
    /// Limit for decoding one video.
    pub decode_timeout: Duration,
}

/// Default limit for one `ffprobe` call.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit for decoding one video.
pub const DEFAULT_DECODE_TIMEOUT: Duration = Duration::from_secs(600);

impl MediaTools {
    /// Tools at the given paths with the default time limits.
    pub fn with_paths(ffmpeg: impl Into<PathBuf>, ffprobe: impl Into<PathBuf>) -> Self {
        Self {
            ffmpeg: ffmpeg.into(),
            ffprobe: ffprobe.into(),
            backend: MediaBackend::Ffmpeg,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            decode_timeout: DEFAULT_DECODE_TIMEOUT,
        }
    }

    /// Finds `ffmpeg` and `ffprobe` beside the running executable, then on `PATH`. On Windows, when they are not
    /// there, Media Foundation reads the videos instead; an installed ffmpeg is preferred because it decodes the
    /// same frames as on Linux and as musubi-tuner (PyAV is ffmpeg).
    pub fn locate() -> Result<Self, MediaError> {
        #[cfg(windows)]
        return Ok(Self::locate_ffmpeg().unwrap_or_else(|_| Self::media_foundation()));
        #[cfg(not(windows))]
        Self::locate_ffmpeg()
    }

    fn locate_ffmpeg() -> Result<Self, MediaError> {
        let ffmpeg = find_tool("ffmpeg").ok_or_else(|| MediaError::ToolMissing {
            tool: "ffmpeg".into(),
        })?;
        let ffprobe = find_tool("ffprobe").ok_or_else(|| MediaError::ToolMissing {
            tool: "ffprobe".into(),
        })?;
        Ok(Self::with_paths(ffmpeg, ffprobe))
    }

    /// Videos read with Media Foundation, with the default time limits.
    #[cfg(windows)]
    pub fn media_foundation() -> Self {
        Self {
            backend: MediaBackend::MediaFoundation,
            ..Self::with_paths(PathBuf::new(), PathBuf::new())
        }
    }

    /// Size, frame count and frame rate of a video's first video stream.
    pub fn probe(&self, path: &Path) -> Result<VideoInfo, MediaError> {
        check_not_empty(path)?;
        #[cfg(windows)]
        if self.backend == MediaBackend::MediaFoundation {
            return super::media_foundation::probe(path, self.probe_timeout);
        }
        let mut cmd = Command::new(&self.ffprobe);
        cmd.args([
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-count_packets",
            "-show_entries",
        ])
        .arg("stream=codec_name,width,height,nb_frames,nb_read_packets,r_frame_rate,avg_frame_rate")
        .args(["-of", "json"])
        .arg(path);
        let out = run_with_timeout(cmd, self.probe_timeout, "ffprobe", path)?;
        if !out.status.success() {
            return Err(unreadable(
                "ffprobe",
                one_line_reason(&out.stderr, path),
                path,
            ));
        }
        parse_probe(&out.stdout, path)
    }

    /// Decodes up to `max_frames` frames (all when `None`) as RGB, in decode order with no frame dropped or
    /// repeated, and without applying rotation metadata (as musubi-tuner's PyAV reader).
    pub fn decode(
        &self,
        path: &Path,
        info: &VideoInfo,
        max_frames: Option<usize>,
    ) -> Result<Vec<RgbImage>, MediaError> {
        check_not_empty(path)?;
        #[cfg(windows)]
        if self.backend == MediaBackend::MediaFoundation {
            return super::media_foundation::decode(path, info, max_frames, self.decode_timeout);
        }
        // `-fps_mode` exists from ffmpeg 5.1, `-vsync` (its older name) is deprecated there; try the new one.
        let mut out = self.run_decode(path, max_frames, "-fps_mode")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            && stderr.contains("fps_mode")
            && stderr.contains("nrecognized option")
        {
            out = self.run_decode(path, max_frames, "-vsync")?;
        }
        if !out.status.success() {
            return Err(unreadable(
                "ffmpeg",
                one_line_reason(&out.stderr, path),
                path,
            ));
        }
        split_frames(out.stdout, info.width, info.height, path)
    }

    /// Decodes the one frame shown at `at_secs` (the first frame when `None`), within the probe's time limit:
    /// a seek, not a decode of everything before it. Fails when no frame decodes there.
    pub fn decode_frame(
        &self,
        path: &Path,
        info: &VideoInfo,
        at_secs: Option<f64>,
    ) -> Result<RgbImage, MediaError> {
        check_not_empty(path)?;
        #[cfg(windows)]
        if self.backend == MediaBackend::MediaFoundation {
            // Media Foundation reads from the start; the first frame is what it can check cheaply.
            let frames = super::media_foundation::decode(path, info, Some(1), self.probe_timeout)?;
            return frames
                .into_iter()
                .next()
                .ok_or_else(|| unreadable("Media Foundation", "no frame decodes".into(), path));
        }
        let mut cmd = Command::new(&self.ffmpeg);
        cmd.args(["-nostdin", "-v", "error", "-noautorotate"]);
        if let Some(secs) = at_secs {
            cmd.args(["-ss", &format!("{secs:.6}")]);
        }
        cmd.arg("-i").arg(path).args([
            "-map",
            "0:v:0",
            "-frames:v",
            "1",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "pipe:1",
        ]);
        let out = run_with_timeout(cmd, self.probe_timeout, "ffmpeg", path)?;
        if !out.status.success() {
            return Err(unreadable(
                "ffmpeg",
                one_line_reason(&out.stderr, path),
                path,
            ));
        }
        split_frames(out.stdout, info.width, info.height, path)?
            .into_iter()
            .next()
            .ok_or_else(|| unreadable("ffmpeg", "no frames were decoded".into(), path))
    }

    /// Every decoded frame goes out as it is: passthrough frame timing, so none is dropped or repeated.
    fn run_decode(
        &self,
        path: &Path,
        max_frames: Option<usize>,
        sync_option: &str,
    ) -> Result<Finished, MediaError> {
        let mut cmd = Command::new(&self.ffmpeg);
        cmd.args(["-nostdin", "-v", "error", "-noautorotate", "-i"])
            .arg(path)
            .args(["-map", "0:v:0", sync_option, "passthrough"]);
        if let Some(n) = max_frames {
            cmd.args(["-frames:v", &n.to_string()]);
        }
        cmd.args(["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]);
        run_with_timeout(cmd, self.decode_timeout, "ffmpeg", path)
    }
}

/// What `ffprobe` says about a video.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoInfo {
    /// Coded width in pixels (rotation metadata not applied).
    pub width: u32,
    /// Coded height in pixels.
    pub height: u32,
    /// Number of frames (packets counted by demuxing).
    pub frame_count: u32,
    /// Average frame rate, when the container knows it.
    pub fps: Option<f64>,
    /// Codec name, e.g. `h264`.
    pub codec: String,
}

#[derive(Deserialize)]
struct ProbeOutput {
    #[serde(default)]
    streams: Vec<ProbeStream>,
}

#[derive(Deserialize)]
struct ProbeStream {
    codec_name: Option<String>,
    width: Option<u32>,
    height: Option<u32>,
    nb_frames: Option<String>,
    nb_read_packets: Option<String>,
    avg_frame_rate: Option<String>,
    r_frame_rate: Option<String>,
}

fn parse_probe(stdout: &[u8], path: &Path) -> Result<VideoInfo, MediaError> {
    let parsed: ProbeOutput = serde_json::from_slice(stdout)
        .map_err(|e| unreadable("ffprobe", format!("unexpected output: {e}"), path))?;
    let Some(stream) = parsed.streams.into_iter().next() else {
        return Err(unreadable("ffprobe", "no video stream".into(), path));
    };
    let (width, height) = match (stream.width, stream.height) {
        (Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
        _ => {
            return Err(unreadable(
                "ffprobe",
                "the video stream has no picture size".into(),
                path,
            ))
        }
    };
    let count = |s: &Option<String>| {
        s.as_deref()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n > 0)
    };
    let read = count(&stream.nb_read_packets);
    let listed = count(&stream.nb_frames);
    // One frame of difference is left alone: containers count edit-list and trailing packets differently.
    if let (Some(read), Some(listed)) = (read, listed) {
        if read.saturating_add(1) < listed {
            return Err(MediaError::CutShort {
                listed,
                read,
                path: path.to_path_buf(),
            });
        }
    }
    let frame_count = read.or(listed).unwrap_or(0);
    if frame_count == 0 {
        return Err(unreadable(
            "ffprobe",
            "the video has no frames".into(),
            path,
        ));
    }
    let fps = parse_rate(stream.avg_frame_rate.as_deref())
        .or_else(|| parse_rate(stream.r_frame_rate.as_deref()));
    Ok(VideoInfo {
        width,
        height,
        frame_count,
        fps,
        codec: stream.codec_name.unwrap_or_default(),
    })
}

/// `"30000/1001"` → 29.97; `"0/0"` → `None`.
fn parse_rate(rate: Option<&str>) -> Option<f64> {
    let (num, den) = rate?.split_once('/')?;
    let (num, den): (f64, f64) = (num.parse().ok()?, den.parse().ok()?);
    (den > 0.0 && num > 0.0).then(|| num / den)
}

fn split_frames(
    bytes: Vec<u8>,
    width: u32,
    height: u32,
    path: &Path,
) -> Result<Vec<RgbImage>, MediaError> {
    let frame_len = width as usize * height as usize * 3;
    if bytes.is_empty() {
        return Err(unreadable("ffmpeg", "no frames were decoded".into(), path));
    }
    if bytes.len() % frame_len != 0 {
        return Err(unreadable(
            "ffmpeg",
            format!(
                "{} bytes of output is not a whole number of {width}x{height} frames",
                bytes.len()
            ),
            path,
        ));
    }
    Ok(bytes
        .chunks_exact(frame_len)
        .filter_map(|c| RgbImage::from_raw(width, height, c.to_vec()))
        .collect())
}

fn unreadable(tool: &str, message: String, path: &Path) -> MediaError {
    MediaError::Unreadable {
        tool: tool.into(),
        message,
        path: path.to_path_buf(),
    }
}

fn check_not_empty(path: &Path) -> Result<(), MediaError> {
    let meta = std::fs::metadata(path).map_err(|source| MediaError::Io {
        tool: "the file system".into(),
        path: path.to_path_buf(),
        source,
    })?;
    if meta.len() == 0 {
        return Err(MediaError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn probe_json_is_parsed() {
        let json = br#"{"programs": [], "streams": [{"codec_name": "h264", "width": 320, "height": 240,
            "r_frame_rate": "30/1", "avg_frame_rate": "30000/1001", "nb_frames": "31", "nb_read_packets": "30"}]}"#;
        let info = parse_probe(json, Path::new("a.mp4")).unwrap();
        assert_eq!((info.width, info.height, info.frame_count), (320, 240, 30));
        assert!((info.fps.unwrap() - 29.97).abs() < 0.01);
        let cut = br#"{"streams": [{"width": 64, "height": 48, "nb_frames": "32", "nb_read_packets": "17"}]}"#;
        let err = parse_probe(cut, Path::new("/d/cut.mp4")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, MediaError::CutShort { .. }), "{msg}");
        assert!(
            msg.contains("cut short: it lists 32 frames but only 17")
                && msg.ends_with("/d/cut.mp4"),
            "{msg}"
        );
        let none = br#"{"streams": []}"#;
        let err = parse_probe(none, Path::new("a.mp4"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no video stream") && err.ends_with("a.mp4"),
            "{err}"
        );
    }

    #[test]
    fn raw_output_is_split_into_frames() {
        let frames = split_frames(vec![7; 2 * 2 * 3 * 3], 2, 2, Path::new("v.mp4")).unwrap();
        assert_eq!(frames.len(), 3);
        assert!(split_frames(vec![0; 13], 2, 2, Path::new("v.mp4")).is_err());
    }

    #[test]
    fn missing_tool_says_how_to_install() {
        let tools = MediaTools::with_paths("/nonexistent/ffmpeg", "/nonexistent/ffprobe");
        let dir = tempfile::tempdir().unwrap();
        let video = dir.path().join("v.mp4");
        std::fs::write(&video, b"not empty").unwrap();
        let err = tools.probe(&video).unwrap_err();
        assert!(matches!(err, MediaError::ToolMissing { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("apt install ffmpeg") && msg.contains("Media Foundation"),
            "{msg}"
        );
    }
}
