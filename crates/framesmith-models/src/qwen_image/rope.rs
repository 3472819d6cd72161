//! Rotary position embedding of the Qwen-Image transformer ("MSRoPE", diffusers' `QwenEmbedRope` with
//! `scale_rope=True`): an image token at row r, column c of an h × w grid has positions (frame, r − ⌈h/2⌉,
//! c − ⌈w/2⌉), centred on the image; the k-th image of a sample (Qwen-Image-Edit's conditioning images) has frame
//! k. Text token i has position m + i on all three axes, m = max(⌊h/2⌋, ⌊w/2⌋) over the images, so text sits
//! after every image position on the diagonal. Each axis rotates its own slice of the head (adjacent pairs).
//! Angles are rounded as the official float32 tables are.

use candle_core::{Device, Result};

pub use crate::mmdit::rope::{Rope, RopeTable};

/// RoPE base.
pub const THETA: f32 = 10_000.0;

/// One image's latent grid in tokens (after patching): frames × height × width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGrid {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
}

impl ImageGrid {
    /// A single-frame grid of `height` × `width` tokens.
    pub fn image(height: usize, width: usize) -> Self {
        Self {
            frames: 1,
            height,
            width,
        }
    }

    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.frames * self.height * self.width
    }
}

/// The inverse frequencies 1 / θ^(2j / axis_dim), each tagged with its axis, in head order: f32 as officially.
fn inv_freqs(axes_dim: &[usize]) -> Vec<(usize, f32)> {
    axes_dim
        .iter()
        .enumerate()
        .flat_map(|(axis, &dim)| {
            (0..dim / 2).map(move |j| {
                let exponent = (2 * j) as f32 / dim as f32;
                (
                    axis,
                    1.0 / (f64::from(THETA).powf(f64::from(exponent)) as f32),
                )
            })
        })
        .collect()
}

/// Positions of the image tokens and the text tokens' start (the largest half-side over the images).
fn image_positions(grids: &[ImageGrid]) -> (Vec<[i64; 3]>, i64) {
    let mut positions = Vec::with_capacity(grids.iter().map(ImageGrid::tokens).sum());
    let mut text_start = 0i64;
    for (index, grid) in grids.iter().enumerate() {
        let (h, w) = (grid.height as i64, grid.width as i64);
        let (h0, w0) = (h - h / 2, w - w / 2);
        for frame in 0..grid.frames as i64 {
            for row in 0..h {
                for col in 0..w {
                    positions.push([index as i64 + frame, row - h0, col - w0]);
                }
            }
        }
        text_start = text_start.max(h / 2).max(w / 2);
    }
    (positions, text_start)
}

/// Tables for a batch of `b` samples, each with the images `grids` (in sequence order) and `txt_len` text
/// tokens, over RoPE axes `axes_dim` (frame, height, width).
pub fn rope(
    grids: &[ImageGrid],
    txt_len: usize,
    axes_dim: &[usize],
    b: usize,
    device: &Device,
) -> Result<Rope> {
    if axes_dim.len() != 3 {
        candle_core::bail!("Qwen-Image RoPE: three axes expected, got {axes_dim:?}");
    }
    let freqs = inv_freqs(axes_dim);
    let (img, text_start) = image_positions(grids);
    let txt: Vec<[i64; 3]> = (0..txt_len as i64).map(|i| [text_start + i; 3]).collect();
    Ok(Rope {
        img: RopeTable::from_positions(&img, &freqs, b, device)?,
        txt: RopeTable::from_positions(&txt, &freqs, b, device)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_positions_are_centred_and_text_follows_them() {
        let (pos, text_start) = image_positions(&[ImageGrid::image(3, 4), ImageGrid::image(2, 2)]);
        assert_eq!(pos.len(), 12 + 4);
        // Height 3: rows −2, −1, 0; width 4: columns −2 … 1.
        assert_eq!(pos[0], [0, -2, -2]);
        assert_eq!(pos[11], [0, 0, 1]);
        // The second image is frame 1.
        assert_eq!(pos[12], [1, -1, -1]);
        assert_eq!(text_start, 2);
    }

    #[test]
    fn the_first_text_token_of_a_2x2_image_turns_by_its_position() -> Result<()> {
        let dev = Device::Cpu;
        let rope = rope(&[ImageGrid::image(2, 2)], 1, &[2, 2, 2], 1, &dev)?;
        // Text starts at position 1 on every axis; each axis' first frequency is 1.
        let close = |got: &[f32], want: &[f64]| {
            got.len() == want.len()
                && got
                    .iter()
                    .zip(want)
                    .all(|(g, w)| (f64::from(*g) - w).abs() < 1e-7)
        };
        let cos = rope.txt.cos.flatten_all()?.to_vec1::<f32>()?;
        assert!(close(&cos, &[1f64.cos(); 3]), "{cos:?}");
        // The first image token is at (0, −1, −1).
        let sin = rope.img.sin.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            close(&sin[..3], &[0.0, (-1f64).sin(), (-1f64).sin()]),
            "{sin:?}"
        );
        Ok(())
    }
}
