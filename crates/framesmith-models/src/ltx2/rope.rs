//! LTX-2's rotary position embedding for video tokens, as ltx-core's `precompute_freqs_cis` builds it with the
//! `split` layout: each token's (time, height, width) position is the middle of its patch's bounds in seconds and
//! pixels ([`video_positions`], the official trainer's), divided by `positional_embedding_max_pos` and mapped to
//! [-1, 1]; one frequency grid `θ^linspace(0, 1, n) · π/2` spans the whole model width (not one head), the axes
//! interleave, the unused leading entries are the identity, and each head takes its slice of the table. A head's
//! two halves rotate against each other (`x₁ cos − x₂ sin`, `x₂ cos + x₁ sin`). The angles are computed in f32 as
//! the official code does (its f32 products of large angles decide the last bits of the tables), on the tokens'
//! device: the table spans the whole width, 32 times a per-head table, too many cosines for the host each step.
//! The tables are held per head and pair in the compute dtype, [b, tokens, heads, head_dim / 2], the layout of
//! `framesmith_nn::ops::rope_halves` (on CUDA the q / k RMSNorm and the rotation run as one kernel).

use candle_core::{DType, Device, Result, Tensor};

use super::config::Ltx2Config;
use framesmith_nn::ops::{
    rms_norm_rope_halves, rms_norm_rope_halves_backward, rope_halves, rope_halves_backward,
};

/// The VAE's (time, height, width) downsampling of every release: latent positions times these are pixels.
pub const VIDEO_SCALE_FACTORS: [i64; 3] = [8, 32, 32];

/// Cosines and sines of one forward pass's angles, [b, tokens, heads, head_dim / 2] in the compute dtype: each
/// head's first half rotates against its second by them (`x₁ cos − x₂ sin`, `x₂ cos + x₁ sin`).
#[derive(Clone, Debug)]
pub struct RopeTable {
    cos: Tensor,
    sin: Tensor,
}

/// The patch bounds of every video token in pixel space, [batch, 3, frames·height·width, 2] f32 (start, end per
/// axis), as the official trainer's `_get_video_positions` makes them: latent bounds times the VAE's factors, the
/// time axis shifted by the causal first frame (`+1 − 8`, at least 0) and divided by `fps`.
pub fn video_positions(
    batch: usize,
    (frames, height, width): (usize, usize, usize),
    fps: f32,
    device: &Device,
) -> Result<Tensor> {
    let tokens = frames * height * width;
    let mut out = vec![0f32; 3 * tokens * 2];
    let [st, sh, sw] = VIDEO_SCALE_FACTORS;
    let mut i = 0;
    for f in 0..frames as i64 {
        for y in 0..height as i64 {
            for x in 0..width as i64 {
                let time = |t: i64| ((t * st + 1 - st).max(0) as f32) / fps;
                let bounds = [
                    [time(f), time(f + 1)],
                    [(y * sh) as f32, ((y + 1) * sh) as f32],
                    [(x * sw) as f32, ((x + 1) * sw) as f32],
                ];
                for (axis, [start, end]) in bounds.into_iter().enumerate() {
                    out[(axis * tokens + i) * 2] = start;
                    out[(axis * tokens + i) * 2 + 1] = end;
                }
                i += 1;
            }
        }
    }
    let one = Tensor::from_vec(out, (1, 3, tokens, 2), device)?;
    one.repeat((batch, 1, 1, 1))
}

/// The frequency grid `θ^linspace(0, 1, n) · π/2` (`generate_freq_grid_np`: in f64, then f32). ltx-core's
/// single-precision grid (`frequencies_precision` not `float64`) is taken to be the same values.
fn freq_grid(theta: f64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let t = if n > 1 {
                i as f64 / (n - 1) as f64
            } else {
                0.0
            };
            (theta.powf(t) * std::f64::consts::FRAC_PI_2) as f32
        })
        .collect()
}

/// The audio latents' timing of every release: 16 kHz audio, a 160-sample hop between spectrogram frames, four
/// spectrogram frames per latent frame (ltx-core's `AudioPatchifier` defaults, as the official trainer uses it).
pub const AUDIO_SAMPLE_RATE: f32 = 16000.0;
pub const AUDIO_HOP_LENGTH: f32 = 160.0;
pub const AUDIO_LATENT_DOWNSAMPLE: i64 = 4;

/// The bounds in seconds of every audio latent frame, [batch, 1, frames, 2] f32 (start, end), as the official
/// trainer's `_get_audio_positions` makes them: latent frame `i` starts at spectrogram frame `4i + 1 − 4` (the
/// causal offset, at least 0), times the hop over the sample rate; it ends where frame `i + 1` starts.
pub fn audio_positions(batch: usize, frames: usize, device: &Device) -> Result<Tensor> {
    let seconds = |i: i64| {
        let mel = (i * AUDIO_LATENT_DOWNSAMPLE + 1 - AUDIO_LATENT_DOWNSAMPLE).max(0) as f32;
        mel * AUDIO_HOP_LENGTH / AUDIO_SAMPLE_RATE
    };
    let out: Vec<f32> = (0..frames as i64)
        .flat_map(|i| [seconds(i), seconds(i + 1)])
        .collect();
    Tensor::from_vec(out, (1, 1, frames, 2), device)?.repeat((batch, 1, 1, 1))
}

impl RopeTable {
    /// The table for `positions` [b, axes, tokens, 2] (patch bounds; see [`video_positions`]) with the video
    /// stream's sizes and RoPE settings of `cfg`, in `dtype` on `device`.
    pub fn new(
        positions: &Tensor,
        cfg: &Ltx2Config,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let max_pos = &cfg.positional_embedding_max_pos;
        let sizes = (cfg.inner_dim(), cfg.num_attention_heads);
        Self::build(
            positions,
            max_pos,
            sizes,
            cfg.positional_embedding_theta,
            dtype,
            device,
        )
    }

    /// The audio self-attention's table for `positions` [b, 1, tokens, 2] (see [`audio_positions`]).
    pub fn audio(
        positions: &Tensor,
        cfg: &Ltx2Config,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let max_pos = &cfg.audio_positional_embedding_max_pos;
        let sizes = (cfg.audio_inner_dim(), cfg.audio_num_attention_heads);
        Self::build(
            positions,
            max_pos,
            sizes,
            cfg.positional_embedding_theta,
            dtype,
            device,
        )
    }

    /// A stream's table for the audio-video cross-attentions (ltx-core's `cross_positional_embeddings`): the time
    /// axis of its `positions` [b, axes, tokens, 2] only, over the cross-attentions' width
    /// (`audio_cross_attention_dim`) split into `heads` (the stream's own head count), divided by
    /// [`Ltx2Config::cross_max_pos`].
    pub fn cross(
        positions: &Tensor,
        cfg: &Ltx2Config,
        heads: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let time = positions.narrow(1, 0, 1)?;
        let sizes = (cfg.audio_cross_attention_dim, heads);
        let max_pos = [cfg.cross_max_pos()];
        Self::build(
            &time,
            &max_pos,
            sizes,
            cfg.positional_embedding_theta,
            dtype,
            device,
        )
    }

    /// The table for `positions` [b, axes, tokens, 2] divided per axis by `max_pos`, over `inner` = the
    /// attention's width split into `heads`, with RoPE base `theta`.
    pub fn build(
        positions: &Tensor,
        max_pos: &[f64],
        (inner, heads): (usize, usize),
        theta: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let (b, axes, tokens, two) = positions.dims4()?;
        if two != 2 || axes != max_pos.len() {
            candle_core::bail!(
                "LTX-2 RoPE: positions {:?}, expected [b, {}, tokens, 2]",
                positions.dims(),
                max_pos.len()
            );
        }
        let n = inner / (2 * axes);
        let half = inner / 2;
        let pad = half - n * axes;
        let pos = positions
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        // Each token's coordinate in [-1, 1] per axis, [b, tokens, 1, axes].
        let mut coords = Vec::with_capacity(b * tokens * axes);
        for s in 0..b {
            for t in 0..tokens {
                for (axis, &max) in max_pos.iter().enumerate() {
                    let at = ((s * axes + axis) * tokens + t) * 2;
                    let middle = (pos[at] + pos[at + 1]) / 2.0;
                    coords.push(middle / max as f32 * 2.0 - 1.0);
                }
            }
        }
        let coords = Tensor::from_vec(coords, (b, tokens, 1, axes), device)?;
        let grid = Tensor::from_vec(freq_grid(theta, n), (1, 1, n, 1), device)?;
        // Entry `f · axes + axis` of a token's row, after the identity padding.
        let angles = grid
            .broadcast_mul(&coords)?
            .reshape((b, tokens, n * axes))?;
        let (mut cos, mut sin) = (angles.cos()?, angles.sin()?);
        if pad > 0 {
            let ones = Tensor::ones((b, tokens, pad), DType::F32, device)?;
            cos = Tensor::cat(&[&ones, &cos], 2)?;
            sin = Tensor::cat(&[&ones.zeros_like()?, &sin], 2)?;
        }
        let shape = (b, tokens, heads, half / heads);
        Ok(Self {
            cos: cos.reshape(shape)?.to_dtype(dtype)?.contiguous()?,
            sin: sin.reshape(shape)?.to_dtype(dtype)?.contiguous()?,
        })
    }

    /// The cosines [b, tokens, heads, head_dim / 2] (ltx-core's `cos_freq`, heads second there).
    pub fn cos(&self) -> Result<Tensor> {
        Ok(self.cos.clone())
    }

    /// The sines [b, tokens, heads, head_dim / 2] (ltx-core's `sin_freq`, heads second there).
    pub fn sin(&self) -> Result<Tensor> {
        Ok(self.sin.clone())
    }

    /// The tables without an autograd history.
    pub fn detach(&self) -> Self {
        Self {
            cos: self.cos.detach(),
            sin: self.sin.detach(),
        }
    }

    /// `xs` [b, tokens, heads, head_dim] rotated (differentiable; in `xs`' dtype, each product and the sum
    /// rounded to it).
    pub fn apply(&self, xs: &Tensor) -> Result<Tensor> {
        rope_halves(xs, &self.cos, &self.sin)
    }

    /// Input gradient of [`Self::apply`] (the transposed rotation).
    pub fn backward(&self, dy: &Tensor) -> Result<Tensor> {
        rope_halves_backward(dy, &self.cos, &self.sin)
    }

    /// `x` [b, tokens, heads · head_dim] (a q or k projection) through its RMSNorm with `weight`, split into
    /// `heads` and rotated: [`Self::apply`] of the normalised heads (one kernel on CUDA outside autograd).
    pub fn norm_apply(
        &self,
        x: &Tensor,
        weight: &Tensor,
        eps: f64,
        heads: usize,
    ) -> Result<Tensor> {
        rms_norm_rope_halves(x, weight, eps, heads, &self.cos, &self.sin)
    }

    /// Input gradient of [`Self::norm_apply`] at `x` for the rotated heads' gradient `dy`, outside autograd.
    pub fn norm_backward(
        &self,
        x: &Tensor,
        weight: &Tensor,
        dy: &Tensor,
        eps: f64,
    ) -> Result<Tensor> {
        rms_norm_rope_halves_backward(x, weight, dy, eps, &self.cos, &self.sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_the_causal_first_frame() -> anyhow::Result<()> {
        let p = video_positions(1, (2, 1, 2), 24.0, &Device::Cpu)?;
        let v = p.flatten_all()?.to_vec1::<f32>()?;
        // Token 0 (frame 0): time [0, 1/24]; token 2 (frame 1): time [1/24, 9/24]; width of token 1: [32, 64].
        assert_eq!(&v[0..2], &[0.0, 1.0 / 24.0]);
        assert_eq!(&v[4..6], &[1.0 / 24.0, 9.0 / 24.0]);
        assert_eq!(&v[(2 * 4 + 1) * 2..(2 * 4 + 1) * 2 + 2], &[32.0, 64.0]);
        Ok(())
    }

    #[test]
    fn backward_undoes_the_rotation() -> anyhow::Result<()> {
        let cfg = Ltx2Config::from_transformer_json(&serde_json::json!({
            "num_attention_heads": 2, "attention_head_dim": 8
        }))?;
        let pos = video_positions(1, (2, 2, 2), 25.0, &Device::Cpu)?;
        let table = RopeTable::new(&pos, &cfg, DType::F32, &Device::Cpu)?;
        let xs = Tensor::randn(0f32, 1.0, (1, 8, 2, 8), &Device::Cpu)?;
        let back = table.backward(&table.apply(&xs)?)?;
        let err = (back - &xs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-5, "{err}");
        Ok(())
    }
}
