//! 3D rotary position embedding of the Wan DiT: the head dimension is split into a frame, a height and a width
//! part, each rotated by its own frequencies (`rope_params` / `rope_apply` of the official code). Angles are
//! computed in f64 as the official code does; the rotation itself runs in the activations' dtype. A model keeps
//! the host tables of the last grid it saw ([`RopeCache`]): a training run's steps share one grid.

use std::sync::Mutex;

use candle_core::{DType, Device, Result, Tensor};

/// Longest position the official frequency table covers.
pub const MAX_POSITIONS: usize = 1024;
const THETA: f64 = 10000.0;

/// Complex-pair counts of the frame, height and width parts for a head dimension.
pub fn split(head_dim: usize) -> [usize; 3] {
    let c = head_dim / 2;
    [c - 2 * (c / 3), c / 3, c / 3]
}

/// The angle table `model.freqs` of the official code as `[MAX_POSITIONS][head_dim / 2]` angles in radians
/// (the official table stores `exp(i·angle)`).
pub fn angle_table(head_dim: usize) -> Vec<Vec<f64>> {
    let d6 = head_dim / 6;
    let part_dims = [head_dim - 4 * d6, 2 * d6, 2 * d6];
    (0..MAX_POSITIONS)
        .map(|pos| {
            part_dims
                .iter()
                .flat_map(|&dim| {
                    (0..dim / 2).map(move |i| pos as f64 / THETA.powf((2 * i) as f64 / dim as f64))
                })
                .collect()
        })
        .collect()
}

/// `model.freqs` as (real, imag) pairs, shape [MAX_POSITIONS, head_dim / 2, 2], f64 (for parity checks).
pub fn freqs_tensor(head_dim: usize) -> Result<Tensor> {
    let table = angle_table(head_dim);
    let flat: Vec<f64> = table
        .iter()
        .flatten()
        .flat_map(|a| [a.cos(), a.sin()])
        .collect();
    Tensor::from_vec(flat, (MAX_POSITIONS, head_dim / 2, 2), &Device::Cpu)
}

/// Per-token cos/sin tables for a padded batch: `cos`, `sin` of shape [b, seq_len, 1, head_dim / 2].
/// Rows at or beyond a sample's token count are the identity rotation (the official code leaves them as they are).
#[derive(Clone, Debug)]
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Rope {
    /// Tables for samples with latent grids `grid_sizes` (frames, height, width in patches), padded to `seq_len`.
    pub fn new(
        grid_sizes: &[[usize; 3]],
        seq_len: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let (cos, sin) = host_tables(grid_sizes, seq_len, head_dim)?;
        Self::on_device((&cos, &sin), dtype, device)
    }

    /// [`Rope::new`] with the f64 host tables taken from `cache` when it holds those of the same grids, sequence
    /// length and head dimension (else built and kept there): the same values, without recomputing a cos and a sin
    /// per token and frequency.
    pub fn cached(
        cache: &RopeCache,
        grid_sizes: &[[usize; 3]],
        (seq_len, head_dim): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let key = RopeKey {
            grid_sizes: grid_sizes.to_vec(),
            seq_len,
            head_dim,
        };
        let mut slot = cache
            .0
            .lock()
            .map_err(|_| candle_core::Error::msg("the RoPE table cache was poisoned"))?;
        let tables = match slot.as_ref() {
            Some((k, cos, sin)) if *k == key => (cos.clone(), sin.clone()),
            _ => {
                let (cos, sin) = host_tables(grid_sizes, seq_len, head_dim)?;
                *slot = Some((key, cos.clone(), sin.clone()));
                (cos, sin)
            }
        };
        drop(slot);
        Self::on_device((&tables.0, &tables.1), dtype, device)
    }

    /// The f64 host tables on `device` in `dtype` (converted there, as the values are everywhere).
    fn on_device((cos, sin): (&Tensor, &Tensor), dtype: DType, device: &Device) -> Result<Self> {
        Ok(Self {
            cos: cos.to_device(device)?.to_dtype(dtype)?,
            sin: sin.to_device(device)?.to_dtype(dtype)?,
        })
    }

    /// Rotates `xs` [b, seq_len, heads, head_dim] pairwise (adjacent elements form a complex number).
    /// Differentiable: built from ops that all have a backward.
    pub fn apply(&self, xs: &Tensor) -> Result<Tensor> {
        framesmith_nn::ops::rope_apply(xs, &self.cos, &self.sin)
    }
}

/// What the host tables of [`Rope::new`] depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RopeKey {
    grid_sizes: Vec<[usize; 3]>,
    seq_len: usize,
    head_dim: usize,
}

/// The f64 host tables (cos, sin) of the last grids a model embedded, kept for its next call with the same ones.
#[derive(Default)]
pub struct RopeCache(Mutex<Option<(RopeKey, Tensor, Tensor)>>);

impl Clone for RopeCache {
    fn clone(&self) -> Self {
        Self(Mutex::new(self.0.lock().ok().and_then(|slot| slot.clone())))
    }
}

impl std::fmt::Debug for RopeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RopeCache")
    }
}

/// The cos and sin tables [b, seq_len, 1, head_dim / 2] in f64 on the host, for samples with latent grids
/// `grid_sizes` padded to `seq_len` (padding rows are the identity rotation).
fn host_tables(
    grid_sizes: &[[usize; 3]],
    seq_len: usize,
    head_dim: usize,
) -> Result<(Tensor, Tensor)> {
    let table = angle_table(head_dim);
    let [cf, ch, cw] = split(head_dim);
    let half = head_dim / 2;
    let b = grid_sizes.len();
    let mut cos = vec![1f64; b * seq_len * half];
    let mut sin = vec![0f64; b * seq_len * half];
    for (i, &[f, h, w]) in grid_sizes.iter().enumerate() {
        if f.max(h).max(w) > MAX_POSITIONS {
            candle_core::bail!(
                "latent grid {f}x{h}x{w} exceeds the RoPE table of {MAX_POSITIONS} positions"
            );
        }
        let tokens = (f * h * w).min(seq_len);
        for tok in 0..tokens {
            let (fi, hi, wi) = (tok / (h * w), (tok / w) % h, tok % w);
            let row = (i * seq_len + tok) * half;
            let parts = [(fi, 0, cf), (hi, cf, ch), (wi, cf + ch, cw)];
            for (pos, start, len) in parts {
                for j in start..start + len {
                    let angle = table[pos][j];
                    cos[row + j] = angle.cos();
                    sin[row + j] = angle.sin();
                }
            }
        }
    }
    let shape = (b, seq_len, 1, half);
    Ok((
        Tensor::from_vec(cos, shape, &Device::Cpu)?,
        Tensor::from_vec(sin, shape, &Device::Cpu)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::D;
    use framesmith_nn::init::randn;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn cached_tables_follow_the_grids() -> Result<()> {
        let dev = Device::Cpu;
        let cache = RopeCache::default();
        let same = |a: &Tensor, b: &Tensor| -> Result<bool> {
            Ok(a.dims() == b.dims()
                && a.flatten_all()?.to_vec1::<f32>()? == b.flatten_all()?.to_vec1::<f32>()?)
        };
        // A, then B (another grid and length), then A again: each call's tables are the uncached ones.
        let a: &[[usize; 3]] = &[[2, 2, 3], [1, 2, 2]];
        let b: &[[usize; 3]] = &[[3, 2, 2]];
        for (grids, seq_len) in [(a, 12), (b, 14), (a, 12), (a, 12)] {
            let fresh = Rope::new(grids, seq_len, 32, DType::F32, &dev)?;
            let cached = Rope::cached(&cache, grids, (seq_len, 32), DType::F32, &dev)?;
            assert!(same(&fresh.cos, &cached.cos)? && same(&fresh.sin, &cached.sin)?);
        }
        // The head dimension is part of the key too.
        let fresh = Rope::new(a, 12, 16, DType::F32, &dev)?;
        let cached = Rope::cached(&cache, a, (12, 16), DType::F32, &dev)?;
        assert!(same(&fresh.cos, &cached.cos)?);
        Ok(())
    }

    #[test]
    fn split_matches_official_dims() {
        assert_eq!(split(128), [22, 21, 21]);
        assert_eq!(split(32), [6, 5, 5]);
    }

    #[test]
    fn rotation_preserves_norm_and_padding() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(43);
        let rope = Rope::new(&[[2, 2, 3], [1, 2, 2]], 12, 32, DType::F32, &dev)?;
        let x = randn(rng, (2, 12, 2, 32), 0.0, 1.0, &dev)?;
        let y = rope.apply(&x)?;
        let nx = x.sqr()?.sum(D::Minus1)?;
        let ny = y.sqr()?.sum(D::Minus1)?;
        let diff = (nx - ny)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-4, "{diff}");
        // Sample 1 has 4 tokens: rows 4.. are padding and stay unrotated.
        let pad_diff = (x.narrow(0, 1, 1)?.narrow(1, 4, 8)?
            - y.narrow(0, 1, 1)?.narrow(1, 4, 8)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
        assert_eq!(pad_diff, 0.0);
        Ok(())
    }
}
