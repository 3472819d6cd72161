//! Decoded video to the RGB frames a clip is written from: one conversion for every family's decoder.

use candle_core::{DType, Device, Tensor};

use framesmith_data::video::encode::RgbFrame;

/// `[3, T, H, W]` in [−1, 1] to RGB8 frames (clamped, `(x + 1) · 127.5` rounded).
pub fn video_to_frames(video: &Tensor) -> anyhow::Result<Vec<RgbFrame>> {
    let (c, t, h, w) = video.dims4()?;
    if c != 3 {
        anyhow::bail!("decoded video has {c} channels, expected 3");
    }
    // Into RGB8 on the clip's device, each f32 step dropped as the next exists, so that only the bytes come to the
    // host: a long sample's clip is large in f32, on the device and in RAM.
    let x = video.to_dtype(DType::F32)?.clamp(-1f32, 1f32)?;
    let x = ((x + 1.0)? * 127.5)?.round()?;
    let bytes = x.to_dtype(DType::U8)?;
    drop(x);
    let pixels = bytes
        .permute((1, 2, 3, 0))?
        .contiguous()?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<u8>()?;
    Ok(pixels
        .chunks_exact(h * w * 3)
        .take(t)
        .map(|data| RgbFrame {
            width: w,
            height: h,
            data: data.to_vec(),
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_the_clamped_and_rounded_clip() -> anyhow::Result<()> {
        // [3, 2, 1, 2]: channel c of frame t, pixel x.
        let values = [
            -2.0f32, 1.0, 0.0, 0.5, // red
            -1.0, 0.999, 2.0, -0.5, // green
            0.25, -0.25, 1.0, -1.0, // blue
        ];
        let video =
            Tensor::from_slice(&values, (3, 2, 1, 2), &Device::Cpu)?.to_dtype(DType::BF16)?;
        let frames = video_to_frames(&video)?;
        assert_eq!(frames.len(), 2);
        let byte = |v: f32| ((v.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8;
        let bf = |v: f32| half::bf16::from_f32(v).to_f32();
        for (t, frame) in frames.iter().enumerate() {
            assert_eq!((frame.width, frame.height), (2, 1));
            let expected: Vec<u8> = (0..2)
                .flat_map(|x| (0..3).map(move |c| values[c * 4 + t * 2 + x]))
                .map(|v| byte(bf(v)))
                .collect();
            assert_eq!(frame.data, expected, "frame {t}");
        }
        Ok(())
    }
}
