//! H.264 MP4 writing for sample clips: OpenH264 (built from its bundled source, nothing to install) encodes,
//! muxide writes the MP4 container. Frames are RGB8; odd sizes are padded to even (YUV 4:2:0 needs even sizes).

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use muxide::api::{MuxerBuilder, VideoCodec};
use openh264::encoder::{Encoder, EncoderConfig, FrameRate, FrameType, QpRange, RateControlMode};
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
    let mut encoder = Encoder::with_api_config(OpenH264API::from_source(), encoder_config(fps))
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

/// Samples are judged by eye, frame by frame: every frame is kept (OpenH264 drops frames to hold a bit rate, and
/// noisy samples lost most of theirs), at one quality throughout. Rate control is off, so no bit rate is asked
/// for that could not be held without dropping frames (which OpenH264 warns of at every start); the fixed
/// quantiser keeps fine detail (about 40 dB on smooth frames) at a few hundred kB for a 480p sample.
fn encoder_config(fps: f64) -> EncoderConfig {
    EncoderConfig::new()
        .rate_control_mode(RateControlMode::Off)
        .qp(QpRange::new(SAMPLE_QP, SAMPLE_QP))
        .max_frame_rate(FrameRate::from_hz(fps as f32))
        .skip_frames(false)
}

/// H.264 quantiser of sample clips (0 best, 51 worst); 22 is visually lossless for most content.
const SAMPLE_QP: u8 = 22;

#[cfg(test)]
mod tests {
    use super::*;
    use openh264::decoder::Decoder;
    use openh264::formats::YUVSource;

    /// Peak signal-to-noise ratio (dB) of `b` against `a`.
    fn psnr(a: &[u8], b: &[u8]) -> f64 {
        let mse = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum::<f64>()
            / a.len() as f64;
        10.0 * (255.0f64.powi(2) / mse.max(1e-12)).log10()
    }

    /// What a sample clip looks like after encoding: each frame decoded back, against the one encoded.
    #[test]
    fn sample_frames_come_back_close_to_what_was_encoded() -> Result<(), Box<dyn std::error::Error>>
    {
        let (w, h) = (320usize, 192usize);
        let frames: Vec<Vec<u8>> = (0..9)
            .map(|t| {
                (0..w * h * 3)
                    .map(|i| {
                        let (p, c) = (i / 3, i % 3);
                        let (x, y) = ((p % w) as f64, (p / w) as f64);
                        let v = 128.0
                            + 90.0
                                * ((x + 3.0 * t as f64) / 23.0 + c as f64).sin()
                                * (y / 31.0).cos();
                        v as u8
                    })
                    .collect()
            })
            .collect();
        let mut encoder =
            Encoder::with_api_config(OpenH264API::from_source(), encoder_config(16.0))?;
        let mut decoder = Decoder::new()?;
        let mut worst = f64::INFINITY;
        for frame in &frames {
            let yuv = YUVBuffer::from_rgb_source(RgbSliceU8::new(frame, (w, h)));
            let packet = encoder.encode(&yuv)?.to_vec();
            let decoded = decoder.decode(&packet)?.ok_or("a frame did not decode")?;
            assert_eq!(decoded.dimensions(), (w, h));
            let mut rgb = vec![0u8; w * h * 3];
            decoded.write_rgb8(&mut rgb);
            worst = worst.min(psnr(frame, &rgb));
        }
        println!("worst frame {worst:.1} dB");
        // The RGB to YUV 4:2:0 round trip alone costs a few dB on these colour stripes.
        assert!(worst > 30.0, "worst frame {worst:.1} dB");
        Ok(())
    }

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
