//! Decoded video to the RGB frames a clip is written from: one conversion for every family's decoder.

use candle_core::{DType, Device, Tensor};

use framesmith_data::video::encode::RgbFrame;

/// `[3, T, H, W]` in [−1, 1] to RGB8 frames (clamped, `(x + 1) · 127.5` rounded).
pub fn video_to_frames(video: &Tensor) -> anyhow::Result<Vec<RgbFrame>> {
    let (c, t, h, w) = video.dims4()?;
    if c != 3 {
        anyhow::bail!("decoded video has {c} channels, expected 3");
    }
    let pixels = ((video.to_dtype(DType::F32)?.clamp(-1f32, 1f32)? + 1.0)? * 127.5)?
        .round()?
        .permute((1, 2, 3, 0))?
        .to_device(&Device::Cpu)?
        .to_dtype(DType::U8)?
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
