//! Rotary position embedding of the FLUX.1 DiT (`EmbedND` / `rope` / `apply_rope` of the official `math.py`):
//! every token has an id per axis — (t, h, w): 0 / row / col for image tokens, 1 / row / col for Kontext
//! conditioning tokens, zeros for text tokens — and each axis rotates its own slice of the head dimension.
//! Angles are computed in f64 as the official `rope` does; the rotation rotates adjacent pairs (2j, 2j+1). A model
//! keeps the host tables of the last ids it saw ([`RopeCache`]): a training run's steps share them.

use std::sync::Mutex;

use candle_core::{DType, Device, Result, Tensor};

use framesmith_nn::ops::{rope_apply, rope_backward};

/// The cos / sin tables every block uses, [b, seq_len, 1, head_dim / 2] (f32), rows ordered as the joint
/// sequence (text tokens first).
#[derive(Clone, Debug)]
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
}

/// The angles position · θ^(−2j/axis_dim) for the ids `ids` (of `n_axes` axes each, flattened), concatenated over
/// the axes in order: [b][seq_len][head_dim / 2].
fn angles(ids: &[f32], n_axes: usize, axes_dim: &[usize], theta: f64) -> Result<Vec<f64>> {
    if n_axes != axes_dim.len() {
        candle_core::bail!(
            "FLUX RoPE: ids have {n_axes} axes, the model has {} ({:?})",
            axes_dim.len(),
            axes_dim
        );
    }
    let omegas: Vec<(usize, f64)> = axes_dim
        .iter()
        .enumerate()
        .flat_map(|(axis, &dim)| {
            (0..dim / 2).map(move |j| (axis, 1.0 / theta.powf((2 * j) as f64 / dim as f64)))
        })
        .collect();
    let mut out = Vec::with_capacity(ids.len() / n_axes.max(1) * omegas.len());
    for token in ids.chunks_exact(n_axes) {
        out.extend(omegas.iter().map(|&(axis, w)| f64::from(token[axis]) * w));
    }
    Ok(out)
}

impl Rope {
    /// Tables for `ids` [b, seq_len, n_axes] (the concatenation of `txt_ids` and `img_ids`).
    pub fn new(ids: &Tensor, axes_dim: &[usize], theta: f64, device: &Device) -> Result<Self> {
        Self::cached(&RopeCache::default(), ids, (axes_dim, theta), device)
    }

    /// [`Rope::new`] with the host tables taken from `cache` when it holds those of the same ids, axes and θ (else
    /// built and kept there): the same values, without a cos and a sin per token and frequency.
    pub fn cached(
        cache: &RopeCache,
        ids: &Tensor,
        (axes_dim, theta): (&[usize], f64),
        device: &Device,
    ) -> Result<Self> {
        let (b, l, n_axes) = ids.dims3()?;
        let key = RopeKey {
            ids: ids.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
            dims: (b, l, n_axes),
            axes_dim: axes_dim.to_vec(),
            theta,
        };
        let mut slot = cache
            .0
            .lock()
            .map_err(|_| candle_core::Error::msg("the RoPE table cache was poisoned"))?;
        let (cos, sin) = match slot.as_ref() {
            Some((k, cos, sin)) if *k == key => (cos.clone(), sin.clone()),
            _ => {
                let half: usize = axes_dim.iter().map(|d| d / 2).sum();
                let angles = angles(&key.ids, n_axes, axes_dim, theta)?;
                let table = |f: fn(f64) -> f64| -> Result<Tensor> {
                    let values: Vec<f32> = angles.iter().map(|&a| f(a) as f32).collect();
                    Tensor::from_vec(values, (b, l, 1, half), &Device::Cpu)
                };
                let (cos, sin) = (table(f64::cos)?, table(f64::sin)?);
                *slot = Some((key, cos.clone(), sin.clone()));
                (cos, sin)
            }
        };
        drop(slot);
        Ok(Self {
            cos: cos.to_device(device)?,
            sin: sin.to_device(device)?,
        })
    }

    /// Rotates `xs` [b, seq_len, heads, head_dim] (q or k).
    pub fn apply(&self, xs: &Tensor) -> Result<Tensor> {
        rope_apply(xs, &self.cos, &self.sin)
    }

    /// Input gradient of [`Rope::apply`].
    pub fn backward(&self, dy: &Tensor) -> Result<Tensor> {
        rope_backward(dy, &self.cos, &self.sin)
    }

    /// The table in the official `EmbedND` layout [b, 1, seq_len, head_dim / 2, 2, 2], each 2×2 being
    /// [[cos, −sin], [sin, cos]] (for parity checks).
    pub fn official_layout(&self) -> Result<Tensor> {
        let (b, l, _, half) = self.cos.dims4()?;
        let (cos, sin) = (
            self.cos.reshape((b, l, half))?,
            self.sin.reshape((b, l, half))?,
        );
        Tensor::stack(&[&cos, &sin.neg()?, &sin, &cos], 3)?.reshape((b, 1, l, half, 2, 2))
    }
}

/// What the host tables of [`Rope::new`] depend on: the ids (flattened, and their dims), the axes and θ.
#[derive(Clone, Debug, PartialEq)]
struct RopeKey {
    ids: Vec<f32>,
    dims: (usize, usize, usize),
    axes_dim: Vec<usize>,
    theta: f64,
}

/// The f32 host tables (cos, sin) of the last ids a model embedded, kept for its next call with the same ones.
#[derive(Default)]
pub struct RopeCache(Mutex<Option<(RopeKey, Tensor, Tensor)>>);

impl Clone for RopeCache {
    fn clone(&self) -> Self {
        Self(Mutex::new(self.0.lock().ok().and_then(|slot| slot.clone())))
    }
}

/// Image-token ids for a packed latent grid of `h` × `w` tokens: (`axis0`, row, col) per token in row-major
/// order, [b, h·w, 3] f32 (`axis0` is 0 for the image being denoised, 1 for Kontext conditioning tokens).
pub fn image_ids(b: usize, h: usize, w: usize, axis0: f32, device: &Device) -> Result<Tensor> {
    let mut ids = Vec::with_capacity(h * w * 3);
    for row in 0..h {
        for col in 0..w {
            ids.extend([axis0, row as f32, col as f32]);
        }
    }
    Tensor::from_vec(ids, (1, h * w, 3), device)?.repeat((b, 1, 1))
}

/// Text-token ids: all zero, [b, txt_len, 3] f32.
pub fn text_ids(b: usize, txt_len: usize, device: &Device) -> Result<Tensor> {
    Tensor::zeros((b, txt_len, 3), DType::F32, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_ids_leave_vectors_unrotated() -> Result<()> {
        let dev = Device::Cpu;
        let rope = Rope::new(&text_ids(1, 3, &dev)?, &[4, 6, 6], 10_000.0, &dev)?;
        let xs = Tensor::arange(0f32, 96.0, &dev)?.reshape((1, 3, 2, 16))?;
        let diff = (rope.apply(&xs)? - &xs)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        Ok(())
    }

    #[test]
    fn cached_tables_follow_the_ids() -> Result<()> {
        let dev = Device::Cpu;
        let cache = RopeCache::default();
        let values = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>());
        let grid = |h, w, axis0| -> Result<Tensor> {
            Tensor::cat(
                &[&text_ids(1, 2, &dev)?, &image_ids(1, h, w, axis0, &dev)?],
                1,
            )
        };
        // A, then other ids of the same shape (a Kontext axis), another grid, then A again: always the uncached.
        for ids in [
            grid(2, 3, 0.0)?,
            grid(2, 3, 1.0)?,
            grid(3, 2, 0.0)?,
            grid(2, 3, 0.0)?,
        ] {
            let fresh = Rope::new(&ids, &[4, 6, 6], 10_000.0, &dev)?;
            let cached = Rope::cached(&cache, &ids, (&[4, 6, 6], 10_000.0), &dev)?;
            assert_eq!(values(&fresh.cos)?, values(&cached.cos)?);
            assert_eq!(values(&fresh.sin)?, values(&cached.sin)?);
        }
        let ids = grid(2, 3, 0.0)?;
        let other_theta = Rope::cached(&cache, &ids, (&[4, 6, 6], 1_000.0), &dev)?;
        assert_eq!(
            values(&Rope::new(&ids, &[4, 6, 6], 1_000.0, &dev)?.sin)?,
            values(&other_theta.sin)?
        );
        Ok(())
    }

    #[test]
    fn image_ids_are_row_major() -> Result<()> {
        let ids = image_ids(2, 2, 3, 1.0, &Device::Cpu)?;
        assert_eq!(ids.dims(), [2, 6, 3]);
        assert_eq!(ids.get(1)?.get(4)?.to_vec1::<f32>()?, vec![1.0, 1.0, 1.0]);
        Ok(())
    }
}
