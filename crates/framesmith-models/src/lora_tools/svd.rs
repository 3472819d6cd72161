//! The SVD of a low-rank product `up · down` ([out, r] · [r, in]) from its factors, never forming the product:
//! with the Gram matrices `upᵀ up = Vu Λu Vuᵀ` and `down downᵀ = Vd Λd Vdᵀ` (symmetric Jacobi), `up · down =
//! Qu M Qdᵀ` with orthonormal `Qu = up Vu Λu^-½`, `Qd = downᵀ Vd Λd^-½` and the `r × r` core
//! `M = Λu^½ Vuᵀ Vd Λd^½`, whose SVD (one-sided Jacobi) gives that of the product. Everything `r`-sized runs here
//! in f64; the two products with the large factors run in candle. No crate needed for `r × r` matrices.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};

/// A square matrix, row-major.
#[derive(Clone, Debug)]
struct Square {
    n: usize,
    a: Vec<f64>,
}

impl Square {
    fn identity(n: usize) -> Self {
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            a[i * n + i] = 1.0;
        }
        Self { n, a }
    }

    fn at(&self, i: usize, j: usize) -> f64 {
        self.a[i * self.n + j]
    }

    fn set(&mut self, i: usize, j: usize, v: f64) {
        self.a[i * self.n + j] = v;
    }

    /// Rotates columns `p` and `q` by (c, s): `p ← c·p − s·q`, `q ← s·p + c·q`.
    fn rotate_columns(&mut self, p: usize, q: usize, c: f64, s: f64) {
        for i in 0..self.n {
            let (x, y) = (self.at(i, p), self.at(i, q));
            self.set(i, p, c * x - s * y);
            self.set(i, q, s * x + c * y);
        }
    }

    fn from_tensor(t: &Tensor) -> Result<Self> {
        let (n, m) = t.dims2()?;
        if n != m {
            bail!("expected a square matrix, got [{n}, {m}]");
        }
        let a = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        Ok(Self { n, a })
    }
}

/// Jacobi rotation (c, s) that zeroes the off-diagonal of `[[app, apq], [apq, aqq]]`-like pairs.
fn rotation(diff: f64, off: f64) -> (f64, f64) {
    let theta = diff / (2.0 * off);
    let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
    let c = 1.0 / (t * t + 1.0).sqrt();
    (c, c * t)
}

/// Eigenvalues and eigenvectors (columns) of a symmetric matrix, by cyclic Jacobi.
fn symmetric_eigen(mut a: Square) -> (Vec<f64>, Square) {
    let n = a.n;
    let mut v = Square::identity(n);
    let norm: f64 = a.a.iter().map(|x| x * x).sum();
    for _ in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |j| *j != i).map(move |j| (i, j)))
            .map(|(i, j)| a.at(i, j).powi(2))
            .sum();
        if off <= 1e-30 * norm || off == 0.0 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a.at(p, q);
                if apq == 0.0 {
                    continue;
                }
                let (c, s) = rotation(a.at(q, q) - a.at(p, p), apq);
                // A ← Jᵀ A J with J rotating p, q: columns, then rows.
                a.rotate_columns(p, q, c, s);
                for j in 0..n {
                    let (x, y) = (a.at(p, j), a.at(q, j));
                    a.set(p, j, c * x - s * y);
                    a.set(q, j, s * x + c * y);
                }
                v.rotate_columns(p, q, c, s);
            }
        }
    }
    ((0..n).map(|i| a.at(i, i)).collect(), v)
}

/// `M = U Σ Vᵀ` by one-sided Jacobi on the columns of `m`: (σ, U, V), σ unsorted.
fn jacobi_svd(mut w: Square) -> (Vec<f64>, Square, Square) {
    let n = w.n;
    let mut v = Square::identity(n);
    for _ in 0..100 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (mut alpha, mut beta, mut gamma) = (0.0, 0.0, 0.0);
                for i in 0..n {
                    let (x, y) = (w.at(i, p), w.at(i, q));
                    alpha += x * x;
                    beta += y * y;
                    gamma += x * y;
                }
                if gamma == 0.0 || gamma.abs() <= 1e-15 * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let (c, s) = rotation(beta - alpha, gamma);
                w.rotate_columns(p, q, c, s);
                v.rotate_columns(p, q, c, s);
            }
        }
        if !rotated {
            break;
        }
    }
    let sigma: Vec<f64> = (0..n)
        .map(|j| (0..n).map(|i| w.at(i, j).powi(2)).sum::<f64>().sqrt())
        .collect();
    let mut u = w;
    for (j, s) in sigma.iter().enumerate() {
        for i in 0..n {
            let x = if *s > 0.0 { u.at(i, j) / s } else { 0.0 };
            u.set(i, j, x);
        }
    }
    (sigma, u, v)
}

/// The SVD of `up · down` as the maps that make its rank-`k` factors from the given ones.
pub(crate) struct FactorSvd {
    /// Singular values, largest first.
    singular: Vec<f64>,
    /// `[r, r]`: column j of `Vu Λu^-½ Ũ`, so `up · left` holds the left singular vectors.
    left: Tensor,
    /// `[r, r]`: row j of `Ṽᵀ Λd^-½ Vdᵀ`, so `right · down` holds the right singular vectors as rows.
    right: Tensor,
}

/// `V Λ^p Vᵀ`-style pieces: `V diag(f(λ))` as f64 `[r, r]`, with directions whose eigenvalue is negligible
/// (under `1e-24` of the largest: zero columns of the factor) mapped to zero.
fn scaled_columns(v: &Square, lambda: &[f64], f: impl Fn(f64) -> f64) -> Vec<f64> {
    let top = lambda.iter().copied().fold(0.0, f64::max);
    let n = v.n;
    let mut out = vec![0.0; n * n];
    for (j, &l) in lambda.iter().enumerate() {
        let g = if l > 1e-24 * top && l > 0.0 {
            f(l)
        } else {
            0.0
        };
        for i in 0..n {
            out[i * n + j] = v.at(i, j) * g;
        }
    }
    out
}

fn mat_mul(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * n];
    for i in 0..n {
        for k in 0..n {
            let x = a[i * n + k];
            for j in 0..n {
                out[i * n + j] += x * b[k * n + j];
            }
        }
    }
    out
}

fn transpose(a: &[f64], n: usize) -> Vec<f64> {
    (0..n * n).map(|idx| a[(idx % n) * n + idx / n]).collect()
}

impl FactorSvd {
    /// From `up` [out, r] and `down` [r, in] (any float dtype).
    pub(crate) fn new(up: &Tensor, down: &Tensor) -> Result<Self> {
        let (up, down) = (up.to_dtype(DType::F64)?, down.to_dtype(DType::F64)?);
        let r = down.dim(0)?;
        if up.dim(1)? != r {
            bail!(
                "up {:?} and down {:?} do not multiply",
                up.dims(),
                down.dims()
            );
        }
        let (lu, vu) = symmetric_eigen(Square::from_tensor(&up.t()?.matmul(&up)?)?);
        let (ld, vd) = symmetric_eigen(Square::from_tensor(&down.matmul(&down.t()?)?)?);
        // M = Λu^½ Vuᵀ · Vd Λd^½ = (Vu Λu^½)ᵀ (Vd Λd^½).
        let su = scaled_columns(&vu, &lu, f64::sqrt);
        let sd = scaled_columns(&vd, &ld, f64::sqrt);
        let core = mat_mul(&transpose(&su, r), &sd, r);
        let (sigma, cu, cv) = jacobi_svd(Square { n: r, a: core });
        let mut order: Vec<usize> = (0..r).collect();
        order.sort_by(|a, b| sigma[*b].total_cmp(&sigma[*a]));
        let pick = |m: &Square| -> Vec<f64> {
            (0..r * r)
                .map(|idx| m.at(idx / r, order[idx % r]))
                .collect()
        };
        let (cu, cv) = (pick(&cu), pick(&cv));
        let left = mat_mul(&scaled_columns(&vu, &lu, |l| 1.0 / l.sqrt()), &cu, r);
        let right = transpose(
            &mat_mul(&scaled_columns(&vd, &ld, |l| 1.0 / l.sqrt()), &cv, r),
            r,
        );
        Ok(Self {
            singular: order.iter().map(|i| sigma[*i]).collect(),
            left: Tensor::from_vec(left, (r, r), &Device::Cpu)?,
            right: Tensor::from_vec(right, (r, r), &Device::Cpu)?,
        })
    }

    /// The singular values, largest first.
    #[cfg(test)]
    pub(crate) fn singular_values(&self) -> &[f64] {
        &self.singular
    }

    /// `(Σ_{i<k} σ², Σ σ²)`.
    pub(crate) fn energy(&self, k: usize) -> (f64, f64) {
        let sq = |s: &[f64]| s.iter().map(|v| v * v).sum::<f64>();
        (
            sq(&self.singular[..k.min(self.singular.len())]),
            sq(&self.singular),
        )
    }

    /// The rank-`k` factors `(up' [out, k], down' [k, in])` in f32 of the product of `up` and `down` (the same
    /// factors this was made from), √σ on each side.
    pub(crate) fn truncated(
        &self,
        up: &Tensor,
        down: &Tensor,
        k: usize,
    ) -> Result<(Tensor, Tensor)> {
        let roots: Vec<f64> = self.singular.iter().take(k).map(|s| s.sqrt()).collect();
        let roots = Tensor::from_vec(roots, k, &Device::Cpu)?;
        let left = self
            .left
            .narrow(1, 0, k)?
            .broadcast_mul(&roots.reshape((1, k))?)?;
        let right = self
            .right
            .narrow(0, 0, k)?
            .broadcast_mul(&roots.reshape((k, 1))?)?;
        let new_up = up.to_dtype(DType::F64)?.matmul(&left)?;
        let new_down = right.matmul(&down.to_dtype(DType::F64)?)?;
        Ok((new_up.to_dtype(DType::F32)?, new_down.to_dtype(DType::F32)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An orthonormal `[n, n]` matrix: the DCT-II basis, rows k.
    pub(crate) fn dct(n: usize) -> Vec<f64> {
        let mut out = vec![0.0; n * n];
        for k in 0..n {
            let norm = if k == 0 {
                (1.0 / n as f64).sqrt()
            } else {
                (2.0 / n as f64).sqrt()
            };
            for i in 0..n {
                out[k * n + i] =
                    norm * (std::f64::consts::PI * (i as f64 + 0.5) * k as f64 / n as f64).cos();
            }
        }
        out
    }

    #[test]
    fn the_singular_values_of_a_product_are_found_from_its_factors() -> Result<()> {
        let (out, inp, r) = (12, 10, 4);
        let sigma = [3.0, 1.5, 0.5, 0.25];
        let (p, q, mix) = (dct(out), dct(inp), dct(r));
        // up = P[:, :r] Σ R, down = Rᵀ Q[:r, :]: the product is P Σ Q with the singular values `sigma`.
        let up: Vec<f64> = (0..out * r)
            .map(|idx| {
                let (i, j) = (idx / r, idx % r);
                (0..r)
                    .map(|m| p[m * out + i] * sigma[m] * mix[m * r + j])
                    .sum()
            })
            .collect();
        let down: Vec<f64> = (0..r * inp)
            .map(|idx| {
                let (j, c) = (idx / inp, idx % inp);
                (0..r).map(|m| mix[m * r + j] * q[m * inp + c]).sum()
            })
            .collect();
        let up = Tensor::from_vec(up, (out, r), &Device::Cpu)?;
        let down = Tensor::from_vec(down, (r, inp), &Device::Cpu)?;
        let svd = FactorSvd::new(&up, &down)?;
        for (got, want) in svd.singular_values().iter().zip(sigma) {
            assert!((got - want).abs() < 1e-12, "{got} against {want}");
        }
        let (u2, d2) = svd.truncated(&up, &down, r)?;
        let rebuilt = u2.matmul(&d2)?.to_dtype(DType::F64)?;
        let diff = (rebuilt - up.matmul(&down)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f64>()?;
        assert!(
            diff < 1e-6,
            "the full-rank factors rebuild the product to {diff}"
        );
        Ok(())
    }
}
