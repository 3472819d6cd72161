//! Input embeddings of the Wan DiT: patch embedding (a Conv3d with kernel = stride, done as a matmul over
//! patches), text embedding, sinusoidal time embedding (f64) with its projection, and Wan 2.1 I2V's CLIP
//! image projection (`img_emb`).

use candle_core::{DType, Device, Result, Tensor};

use super::config::WanConfig;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::layer_norm;
use framesmith_nn::vb::Vb;

/// `patch_embedding`: Conv3d(in_dim, dim, kernel = stride = patch_size).
#[derive(Clone)]
pub struct PatchEmbedding {
    proj: Linear,
    patch: [usize; 3],
    in_dim: usize,
}

impl PatchEmbedding {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        let [pt, ph, pw] = cfg.patch_size;
        let weight = vb.get((cfg.dim, cfg.in_dim, pt, ph, pw), "weight")?;
        let weight = weight.reshape((cfg.dim, cfg.in_dim * pt * ph * pw))?;
        let bias = vb.get(cfg.dim, "bias")?;
        Ok(Self {
            proj: Linear::from_weights(weight, Some(bias)),
            patch: cfg.patch_size,
            in_dim: cfg.in_dim,
        })
    }

    /// Embeds one sample `xs` [in_dim, F, H, W] into tokens [F'·H'·W', dim]; returns the latent grid (F', H', W').
    pub fn forward(&self, xs: &Tensor) -> Result<(Tensor, [usize; 3])> {
        let (c, f, h, w) = xs.dims4()?;
        let [pt, ph, pw] = self.patch;
        if c != self.in_dim || f % pt != 0 || h % ph != 0 || w % pw != 0 {
            candle_core::bail!(
                "latent of shape [{c}, {f}, {h}, {w}] does not fit the patch embedding (expects {} channels and \
                 sizes divisible by {:?})",
                self.in_dim,
                self.patch
            );
        }
        let grid = [f / pt, h / ph, w / pw];
        let patches = xs
            .reshape(&[c, grid[0], pt, grid[1], ph, grid[2], pw][..])?
            .permute(vec![1, 3, 5, 0, 2, 4, 6])?
            .reshape((grid[0] * grid[1] * grid[2], c * pt * ph * pw))?;
        Ok((self.proj.forward(&patches)?, grid))
    }
}

/// `text_embedding`: Linear(text_dim, dim) → GELU(tanh) → Linear(dim, dim).
#[derive(Clone)]
pub struct TextEmbedding {
    fc0: Linear,
    fc2: Linear,
}

impl TextEmbedding {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        Ok(Self {
            fc0: Linear::load(&vb.pp(0), cfg.text_dim, cfg.dim)?,
            fc2: Linear::load(&vb.pp(2), cfg.dim, cfg.dim)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc0.forward(xs)?.gelu()?)
    }
}

/// `sinusoidal_embedding_1d` of the official code: [cos, sin] of position·10000^(−i/half), computed in f64,
/// returned as f32 with shape [n, dim]. A position met before takes the row computed for it (per-token timesteps
/// repeat a few values over tens of thousands of tokens).
pub fn sinusoidal_embedding(dim: usize, positions: &[f64], device: &Device) -> Result<Tensor> {
    let half = dim / 2;
    let mut out: Vec<f32> = Vec::with_capacity(positions.len() * dim);
    let mut rows: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let row_len = 2 * half;
    for &p in positions {
        if let Some(&row) = rows.get(&p.to_bits()) {
            out.extend_from_within(row * row_len..(row + 1) * row_len);
            continue;
        }
        rows.insert(p.to_bits(), out.len() / row_len.max(1));
        let angles: Vec<f64> = (0..half)
            .map(|i| p * 10000f64.powf(-(i as f64) / half as f64))
            .collect();
        out.extend(angles.iter().map(|a| a.cos() as f32));
        out.extend(angles.iter().map(|a| a.sin() as f32));
    }
    Tensor::from_vec(out, (positions.len(), dim), device)
}

/// `time_embedding` (Linear → SiLU → Linear) and `time_projection` (SiLU → Linear(dim, 6·dim)), in f32.
#[derive(Clone)]
pub struct TimeEmbedding {
    fc0: Linear,
    fc2: Linear,
    proj: Linear,
    freq_dim: usize,
    dim: usize,
}

impl TimeEmbedding {
    pub fn new(cfg: &WanConfig, vb_embedding: Vb, vb_projection: Vb) -> Result<Self> {
        let vb_embedding = vb_embedding.with_dtype(DType::F32);
        Ok(Self {
            fc0: Linear::load(&vb_embedding.pp(0), cfg.freq_dim, cfg.dim)?,
            fc2: Linear::load(&vb_embedding.pp(2), cfg.dim, cfg.dim)?,
            proj: Linear::load(
                &vb_projection.with_dtype(DType::F32).pp(1),
                cfg.dim,
                6 * cfg.dim,
            )?,
            freq_dim: cfg.freq_dim,
            dim: cfg.dim,
        })
    }

    /// For timesteps `t` [b, lt] (lt = 1 for one timestep per sample, or per token), returns the time embedding
    /// `e` [b, lt, dim] and the block modulation input `e0` [b, lt, 6, dim], both f32.
    pub fn forward(&self, t: &[Vec<f64>], device: &Device) -> Result<(Tensor, Tensor)> {
        let b = t.len();
        let lt = t.first().map(|r| r.len()).unwrap_or(0);
        let flat: Vec<f64> = t.iter().flatten().copied().collect();
        let sin = sinusoidal_embedding(self.freq_dim, &flat, device)?;
        let e = self.fc2.forward(&self.fc0.forward(&sin)?.silu()?)?;
        let e0 = self.proj.forward(&e.silu()?)?;
        Ok((
            e.reshape((b, lt, self.dim))?,
            e0.reshape((b, lt, 6, self.dim))?,
        ))
    }
}

/// `img_emb` (Wan 2.1 I2V, the official MLPProj): LayerNorm → Linear → GELU (exact) → Linear → LayerNorm.
#[derive(Clone)]
pub struct ImageEmbedding {
    norm_in: (Tensor, Tensor),
    fc1: Linear,
    fc3: Linear,
    norm_out: (Tensor, Tensor),
}

/// `nn.LayerNorm`'s default epsilon, used by MLPProj.
const TORCH_LAYER_NORM_EPS: f64 = 1e-5;

impl ImageEmbedding {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        let vb = vb.pp("proj");
        let c = cfg.clip_dim;
        let norm = |i: usize, n: usize| -> Result<(Tensor, Tensor)> {
            Ok((vb.pp(i).get(n, "weight")?, vb.pp(i).get(n, "bias")?))
        };
        Ok(Self {
            norm_in: norm(0, c)?,
            fc1: Linear::load(&vb.pp(1), c, c)?,
            fc3: Linear::load(&vb.pp(3), c, cfg.dim)?,
            norm_out: norm(4, cfg.dim)?,
        })
    }

    /// Projects CLIP features [b, tokens, clip_dim] to [b, tokens, dim].
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let xs = layer_norm(
            xs,
            Some(&self.norm_in.0),
            Some(&self.norm_in.1),
            TORCH_LAYER_NORM_EPS,
        )?;
        let xs = self.fc3.forward(&self.fc1.forward(&xs)?.gelu_erf()?)?;
        layer_norm(
            &xs,
            Some(&self.norm_out.0),
            Some(&self.norm_out.1),
            TORCH_LAYER_NORM_EPS,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_positions_take_the_rows_computed_for_them() -> Result<()> {
        let dev = Device::Cpu;
        // Per-token timesteps: a clean first frame (0) and the rest at one timestep, then another sample's.
        let positions = [0.0, 0.0, 601.5, 601.5, 601.5, 0.0, 999.0, 601.5];
        let all = sinusoidal_embedding(16, &positions, &dev)?.to_vec2::<f32>()?;
        assert_eq!(all.len(), positions.len());
        for (row, &p) in all.iter().zip(&positions) {
            let alone = sinusoidal_embedding(16, &[p], &dev)?.to_vec2::<f32>()?;
            assert_eq!(row, &alone[0], "position {p}");
        }
        assert_ne!(all[0], all[2]);
        Ok(())
    }
}
