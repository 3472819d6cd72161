//! H.264 MP4 writing for sample clips: OpenH264 (built from its bundled source, nothing to install) encodes,
//! muxide writes the MP4 container. Frames are RGB8; odd sizes are padded to even (YUV 4:2:0 needs even sizes).

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use muxide::api::{MuxerBuilder, VideoCodec};
use openh264::encoder::{BitRate, Encoder, EncoderConfig, FrameRate, FrameType};
use openh264::formats::{RgbSliceU8, YUVBuffer};
use openh264::OpenH264API;

/// One RGB8 frame, row-major, `width * height * 3` bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct RgbFrame {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

impl RgbFrame {
    /// The frame padded (edge pixels repeated) to even width and height.
    fn even(&self) -> RgbFrame {
        let (w, h) = (self.width + self.width % 2, self.height + self.height % 2);
        if (w, h) == (self.width, self.height) {
            return self.clone();
        }
        let mut data = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            let sy = y.min(self.height - 1);
            for x in 0..w {
                let sx = x.min(self.width - 1);
                let i = (sy * self.width + sx) * 3;
                data.extend_from_slice(&self.data[i..i + 3]);
            }
        }
        RgbFrame {
            width: w,
            height: h,
            data,
        }
    }
}

/// Error writing a clip.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("no frames to encode")]
    Empty,
    #[error(
        "frame {index} is {got:?}, expected {expected:?} (all frames of a clip share one size)"
    )]
    FrameSize {
        index: usize,
        got: (usize, usize),
        expected: (usize, usize),
    },
    #[error("H.264 encoder: {0}")]
    Encoder(String),
    #[error("MP4 muxer: {0}")]
    Muxer(String),
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Encodes `frames` at `fps` into an H.264 MP4 at `path` (written to a temporary name, then renamed).
pub fn write_mp4(path: &Path, frames: &[RgbFrame], fps: f64) -> Result<(), EncodeError> {
    let first = frames.first().ok_or(EncodeError::Empty)?;
    let expected = (first.width, first.height);
    for (index, f) in frames.iter().enumerate() {
        if (f.width, f.height) != expected || f.data.len() != f.width * f.height * 3 || f.width == 0
        {
            return Err(EncodeError::FrameSize {
                index,
                got: (f.width, f.height),
                expected,
            });
        }
    }
    let io_err = |source| EncodeError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("mp4.partial");
    let file = File::create(&tmp).map_err(io_err)?;
    let even_first = first.even();
    // OpenH264 drops frames to hold its bit rate unless told not to: noisy samples lost most of theirs.
    let config = EncoderConfig::new()
        .bitrate(BitRate::from_bps(4_000_000))
        .max_frame_rate(FrameRate::from_hz(fps as f32))
        .skip_frames(false);
    let mut encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
        .map_err(|e| EncodeError::Encoder(e.to_string()))?;
    let mut muxer = MuxerBuilder::new(BufWriter::new(file))
        .video(
            VideoCodec::H264,
            even_first.width as u32,
            even_first.height as u32,
            fps,
        )
        .build()
        .map_err(|e| EncodeError::Muxer(e.to_string()))?;
    for (i, frame) in frames.iter().enumerate() {
        let frame = frame.even();
        let yuv =
            YUVBuffer::from_rgb_source(RgbSliceU8::new(&frame.data, (frame.width, frame.height)));
        let bitstream = encoder
            .encode(&yuv)
            .map_err(|e| EncodeError::Encoder(e.to_string()))?;
        let keyframe = matches!(bitstream.frame_type(), FrameType::IDR | FrameType::I);
        let data = bitstream.to_vec();
        if data.is_empty() {
            return Err(EncodeError::Encoder(format!(
                "the H.264 encoder produced nothing for frame {i}"
            )));
        }
        muxer
            .write_video(i as f64 / fps, &data, keyframe)
            .map_err(|e| EncodeError::Muxer(e.to_string()))?;
    }
    muxer
        .finish()
        .map_err(|e| EncodeError::Muxer(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(io_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_mp4_container() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let frames: Vec<RgbFrame> = (0..9)
            .map(|t| RgbFrame {
                width: 33,
                height: 18,
                data: (0..33 * 18 * 3)
                    .map(|i| ((i * 7 + t * 20) % 256) as u8)
                    .collect(),
            })
            .collect();
        let path = dir.path().join("clip.mp4");
        write_mp4(&path, &frames, 16.0)?;
        let bytes = std::fs::read(&path)?;
        assert_eq!(&bytes[4..8], b"ftyp");
        assert!(bytes.windows(4).any(|w| w == b"moov"));
        assert!(bytes.windows(4).any(|w| w == b"avc1"));
        Ok(())
    }

    /// Sample count of the MP4's one track (`stsz` box: version/flags, sample size, then the count).
    fn mp4_samples(bytes: &[u8]) -> Option<u32> {
        let at = bytes.windows(4).position(|w| w == b"stsz")?;
        let count = bytes.get(at + 12..at + 16)?;
        Some(u32::from_be_bytes(count.try_into().ok()?))
    }

    /// Frames of noise (what an untrained model's samples look like) are the encoder's hardest case: none may be
    /// dropped to meet the bit rate (a 21-frame sample came out with 13).
    #[test]
    fn every_frame_of_a_hard_clip_is_written() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let frames: Vec<RgbFrame> = (0..21)
            .map(|_| RgbFrame {
                width: 832,
                height: 480,
                data: (0..832 * 480 * 3)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state >> 56) as u8
                    })
                    .collect(),
            })
            .collect();
        let path = dir.path().join("noise.mp4");
        write_mp4(&path, &frames, 16.0)?;
        assert_eq!(mp4_samples(&std::fs::read(&path)?), Some(21));
        Ok(())
    }

    #[test]
    fn rejects_mixed_sizes_and_empty_clips() {
        let a = RgbFrame {
            width: 2,
            height: 2,
            data: vec![0; 12],
        };
        let b = RgbFrame {
            width: 4,
            height: 2,
            data: vec![0; 24],
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.mp4");
        assert!(matches!(
            write_mp4(&path, &[], 16.0),
            Err(EncodeError::Empty)
        ));
        assert!(matches!(
            write_mp4(&path, &[a, b], 16.0),
            Err(EncodeError::FrameSize { index: 1, .. })
        ));
    }
}
