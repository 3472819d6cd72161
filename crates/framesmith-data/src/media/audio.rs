//! Sound through the ffmpeg tools: whether a video has an audio stream, a span of it decoded to 32-bit float
//! samples at a given rate (ffmpeg resamples; the channels kept as the file has them), and a waveform muxed into
//! an MP4 beside its video (AAC), for sample clips with sound. WAV files are written here too. Media Foundation
//! reads no audio: sound needs ffmpeg.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use super::process::run_with_timeout;
use super::{unreadable, MediaBackend, MediaError, MediaTools};
use crate::tool_message::one_line_reason;

/// Decoded sound: interleaved samples (frame-major: every channel of the first instant, then of the next).
#[derive(Clone, Debug, PartialEq)]
pub struct AudioClip {
    pub sample_rate: u32,
    pub channels: usize,
    pub samples: Vec<f32>,
}

impl AudioClip {
    /// Samples per channel.
    pub fn frames(&self) -> usize {
        self.samples.len() / self.channels.max(1)
    }

    /// One channel's samples.
    pub fn channel(&self, c: usize) -> Vec<f32> {
        self.samples
            .iter()
            .skip(c)
            .step_by(self.channels.max(1))
            .copied()
            .collect()
    }

    /// A clip from planar channels of equal length.
    pub fn from_planar(sample_rate: u32, planes: &[Vec<f32>]) -> Self {
        let n = planes.iter().map(Vec::len).min().unwrap_or(0);
        let mut samples = Vec::with_capacity(n * planes.len());
        for i in 0..n {
            samples.extend(planes.iter().map(|p| p[i]));
        }
        Self {
            sample_rate,
            channels: planes.len(),
            samples,
        }
    }
}

#[derive(Deserialize)]
struct AudioProbe {
    #[serde(default)]
    streams: Vec<AudioStream>,
}

#[derive(Deserialize)]
struct AudioStream {
    channels: Option<usize>,
}

/// Writes `clip` as a 32-bit float WAV file.
pub fn write_wav(path: &Path, clip: &AudioClip) -> std::io::Result<()> {
    let data_bytes = (clip.samples.len() * 4) as u32;
    let channels = clip.channels as u16;
    let mut out = Vec::with_capacity(44 + data_bytes as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_bytes).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&3u16.to_le_bytes()); // IEEE float
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&clip.sample_rate.to_le_bytes());
    out.extend_from_slice(&(clip.sample_rate * 4 * u32::from(channels)).to_le_bytes());
    out.extend_from_slice(&(4 * channels).to_le_bytes());
    out.extend_from_slice(&32u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_bytes.to_le_bytes());
    for s in &clip.samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    let mut file = std::fs::File::create(path)?;
    file.write_all(&out)?;
    file.sync_all()
}

impl MediaTools {
    fn require_ffmpeg(&self) -> Result<(), MediaError> {
        if self.backend == MediaBackend::Ffmpeg {
            return Ok(());
        }
        Err(MediaError::ToolMissing {
            tool: "ffmpeg (Media Foundation reads no audio)".into(),
        })
    }

    /// The channels of the first audio stream of `path`; `None` when it has none.
    pub fn audio_channels(&self, path: &Path) -> Result<Option<usize>, MediaError> {
        self.require_ffmpeg()?;
        let mut cmd = Command::new(&self.ffprobe);
        cmd.args([
            "-v",
            "error",
            "-select_streams",
            "a:0",
            "-show_entries",
            "stream=channels",
        ])
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
        let parsed: AudioProbe = serde_json::from_slice(&out.stdout)
            .map_err(|e| unreadable("ffprobe", format!("unexpected output: {e}"), path))?;
        Ok(parsed
            .streams
            .first()
            .map(|s| s.channels.unwrap_or(1).max(1)))
    }

    /// The first audio stream of `path` from `start_secs` for `duration_secs`, resampled by ffmpeg to
    /// `sample_rate`, in the file's channels; `None` when the file has no audio stream. The clip can be shorter
    /// than asked when the sound ends first.
    pub fn decode_audio(
        &self,
        path: &Path,
        (start_secs, duration_secs): (f64, f64),
        sample_rate: u32,
    ) -> Result<Option<AudioClip>, MediaError> {
        let Some(channels) = self.audio_channels(path)? else {
            return Ok(None);
        };
        let mut cmd = Command::new(&self.ffmpeg);
        cmd.args(["-nostdin", "-v", "error"])
            .args(["-ss", &format!("{:.6}", start_secs.max(0.0))])
            .args(["-t", &format!("{duration_secs:.6}")])
            .arg("-i")
            .arg(path)
            .args([
                "-map",
                "0:a:0",
                "-vn",
                "-f",
                "f32le",
                "-acodec",
                "pcm_f32le",
            ])
            .args([
                "-ar",
                &sample_rate.to_string(),
                "-ac",
                &channels.to_string(),
                "pipe:1",
            ]);
        let out = run_with_timeout(cmd, self.decode_timeout, "ffmpeg", path)?;
        if !out.status.success() {
            return Err(unreadable(
                "ffmpeg",
                one_line_reason(&out.stderr, path),
                path,
            ));
        }
        let samples = out
            .stdout
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Some(AudioClip {
            sample_rate,
            channels,
            samples,
        }))
    }

    /// Muxes `audio` into the MP4 at `mp4` (its video copied as it is, the sound as AAC), replacing the file.
    pub fn mux_audio(&self, mp4: &Path, audio: &AudioClip) -> Result<(), MediaError> {
        self.require_ffmpeg()?;
        let io = |source| MediaError::Io {
            tool: "ffmpeg".into(),
            path: mp4.to_path_buf(),
            source,
        };
        let wav = mp4.with_extension("audio.wav");
        let muxed = mp4.with_extension("muxed.mp4");
        write_wav(&wav, audio).map_err(io)?;
        let mut cmd = Command::new(&self.ffmpeg);
        cmd.args(["-nostdin", "-v", "error", "-y", "-i"])
            .arg(mp4)
            .arg("-i")
            .arg(&wav)
            .args([
                "-map", "0:v:0", "-map", "1:a:0", "-c:v", "copy", "-c:a", "aac", "-b:a", "192k",
            ])
            .args(["-f", "mp4"])
            .arg(&muxed);
        let out = run_with_timeout(cmd, self.decode_timeout, "ffmpeg", mp4);
        let _ = std::fs::remove_file(&wav);
        let out = out?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&muxed);
            return Err(unreadable("ffmpeg", one_line_reason(&out.stderr, mp4), mp4));
        }
        std::fs::rename(&muxed, mp4).map_err(io)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn tools() -> Option<MediaTools> {
        MediaTools::locate().ok()
    }

    /// A 1 s, 24 fps test clip; with a 440 Hz stereo tone at 44.1 kHz when `sound`.
    fn clip(dir: &Path, sound: bool, tools: &MediaTools) -> std::path::PathBuf {
        let path = dir.join(if sound { "tone.mp4" } else { "silent.mp4" });
        let mut cmd = Command::new(&tools.ffmpeg);
        cmd.args([
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=64x48:rate=24:duration=1",
        ]);
        if sound {
            cmd.args([
                "-f",
                "lavfi",
                "-i",
                "sine=frequency=440:sample_rate=44100:duration=1",
            ])
            .args(["-ac", "2", "-c:a", "aac"]);
        }
        cmd.args(["-pix_fmt", "yuv420p"]).arg(&path);
        assert!(cmd.status().unwrap().success());
        path
    }

    #[test]
    fn a_span_decodes_at_the_asked_rate_and_a_silent_video_has_none() {
        let Some(tools) = tools() else { return };
        let dir = tempfile::tempdir().unwrap();
        let tone = clip(dir.path(), true, &tools);
        assert_eq!(tools.audio_channels(&tone).unwrap(), Some(2));
        let audio = tools
            .decode_audio(&tone, (0.25, 0.5), 16000)
            .unwrap()
            .unwrap();
        assert_eq!((audio.sample_rate, audio.channels), (16000, 2));
        assert!(
            (audio.frames() as i64 - 8000).abs() <= 32,
            "{}",
            audio.frames()
        );
        let left = audio.channel(0);
        let rms = (left.iter().map(|s| s * s).sum::<f32>() / left.len() as f32).sqrt();
        assert!(rms > 0.03, "the tone (amplitude 1/8) is there: rms {rms}");
        let silent = clip(dir.path(), false, &tools);
        assert_eq!(tools.audio_channels(&silent).unwrap(), None);
        assert!(tools
            .decode_audio(&silent, (0.0, 1.0), 16000)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_waveform_is_muxed_into_the_mp4() {
        let Some(tools) = tools() else { return };
        let dir = tempfile::tempdir().unwrap();
        let video = clip(dir.path(), false, &tools);
        let tone: Vec<f32> = (0..24000)
            .map(|i| (i as f32 * 440.0 * std::f32::consts::TAU / 24000.0).sin() * 0.5)
            .collect();
        let audio = AudioClip::from_planar(24000, &[tone.clone(), tone]);
        tools.mux_audio(&video, &audio).unwrap();
        assert_eq!(tools.audio_channels(&video).unwrap(), Some(2));
        let back = tools
            .decode_audio(&video, (0.0, 1.0), 24000)
            .unwrap()
            .unwrap();
        assert!(
            (back.frames() as i64 - 24000).abs() < 2400,
            "{}",
            back.frames()
        );
        assert!(tools.probe(&video).unwrap().frame_count >= 23);
    }

    #[test]
    fn wav_header_describes_the_samples() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        let clip = AudioClip::from_planar(16000, &[vec![0.5; 10], vec![-0.5; 10]]);
        assert_eq!(clip.channel(1), vec![-0.5; 10]);
        write_wav(&path, &clip).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 44 + 80);
        assert_eq!(&bytes[0..4], b"RIFF");
        assert_eq!(u16::from_le_bytes([bytes[22], bytes[23]]), 2);
        assert_eq!(
            u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]),
            16000
        );
    }
}
