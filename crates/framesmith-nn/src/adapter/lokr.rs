//! LoKr: `ΔW = (w1 ⊗ w2) · alpha / rank · multiplier`, each factor a full matrix or a product of two rank-`rank`
//! matrices, with LyCORIS' rules for the split of the widths and for which factor is a product.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::Rng;

use super::{kaiming, param_grad, work_dtype, work_tensor, AdapterShape};
use crate::linear::ParamGrad;

/// Splits `dimension` into `(m, n)`, `m <= n`, `m · n = dimension`, as LyCORIS' `factorization` does: with a
/// positive `factor` that divides it, `(factor, dimension / factor)` (ordered); otherwise the most square split
/// whose smaller part is at most `factor` (any size for a negative `factor`).
pub fn factorization(dimension: usize, factor: i64) -> (usize, usize) {
    if let Ok(f) = usize::try_from(factor) {
        if f > 0 && dimension % f == 0 {
            let other = dimension / f;
            return (f.min(other), f.max(other));
        }
    }
    let limit = usize::try_from(factor).unwrap_or(dimension);
    let (mut m, mut n) = (1, dimension);
    let length = m + n;
    while m < n {
        let mut next = m + 1;
        while dimension % next != 0 {
            next += 1;
        }
        let other = dimension / next;
        if next + other > length || next > limit {
            break;
        }
        (m, n) = (next, other);
    }
    (m.min(n), m.max(n))
}

/// One Kronecker factor: a full matrix, or `a · b` with `a` [rows, rank] and `b` [rank, cols].
#[derive(Clone)]
pub enum Factor {
    Full(Var),
    Product { a: Var, b: Var },
}

impl Factor {
    /// The factor as a matrix, its variables read by `read`.
    fn dense(&self, read: &impl Fn(&Var) -> Result<Tensor>) -> Result<Tensor> {
        match self {
            Self::Full(w) => read(w),
            Self::Product { a, b } => read(a)?.matmul(&read(b)?),
        }
    }

    /// `(rows, cols)` of the matrix.
    fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Full(w) => w.as_tensor().dims2(),
            Self::Product { a, b } => Ok((a.dim(0)?, b.dim(1)?)),
        }
    }

    /// The variables' gradients from the gradient `d` of the matrix (f32), appended to `out`.
    fn backward(&self, d: &Tensor, out: &mut Vec<ParamGrad>) -> Result<()> {
        match self {
            Self::Full(w) => out.push(param_grad(w, d.clone())?),
            Self::Product { a, b } => {
                let (a32, b32) = (work_tensor(a)?, work_tensor(b)?);
                out.push(param_grad(a, d.matmul(&b32.t()?)?)?);
                out.push(param_grad(b, a32.t()?.matmul(d)?)?);
            }
        }
        Ok(())
    }
}

/// LoKr's options (see [`super::AdapterKind::Lokr`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct LokrOptions {
    pub factor: i64,
    pub decompose_both: bool,
    pub full_matrix: bool,
}

/// A LoKr adapter.
#[derive(Clone)]
pub struct Lokr {
    /// `[out_l, in_m]`, the smaller factor (`lokr_w1`, or `lokr_w1_a` · `lokr_w1_b`).
    pub w1: Factor,
    /// `[out_k, in_n]` (`lokr_w2`, or `lokr_w2_a` · `lokr_w2_b`).
    pub w2: Factor,
    pub alpha: f64,
    /// The rank `alpha` divides: of the product factors, or 1 when both are full (scale 1, as LyCORIS and
    /// ComfyUI read such files).
    pub rank: usize,
    pub multiplier: f64,
}

impl Lokr {
    /// A fresh adapter as LyCORIS makes one: `w1` full (Kaiming) unless `decompose_both` and the rank is below
    /// half its larger side (both parts Kaiming); `w2` a product (`a` Kaiming, `b` zero) when the rank is below
    /// half its larger side, else full and zero; both full means scale 1.
    pub(super) fn new(
        shape: AdapterShape,
        options: LokrOptions,
        device: &Device,
        rng: &mut impl Rng,
    ) -> Result<Self> {
        let (out_l, out_k) = factorization(shape.out_dim, options.factor);
        let (in_m, in_n) = factorization(shape.in_dim, options.factor);
        let rank = shape.rank;
        let dtype = shape.dtype;
        let low = |rows: usize, cols: usize| {
            !options.full_matrix && (rank as f64) < rows.max(cols) as f64 / 2.0
        };
        let w1 = if options.decompose_both && low(out_l, in_m) {
            Factor::Product {
                a: kaiming(rng, [out_l, rank], dtype, device)?,
                b: kaiming(rng, [rank, in_m], dtype, device)?,
            }
        } else {
            Factor::Full(kaiming(rng, [out_l, in_m], dtype, device)?)
        };
        let w2 = if low(out_k, in_n) {
            Factor::Product {
                a: kaiming(rng, [out_k, rank], dtype, device)?,
                b: Var::from_tensor(&Tensor::zeros((rank, in_n), dtype, device)?)?,
            }
        } else {
            Factor::Full(Var::from_tensor(&Tensor::zeros(
                (out_k, in_n),
                dtype,
                device,
            )?)?)
        };
        Ok(Self::with_factors(w1, w2, shape.alpha, rank))
    }

    /// An adapter of these factors: the rank is that of the product factors (1 when both are full, with alpha
    /// then the rank: scale 1).
    fn with_factors(w1: Factor, w2: Factor, alpha: f64, rank: usize) -> Self {
        let product_rank = |f: &Factor| match f {
            Factor::Product { b, .. } => b.dims().first().copied(),
            Factor::Full(_) => None,
        };
        let (rank, alpha) = match product_rank(&w1).or(product_rank(&w2)) {
            Some(r) => (r, alpha),
            None => (rank.max(1), rank.max(1) as f64),
        };
        Self {
            w1,
            w2,
            alpha,
            rank,
            multiplier: 1.0,
        }
    }

    /// Input width: `in_m · in_n`.
    pub fn in_dim(&self) -> usize {
        let (_, c1) = self.w1.dims().unwrap_or_default();
        let (_, c2) = self.w2.dims().unwrap_or_default();
        c1 * c2
    }

    /// Output width: `out_l · out_k`.
    pub fn out_dim(&self) -> usize {
        let (r1, _) = self.w1.dims().unwrap_or_default();
        let (r2, _) = self.w2.dims().unwrap_or_default();
        r1 * r2
    }

    /// `alpha / rank · multiplier`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64 * self.multiplier
    }

    pub(super) fn named_vars(&self) -> Vec<(&'static str, &Var)> {
        let mut out = Vec::with_capacity(4);
        match &self.w1 {
            Factor::Full(w) => out.push(("lokr_w1", w)),
            Factor::Product { a, b } => out.extend([("lokr_w1_a", a), ("lokr_w1_b", b)]),
        }
        match &self.w2 {
            Factor::Full(w) => out.push(("lokr_w2", w)),
            Factor::Product { a, b } => out.extend([("lokr_w2_a", a), ("lokr_w2_b", b)]),
        }
        out
    }

    pub(super) fn map_vars(
        &self,
        f: &mut impl FnMut(&'static str, &Var) -> Result<Var>,
    ) -> Result<Self> {
        let mut map = |factor: &Factor, names: [&'static str; 3]| -> Result<Factor> {
            Ok(match factor {
                Factor::Full(w) => Factor::Full(f(names[0], w)?),
                Factor::Product { a, b } => Factor::Product {
                    a: f(names[1], a)?,
                    b: f(names[2], b)?,
                },
            })
        };
        Ok(Self {
            w1: map(&self.w1, ["lokr_w1", "lokr_w1_a", "lokr_w1_b"])?,
            w2: map(&self.w2, ["lokr_w2", "lokr_w2_a", "lokr_w2_b"])?,
            ..self.clone()
        })
    }

    /// `(w1 ⊗ w2) · scale` [out, in] in f32.
    pub(super) fn delta(&self, read: &impl Fn(&Var) -> Result<Tensor>) -> Result<Tensor> {
        let w1 = self.w1.dense(read)?;
        let w2 = self.w2.dense(read)?;
        let (a, b) = w1.dims2()?;
        let (c, d) = w2.dims2()?;
        // kron(w1, w2)[i·c + k, j·d + l] = w1[i, j] · w2[k, l]: a [a, c, b, d] product read as [a·c, b·d].
        let kron = w1
            .reshape((a, 1, b, 1))?
            .broadcast_mul(&w2.reshape((1, c, 1, d))?)?
            .reshape((a * c, b * d))?;
        kron * self.scale()
    }

    /// The factors' gradients from `grad` = ∂L/∂ΔW (f32 [out, in]): with `G` = grad · scale read as
    /// [a, c, b, d], `∂w1[i, j] = Σ G[i, k, j, l] w2[k, l]` and `∂w2[k, l] = Σ G[i, k, j, l] w1[i, j]`.
    pub(super) fn delta_backward(&self, grad: &Tensor) -> Result<Vec<ParamGrad>> {
        let (w1, w2) = self.dense_factors()?;
        let (a, b) = w1.dims2()?;
        let (c, d) = w2.dims2()?;
        // [a·b, c·d]: rows index w1's entries, columns w2's.
        let g = (grad * self.scale())?
            .reshape((a, c, b, d))?
            .permute((0, 2, 1, 3))?
            .contiguous()?
            .reshape((a * b, c * d))?;
        let d_w1 = g.matmul(&w2.reshape((c * d, 1))?)?.reshape((a, b))?;
        let d_w2 = w1.reshape((1, a * b))?.matmul(&g)?.reshape((c, d))?;
        self.factor_backward(&d_w1, &d_w2)
    }

    /// `w1` [a, b] and `w2` [c, d] as matrices (without the scale), detached, in the work dtype (f32).
    pub fn dense_factors(&self) -> Result<(Tensor, Tensor)> {
        Ok((self.w1.dense(&work_tensor)?, self.w2.dense(&work_tensor)?))
    }

    /// The dtype of the factors' arithmetic and of their gradients ([`super::work_dtype`]).
    pub fn work_dtype(&self) -> DType {
        match &self.w1 {
            Factor::Full(w) | Factor::Product { a: w, .. } => work_dtype(w),
        }
    }

    /// `([a, b], [c, d])`: the shapes of `w1` and `w2`.
    pub fn factor_dims(&self) -> Result<([usize; 2], [usize; 2])> {
        let (a, b) = self.w1.dims()?;
        let (c, d) = self.w2.dims()?;
        Ok(([a, b], [c, d]))
    }

    /// The variables' gradients (in [`super::Adapter::named_vars`] order) from those of the matrices `w1` and
    /// `w2` (work dtype).
    pub fn factor_backward(&self, d_w1: &Tensor, d_w2: &Tensor) -> Result<Vec<ParamGrad>> {
        let mut out = Vec::with_capacity(4);
        self.w1.backward(d_w1, &mut out)?;
        self.w2.backward(d_w2, &mut out)?;
        Ok(out)
    }

    /// An adapter from a file's tensors (`get` by name), alpha as stored (the rank when absent).
    pub(super) fn from_parts(
        get: &impl Fn(&str) -> Result<Option<Tensor>>,
        alpha: Option<f64>,
    ) -> Result<Self> {
        let factor = |full: &str, a: &str, b: &str| -> Result<Factor> {
            match (get(full)?, get(a)?, get(b)?) {
                (Some(w), None, None) => Ok(Factor::Full(Var::from_tensor(&w)?)),
                (None, Some(a), Some(b))
                    if a.dims().len() == 2 && b.dims().len() == 2 && a.dim(1)? == b.dim(0)? =>
                {
                    Ok(Factor::Product {
                        a: Var::from_tensor(&a)?,
                        b: Var::from_tensor(&b)?,
                    })
                }
                _ => candle_core::bail!(
                    "needs either {full} or both {a} [rows, rank] and {b} [rank, cols]"
                ),
            }
        };
        let w1 = factor("lokr_w1", "lokr_w1_a", "lokr_w1_b")?;
        let w2 = factor("lokr_w2", "lokr_w2_a", "lokr_w2_b")?;
        for f in [&w1, &w2] {
            if let Factor::Full(w) = f {
                w.as_tensor().dims2()?;
            }
        }
        let rank = match (&w1, &w2) {
            (_, Factor::Product { b, .. }) | (Factor::Product { b, .. }, _) => b.dim(0)?,
            // Both full: scale 1 whatever alpha says; the rank is kept as alpha so a round trip writes it back.
            _ => alpha.map_or(1, |a| a.round().max(1.0) as usize),
        };
        Ok(Self::with_factors(
            w1,
            w2,
            alpha.unwrap_or(rank as f64),
            rank,
        ))
    }
}
