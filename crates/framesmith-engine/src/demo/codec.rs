//! The demo codec (demo only, not a VAE): a lossless space-to-depth of RGB frames into latents shaped like Wan 2.2's
//! ([48, frames, H/4, W/4]: the RGB values of the 4×4 pixel phases), values in [−1, 1]. It lets the demo train
//! and sample a tiny Wan-architecture model on CPU with no model download.

use candle_core::{Device, Result, Tensor};

use framesmith_data::video::encode::RgbFrame;

/// Latent channels of the demo codec (the tiny model's `in_dim` / `out_dim`).
pub const CHANNELS: usize = 3 * FACTOR * FACTOR;
/// Spatial compression factor.
pub const FACTOR: usize = 4;

/// Encodes frames (all the same size, a multiple of 4) into a latent [48, T, H/4, W/4].
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
    let (lw, lh, t) = (w / FACTOR, h / FACTOR, frames.len());
    let mut data = vec![0f32; CHANNELS * t * lh * lw];
    for (ti, frame) in frames.iter().enumerate() {
        for y in 0..h {
            for x in 0..w {
                let phase = (y % FACTOR) * FACTOR + x % FACTOR;
                for c in 0..3 {
                    let channel = phase * 3 + c;
                    let v = frame.data[(y * w + x) * 3 + c] as f32 / 127.5 - 1.0;
                    data[((channel * t + ti) * lh + y / FACTOR) * lw + x / FACTOR] = v;
                }
            }
        }
    }
    Tensor::from_vec(data, (CHANNELS, t, lh, lw), device)
}

/// Decodes a latent [48, T, H', W'] back into RGB frames (values clamped to [−1, 1]).
pub fn decode(latent: &Tensor) -> Result<Vec<RgbFrame>> {
    let (_, t, lh, lw) = latent.dims4()?;
    let values = latent
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let (w, h) = (lw * FACTOR, lh * FACTOR);
    Ok((0..t)
        .map(|ti| {
            let mut data = vec![0u8; w * h * 3];
            for y in 0..h {
                for x in 0..w {
                    let phase = (y % FACTOR) * FACTOR + x % FACTOR;
                    for c in 0..3 {
                        let v = values
                            [(((phase * 3 + c) * t + ti) * lh + y / FACTOR) * lw + x / FACTOR];
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
        let clip = &generate(1, 5, 16, 3)[0];
        let latent = encode(&clip.frames, &Device::Cpu)?;
        assert_eq!(latent.dims(), &[48, 5, 4, 4]);
        assert_eq!(decode(&latent)?, clip.frames);
        Ok(())
    }
}
