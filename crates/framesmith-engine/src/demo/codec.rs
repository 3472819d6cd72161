//! The demo codec (demo only, not a VAE): a lossless space-to-depth and time-to-depth of RGB frames into latents
//! compressed like Wan's VAE in time — latent frame 0 holds the first frame, each later latent frame the next
//! `TEMPORAL` frames — and 4× in space: [192, 1 + (frames − 1)/4, H/4, W/4], the RGB values of the 4×4 pixel
//! phases of each frame, values in [−1, 1]. It lets the demo train and sample a tiny Wan-architecture model on CPU
//! with no model download. Every later frame is one latent frame away from the first, so the model draws each
//! from the clean start frame rather than from a neighbour that is still noisy while sampling.

use candle_core::{Device, Result, Tensor};

use framesmith_data::video::encode::RgbFrame;

/// Spatial compression factor.
pub const FACTOR: usize = 4;
/// Frames in each latent frame after the first (Wan's VAE's temporal factor).
pub const TEMPORAL: usize = 4;
/// Latent channels of the demo codec (the tiny model's `in_dim` / `out_dim`): `TEMPORAL` slots, each the RGB
/// values of one frame's pixel phases, slot-major.
pub const CHANNELS: usize = TEMPORAL * SLOT;
/// Channels of one frame's slot.
pub const SLOT: usize = 3 * FACTOR * FACTOR;

/// Latent frames of a clip of `frames` frames (1 + 4k).
pub fn latent_frames(frames: usize) -> usize {
    1 + frames.saturating_sub(1) / TEMPORAL
}

/// The frame in slot `slot` of latent frame `latent_frame`: the first frame fills every slot of latent frame 0.
fn frame_index(latent_frame: usize, slot: usize) -> usize {
    if latent_frame == 0 {
        0
    } else {
        1 + (latent_frame - 1) * TEMPORAL + slot
    }
}

/// Encodes 1 + 4k frames (all the same size, a multiple of 4) into a latent [192, 1 + k, H/4, W/4].
pub fn encode(frames: &[RgbFrame], device: &Device) -> Result<Tensor> {
    let Some(first) = frames.first() else {
        candle_core::bail!("the demo codec needs at least one frame")
    };
    let (w, h) = (first.width, first.height);
    if w % FACTOR != 0 || h % FACTOR != 0 {
        candle_core::bail!(
            "demo frames must have sizes that are multiples of {FACTOR}, got {w}x{h}"
        );
    }
    if (frames.len() - 1) % TEMPORAL != 0 {
        candle_core::bail!(
            "the demo codec needs 1 + {TEMPORAL}k frames, got {}",
            frames.len()
        );
    }
    let (lw, lh, t) = (w / FACTOR, h / FACTOR, latent_frames(frames.len()));
    let mut data = vec![0f32; CHANNELS * t * lh * lw];
    for ti in 0..t {
        for slot in 0..TEMPORAL {
            let frame = &frames[frame_index(ti, slot)];
            for y in 0..h {
                for x in 0..w {
                    let phase = (y % FACTOR) * FACTOR + x % FACTOR;
                    for c in 0..3 {
                        let channel = slot * SLOT + phase * 3 + c;
                        let v = frame.data[(y * w + x) * 3 + c] as f32 / 127.5 - 1.0;
                        data[((channel * t + ti) * lh + y / FACTOR) * lw + x / FACTOR] = v;
                    }
                }
            }
        }
    }
    Tensor::from_vec(data, (CHANNELS, t, lh, lw), device)
}

/// Decodes a latent [192, T, H', W'] back into 1 + 4(T − 1) RGB frames (values clamped to [−1, 1]); the first
/// frame is the mean of latent frame 0's slots.
pub fn decode(latent: &Tensor) -> Result<Vec<RgbFrame>> {
    let (_, t, lh, lw) = latent.dims4()?;
    let values = latent
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let (w, h) = (lw * FACTOR, lh * FACTOR);
    let count = if t == 0 { 0 } else { 1 + (t - 1) * TEMPORAL };
    let value = |slot: usize, ti: usize, y: usize, x: usize, c: usize| {
        let phase = (y % FACTOR) * FACTOR + x % FACTOR;
        values[(((slot * SLOT + phase * 3 + c) * t + ti) * lh + y / FACTOR) * lw + x / FACTOR]
    };
    Ok((0..count)
        .map(|fi| {
            let mut data = vec![0u8; w * h * 3];
            for y in 0..h {
                for x in 0..w {
                    for c in 0..3 {
                        let v = if fi == 0 {
                            (0..TEMPORAL).map(|s| value(s, 0, y, x, c)).sum::<f32>()
                                / TEMPORAL as f32
                        } else {
                            let (ti, slot) = (1 + (fi - 1) / TEMPORAL, (fi - 1) % TEMPORAL);
                            value(slot, ti, y, x, c)
                        };
                        data[(y * w + x) * 3 + c] =
                            ((v.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8;
                    }
                }
            }
            RgbFrame {
                width: w,
                height: h,
                data,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::shapes::generate;

    #[test]
    fn round_trip_is_lossless() -> Result<()> {
        let clip = &generate(1, 9, 16, 3)[0];
        let latent = encode(&clip.frames, &Device::Cpu)?;
        assert_eq!(latent.dims(), &[192, 3, 4, 4]);
        assert_eq!(decode(&latent)?, clip.frames);
        let first = encode(&clip.frames[..1], &Device::Cpu)?;
        assert_eq!(decode(&first)?, clip.frames[..1]);
        Ok(())
    }

    #[test]
    fn other_frame_counts_are_refused() {
        let clip = &generate(1, 4, 16, 3)[0];
        assert!(encode(&clip.frames, &Device::Cpu).is_err());
    }
}
