//! LoHa: `ΔW = (w1_a w1_b) ⊙ (w2_a w2_b) · alpha / rank · multiplier`, the Hadamard product of two rank-`rank`
//! products, initialised as LyCORIS does (`w2_a` zero).

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::Rng;

use super::{param_grad, work_tensor, AdapterShape};
use crate::init::randn;
use crate::linear::ParamGrad;

/// A LoHa adapter: `w1_a`, `w2_a` [out, rank]; `w1_b`, `w2_b` [rank, in].
#[derive(Clone)]
pub struct Loha {
    pub w1_a: Var,
    pub w1_b: Var,
    pub w2_a: Var,
    pub w2_b: Var,
    pub alpha: f64,
    pub multiplier: f64,
}

impl Loha {
    /// A fresh adapter: `w1_b`, `w2_b` ~ N(0, 1), `w1_a` ~ N(0, 0.1²), `w2_a` zero (LyCORIS' init).
    pub(super) fn new(shape: AdapterShape, device: &Device, rng: &mut impl Rng) -> Result<Self> {
        let AdapterShape {
            in_dim,
            out_dim,
            rank,
            alpha,
            dtype,
        } = shape;
        let mut normal = |dims: (usize, usize), std: f32| -> Result<Var> {
            Var::from_tensor(&randn(rng, dims, 0.0, std, device)?.to_dtype(dtype)?)
        };
        let w1_b = normal((rank, in_dim), 1.0)?;
        let w1_a = normal((out_dim, rank), 0.1)?;
        let w2_b = normal((rank, in_dim), 1.0)?;
        let w2_a = Var::from_tensor(&Tensor::zeros((out_dim, rank), dtype, device)?)?;
        Ok(Self {
            w1_a,
            w1_b,
            w2_a,
            w2_b,
            alpha,
            multiplier: 1.0,
        })
    }

    /// The rank (columns of `w1_a`).
    pub fn rank(&self) -> usize {
        self.w1_a.dims().get(1).copied().unwrap_or(0)
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.w1_b.dims().get(1).copied().unwrap_or(0)
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.w1_a.dims().first().copied().unwrap_or(0)
    }

    /// `alpha / rank · multiplier`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank() as f64 * self.multiplier
    }

    pub(super) fn named_vars(&self) -> Vec<(&'static str, &Var)> {
        vec![
            ("hada_w1_a", &self.w1_a),
            ("hada_w1_b", &self.w1_b),
            ("hada_w2_a", &self.w2_a),
            ("hada_w2_b", &self.w2_b),
        ]
    }

    pub(super) fn map_vars(
        &self,
        f: &mut impl FnMut(&'static str, &Var) -> Result<Var>,
    ) -> Result<Self> {
        Ok(Self {
            w1_a: f("hada_w1_a", &self.w1_a)?,
            w1_b: f("hada_w1_b", &self.w1_b)?,
            w2_a: f("hada_w2_a", &self.w2_a)?,
            w2_b: f("hada_w2_b", &self.w2_b)?,
            ..self.clone()
        })
    }

    /// `(w1_a w1_b) ⊙ (w2_a w2_b) · scale` [out, in] in f32.
    pub(super) fn delta(&self, read: &impl Fn(&Var) -> Result<Tensor>) -> Result<Tensor> {
        let p1 = read(&self.w1_a)?.matmul(&read(&self.w1_b)?)?;
        let p2 = read(&self.w2_a)?.matmul(&read(&self.w2_b)?)?;
        (p1 * p2)? * self.scale()
    }

    /// `W + ΔW` [out, in] in `dtype` for the frozen weight `base` (already in `dtype`), detached, `ΔW`'s two
    /// products made in `dtype` (scale and multiplier on the first) and their Hadamard product added to the base
    /// in one pass ([`crate::ops::add_product`]): for a forward on `W + ΔW`, where the update is rounded to the
    /// compute dtype with the sum anyway.
    pub fn merged_in(&self, base: &Tensor, dtype: DType) -> Result<Tensor> {
        let read = |v: &Var| v.as_tensor().detach().to_dtype(dtype);
        let w1_a = (work_tensor(&self.w1_a)? * self.scale())?.to_dtype(dtype)?;
        let p1 = w1_a.matmul(&read(&self.w1_b)?)?;
        let p2 = read(&self.w2_a)?.matmul(&read(&self.w2_b)?)?;
        crate::ops::add_product(base, &p1, &p2)
    }

    /// The factors' gradients from `grad` = ∂L/∂ΔW (f32 [out, in]): `∂P1 = G ⊙ P2`, `∂P2 = G ⊙ P1` with
    /// `G = grad · scale`, then each product's two factors as for a matmul.
    pub(super) fn delta_backward(&self, grad: &Tensor) -> Result<Vec<ParamGrad>> {
        let read = work_tensor;
        let (w1_a, w1_b) = (read(&self.w1_a)?, read(&self.w1_b)?);
        let (w2_a, w2_b) = (read(&self.w2_a)?, read(&self.w2_b)?);
        let g = (grad * self.scale())?;
        let d_p1 = (&g * w2_a.matmul(&w2_b)?)?;
        let d_p2 = (&g * w1_a.matmul(&w1_b)?)?;
        Ok(vec![
            param_grad(&self.w1_a, d_p1.matmul(&w1_b.t()?)?)?,
            param_grad(&self.w1_b, w1_a.t()?.matmul(&d_p1)?)?,
            param_grad(&self.w2_a, d_p2.matmul(&w2_b.t()?)?)?,
            param_grad(&self.w2_b, w2_a.t()?.matmul(&d_p2)?)?,
        ])
    }

    /// `ΔW` as a LoRA of rank `rank²`: `(downᵀ [in, r²], up [out, r²])`, detached, in `dtype`, with
    /// `ΔW = up · down` (the scale and multiplier on `down`): `(P1 ⊙ P2)[o, i] = Σ_{p,q} w1_a[o,p] w2_a[o,q] ·
    /// w1_b[p,i] w2_b[q,i]`, so `up[o, (p,q)] = w1_a[o,p] w2_a[o,q]` and `down[(p,q), i] = s · w1_b[p,i] w2_b[q,i]`:
    /// each the row-wise outer products of two factors ([`crate::ops::pair_products`], one kernel on CUDA; the `b`
    /// factors read as columns, hence `down` transposed).
    pub fn low_rank(&self, dtype: DType) -> Result<(Tensor, Tensor)> {
        let pairs = |a: &Var, b: &Var, columns: bool, scale: f64| {
            crate::ops::pair_products(&work_tensor(a)?, &work_tensor(b)?, columns, scale, dtype)
        };
        let up = pairs(&self.w1_a, &self.w2_a, false, 1.0)?;
        let down_t = pairs(&self.w1_b, &self.w2_b, true, self.scale())?;
        Ok((down_t, up))
    }

    /// The factors' gradients (in [`super::Adapter::named_vars`] order) from those of [`Loha::low_rank`]'s
    /// `downᵀ` [in, r²] and `up` [out, r²] (any float dtype): `∂w1_a[o,p] = Σ_q ∂up[o,(p,q)] w2_a[o,q]`, and so
    /// on, times the scale for the `b` factors ([`crate::ops::pair_products_backward`], one kernel per side on
    /// CUDA).
    pub fn low_rank_backward(&self, d_down_t: &Tensor, d_up: &Tensor) -> Result<Vec<ParamGrad>> {
        let folds = |d: &Tensor, a: &Var, b: &Var, columns: bool, scale: f64| {
            crate::ops::pair_products_backward(
                d,
                &work_tensor(a)?,
                &work_tensor(b)?,
                columns,
                scale,
            )
        };
        let (d_w1_a, d_w2_a) = folds(d_up, &self.w1_a, &self.w2_a, false, 1.0)?;
        let (d_w1_b, d_w2_b) = folds(d_down_t, &self.w1_b, &self.w2_b, true, self.scale())?;
        Ok(vec![
            param_grad(&self.w1_a, d_w1_a)?,
            param_grad(&self.w1_b, d_w1_b)?,
            param_grad(&self.w2_a, d_w2_a)?,
            param_grad(&self.w2_b, d_w2_b)?,
        ])
    }

    /// An adapter from a file's tensors (`get` by name), alpha as stored (the rank when absent).
    pub(super) fn from_parts(
        get: &impl Fn(&str) -> Result<Option<Tensor>>,
        alpha: Option<f64>,
    ) -> Result<Self> {
        let need = |name: &str| -> Result<Tensor> {
            match get(name)? {
                Some(t) if t.dims().len() == 2 => Ok(t),
                Some(t) => candle_core::bail!("{name} has shape {:?}, expected a matrix", t.dims()),
                None => candle_core::bail!("a LoHa module needs {name}"),
            }
        };
        let (w1_a, w1_b) = (need("hada_w1_a")?, need("hada_w1_b")?);
        let (w2_a, w2_b) = (need("hada_w2_a")?, need("hada_w2_b")?);
        let (out, rank) = w1_a.dims2()?;
        let in_dim = w1_b.dim(1)?;
        let fits = w1_b.dims() == [rank, in_dim]
            && w2_a.dims() == [out, rank]
            && w2_b.dims() == [rank, in_dim];
        if !fits || rank == 0 {
            candle_core::bail!(
                "LoHa factors do not fit: hada_w1_a {:?}, hada_w1_b {:?}, hada_w2_a {:?}, hada_w2_b {:?}",
                w1_a.dims(),
                w1_b.dims(),
                w2_a.dims(),
                w2_b.dims()
            );
        }
        Ok(Self {
            w1_a: Var::from_tensor(&w1_a)?,
            w1_b: Var::from_tensor(&w1_b)?,
            w2_a: Var::from_tensor(&w2_a)?,
            w2_b: Var::from_tensor(&w2_b)?,
            alpha: alpha.unwrap_or(rank as f64),
            multiplier: 1.0,
        })
    }
}
