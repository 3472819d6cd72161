//! The 3-D rotary position embedding of HunyuanVideo 1.5 (diffusers' `HunyuanVideo15RotaryPosEmbed`): the latent
//! token at frame t, row r, column c of the patched grid rotates the first `axes[0]` head channels by t, the next
//! `axes[1]` by r and the last `axes[2]` by c (adjacent pairs, base θ = 256). Text tokens are not rotated: their
//! table is the identity, so the shared dual-stream block (`crate::mmdit`) runs unchanged.

use candle_core::{Device, Result, Tensor};

use crate::mmdit::{Rope, RopeTable};

/// The latent grid in tokens (after patching): frames × rows × columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VideoGrid {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
}

impl VideoGrid {
    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.frames * self.height * self.width
    }
}

/// The inverse frequencies 1 / θ^(2j / axis_dim) of each axis, f32 as officially, tagged with their axis.
fn inv_freqs(axes_dim: &[usize], theta: f64) -> Vec<(usize, f32)> {
    axes_dim
        .iter()
        .enumerate()
        .flat_map(|(axis, &dim)| {
            (0..dim / 2).map(move |j| {
                let exponent = (2 * j) as f32 / dim as f32;
                (axis, 1.0 / ((theta as f32).powf(exponent)))
            })
        })
        .collect()
}

/// The cos / sin tables [b, tokens, 1, head_dim / 2] of the latent tokens of `grid`.
pub fn video_table(
    grid: VideoGrid,
    axes_dim: &[usize],
    theta: f64,
    b: usize,
    device: &Device,
) -> Result<RopeTable> {
    let mut positions = Vec::with_capacity(grid.tokens());
    for t in 0..grid.frames as i64 {
        for r in 0..grid.height as i64 {
            for c in 0..grid.width as i64 {
                positions.push([t, r, c]);
            }
        }
    }
    RopeTable::from_positions(&positions, &inv_freqs(axes_dim, theta), b, device)
}

/// The identity table (cos 1, sin 0) for `len` text tokens.
pub fn identity_table(len: usize, half: usize, b: usize, device: &Device) -> Result<RopeTable> {
    Ok(RopeTable {
        cos: Tensor::ones((b, len, 1, half), candle_core::DType::F32, device)?,
        sin: Tensor::zeros((b, len, 1, half), candle_core::DType::F32, device)?,
    })
}

/// Both streams' tables: the latent grid's and the identity for `txt_len` text tokens.
pub fn rope(
    grid: VideoGrid,
    txt_len: usize,
    (axes_dim, theta): (&[usize], f64),
    b: usize,
    device: &Device,
) -> Result<Rope> {
    let img = video_table(grid, axes_dim, theta, b, device)?;
    let half = img.cos.dim(3)?;
    Ok(Rope {
        img,
        txt: identity_table(txt_len, half, b, device)?,
    })
}
