//! Rotary position embedding tables of a dual-stream block: each token's cos / sin per rotated pair, from its
//! position on up to three axes. Each family places its tokens (Qwen-Image centres images and puts text after
//! them, HunyuanVideo 1.5 leaves text unrotated); the block applies the tables the same way.

use candle_core::{Device, Result, Tensor};

use framesmith_nn::ops::{rope_apply, rope_backward};

/// The cos / sin tables of one stream, [b, seq_len, 1, head_dim / 2] f32.
#[derive(Clone, Debug)]
pub struct RopeTable {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl RopeTable {
    /// The tables of tokens at `positions` (one per token, one coordinate per axis), each inverse frequency
    /// tagged with the axis it turns: angle = position[axis] · frequency, rounded to f32 before cos / sin.
    pub fn from_positions(
        positions: &[[i64; 3]],
        inv_freqs: &[(usize, f32)],
        b: usize,
        device: &Device,
    ) -> Result<Self> {
        let half = inv_freqs.len();
        let angles: Vec<f32> = positions
            .iter()
            .flat_map(|pos| inv_freqs.iter().map(move |&(axis, w)| pos[axis] as f32 * w))
            .collect();
        let table = |f: fn(f64) -> f64| -> Result<Tensor> {
            let values: Vec<f32> = angles.iter().map(|&a| f(f64::from(a)) as f32).collect();
            Tensor::from_vec(values, (1, positions.len(), 1, half), device)?.repeat((b, 1, 1, 1))
        };
        Ok(Self {
            cos: table(f64::cos)?,
            sin: table(f64::sin)?,
        })
    }

    /// Rotates `xs` [b, seq_len, heads, head_dim] (q or k).
    pub fn apply(&self, xs: &Tensor) -> Result<Tensor> {
        rope_apply(xs, &self.cos, &self.sin)
    }

    /// The same tables outside any autograd graph.
    pub fn detached(&self) -> Self {
        Self {
            cos: self.cos.detach(),
            sin: self.sin.detach(),
        }
    }

    /// Input gradient of [`RopeTable::apply`].
    pub fn backward(&self, dy: &Tensor) -> Result<Tensor> {
        rope_backward(dy, &self.cos, &self.sin)
    }
}

/// The tables of both streams.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Image (latent) tokens, in the order of the latent sequence.
    pub img: RopeTable,
    /// Text tokens.
    pub txt: RopeTable,
}

impl Rope {
    /// Both tables outside any autograd graph.
    pub fn detached(&self) -> Self {
        Self {
            img: self.img.detached(),
            txt: self.txt.detached(),
        }
    }
}
