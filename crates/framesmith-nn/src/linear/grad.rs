//! [`Linear`] outside candle's autograd, for hand-written backward passes: a forward that builds no graph (the LoRA
//! factors are used detached) and keeps the LoRA's low-rank activation, and a backward that gives the input
//! gradient through the frozen base ([`super::BaseWeight::input_grad`], as [`FrozenMatmul`]'s backward) plus the
//! gradients of the LoRA factors: `dUp = (dy·s)ᵀ (x Aᵀ)`, `dDown = ((dy·s) B)ᵀ x`, `s = alpha / rank · multiplier`.

use candle_core::{Result, Tensor, Var, D};

use super::{FrozenMatmul, Linear};
use crate::adapter::Adapter;
use crate::lora::Lora;
use crate::ops::Dense;

/// What [`Linear::backward`] needs from the forward besides the layer input: the LoRA's scaled low-rank
/// activation `x Aᵀ · s` [m, rank] (`None` without a LoRA), so the backward skips that matmul. The default (empty)
/// tape makes the backward recompute it.
#[derive(Clone, Debug, Default)]
pub struct LinearTape {
    pub(super) mid: Option<Tensor>,
    /// The layer's output (bias included), from DoRA's forward or an earlier pass ([`LinearTape::kept`]): DoRA's
    /// magnitude gradient reads it instead of recomputing the product.
    pub(super) output: Option<Tensor>,
    /// DoRA's row norms `‖W + ΔW‖` [out, 1] in the factors' work dtype.
    pub(super) norms: Option<Tensor>,
    /// LoKr's factors as its forward applied them (`s·w1` and `w2` in the compute dtype), so the backward does
    /// not build them again.
    pub(super) factors: Option<[Tensor; 2]>,
}

impl LinearTape {
    /// The tape of a layer whose output `y` an earlier pass on the same input kept, so the product was not run
    /// again: the backward recomputes the low-rank activation, and a DoRA layer takes its magnitude gradient from
    /// `y` rather than from the base product run once more.
    pub fn kept(y: &Tensor) -> Self {
        Self {
            mid: None,
            output: Some(y.clone()),
            ..Self::default()
        }
    }
}

/// What [`Linear::backward_with`] does with the input gradient.
#[derive(Debug)]
pub enum InputGrad {
    /// None is wanted (the text context).
    Skip,
    /// A fresh tensor.
    New,
    /// Added to this sum (shaped like the input, in its dtype; a tensor the caller owns).
    Add(Tensor),
}

/// The gradient of one trainable variable.
#[derive(Clone, Debug)]
pub struct ParamGrad {
    /// The variable (a LoRA factor); its tensor id says where the gradient goes.
    pub var: Var,
    /// The gradient, in the variable's dtype and shape.
    pub grad: Tensor,
}

/// The factors of `lora` detached and in `dtype`: `(down [r, in], up [out, r])`.
pub(super) fn detached_factors(lora: &Lora, dtype: candle_core::DType) -> Result<(Tensor, Tensor)> {
    Ok((
        lora.down.as_tensor().detach().to_dtype(dtype)?,
        lora.up.as_tensor().detach().to_dtype(dtype)?,
    ))
}

impl Linear {
    /// [`Linear::forward`] without building an autograd graph; also returns what [`Linear::backward`] needs.
    /// The LoRA's scale multiplies the `[m, rank]` activation rather than the `[m, out]` product, and the bias
    /// is added by the LoRA's matmul: two passes over the `[m, out]` output fewer than [`Linear::forward`].
    pub fn forward_untracked(&self, xs: &Tensor) -> Result<(Tensor, LinearTape)> {
        let out_dims = self.out_dims(xs);
        let x2 = xs.detach().dense()?.flatten_to(D::Minus2)?;
        let dtype = x2.dtype();
        let Some(adapter) = &self.adapter else {
            let bias = self.detached_bias(dtype)?;
            let y = x2.apply_op1_no_bwd(&FrozenMatmul {
                base: self.base.clone(),
            })?;
            let y = match bias {
                Some(b) => crate::ops::add_row(&y, &b)?,
                None => y,
            };
            return Ok((y.reshape(out_dims)?, LinearTape::default()));
        };
        let Adapter::Lora(lora) = adapter else {
            return self.forward_kind_untracked(&x2, adapter, out_dims);
        };
        let down = lora.down.as_tensor().detach().to_dtype(dtype)?;
        let raw = x2.matmul(&down.t()?)?;
        self.finish_forward(&x2, LowRank::Lora { raw, lora }, out_dims)
    }

    /// The rest of a LoRA-shaped linear's forward once its low-rank activation is known: the output
    /// `x Wᵀ + b + mid upᵀ` shaped `out_dims` (`mid` the scaled activation [m, rank]), and the tape.
    pub(super) fn finish_forward(
        &self,
        x2: &Tensor,
        low: LowRank,
        out_dims: Vec<usize>,
    ) -> Result<(Tensor, LinearTape)> {
        let dtype = x2.dtype();
        let bias = self.detached_bias(dtype)?;
        // The bias rides on the LoRA product as one more rank column ([mid | 1] [up | b]ᵀ), widened with zero
        // columns to a multiple of 8 so the product's operands stay 16-byte aligned (cuBLAS falls back to a slow
        // unaligned kernel for a rank of 33).
        let (mid, mid1, up1) = match (low, bias) {
            (LowRank::Scaled { mid, up }, Some(b)) => {
                let (mid1, up1) = with_bias_column(&mid, &up, &b)?;
                (mid, mid1, up1)
            }
            (LowRank::Scaled { mid, up }, None) => (mid.clone(), mid, up),
            (LowRank::Lora { raw, lora }, Some(b)) => {
                let width = (raw.dim(1)? + 1).next_multiple_of(8);
                let (mid, mid1) = crate::ops::lora_mid(&raw, lora.scale(), width)?;
                let up1 = crate::ops::lora_up(&lora.up.as_tensor().detach(), &b, width)?;
                (mid, mid1, up1)
            }
            (LowRank::Lora { raw, lora }, None) => {
                let mid = (raw * lora.scale())?;
                let up = lora.up.as_tensor().detach().to_dtype(dtype)?;
                (mid.clone(), mid, up)
            }
        };
        let y = if self.low_rank_first(x2) {
            // The low-rank product is written alone, and the base product accumulates onto it in its epilogue,
            // where reading the sum costs next to nothing: no pass of a small-k product over the full output.
            add_matmul(
                mid1.matmul(&up1.t()?)?,
                x2,
                &self.base.dense(x2.dtype())?,
                true,
            )?
        } else {
            let y = x2.apply_op1_no_bwd(&FrozenMatmul {
                base: self.base.clone(),
            })?;
            add_matmul(y, &mid1, &up1, true)?
        };
        Ok((
            y.reshape(out_dims)?,
            LinearTape {
                mid: Some(mid),
                ..LinearTape::default()
            },
        ))
    }

    /// The bias, detached and in `dtype` (`None` without one).
    fn detached_bias(&self, dtype: candle_core::DType) -> Result<Option<Tensor>> {
        self.bias
            .as_ref()
            .map(|b| b.detach().to_dtype(dtype))
            .transpose()
    }

    /// `xs`' dims with the last one this layer's output width.
    pub(super) fn out_dims(&self, xs: &Tensor) -> Vec<usize> {
        let mut out_dims = xs.dims().to_vec();
        if let Some(last) = out_dims.last_mut() {
            *last = self.out_dim();
        }
        out_dims
    }

    /// Whether the forward writes the LoRA product first and accumulates the base product onto it (CUDA, where
    /// [`add_matmul`] runs in place), rather than adding the LoRA product to the base output: not for FP8
    /// tensor-core products, whose kernel writes its output fresh.
    pub(super) fn low_rank_first(&self, x2: &Tensor) -> bool {
        let fp8_products = matches!(&self.base, super::BaseWeight::Fp8(w) if w.fp8_products());
        x2.device().is_cuda() && !fp8_products
    }

    /// Backward of [`Linear::forward_untracked`] for the output gradient `dy` [..., out]: the input gradient
    /// (shaped like `xs`, in its dtype; only when `input_grad`, e.g. not for the text context) and the LoRA
    /// factors' gradients (`down`, then `up`; empty without a LoRA). `xs` is the forward's input.
    pub fn backward(
        &self,
        xs: &Tensor,
        tape: &LinearTape,
        dy: &Tensor,
        input_grad: bool,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        let input = if input_grad {
            InputGrad::New
        } else {
            InputGrad::Skip
        };
        self.backward_with(xs, tape, dy, input)
    }

    /// [`Linear::backward`] with the input gradient as `input` says: none, a fresh tensor, or added to a sum the
    /// caller owns (in place on CUDA, so summing over the linears that share an input costs no extra pass).
    pub fn backward_with(
        &self,
        xs: &Tensor,
        tape: &LinearTape,
        dy: &Tensor,
        input: InputGrad,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        let dtype = xs.dtype();
        let x2 = xs.detach().dense()?.flatten_to(D::Minus2)?;
        let dy2 = rows(dy, dtype)?;
        if let Some(adapter) = self.adapter.as_ref().filter(|a| a.as_lora().is_none()) {
            let (dx, params) = self.backward_kind(adapter, &x2, tape, &dy2, input)?;
            return Ok((dx.map(|d| d.reshape(xs.shape())).transpose()?, params));
        }
        let mut params = Vec::new();
        // The LoRA's share of the input gradient, `((dy·s) B) A` (`None` without a LoRA).
        let mut low_rank = None;
        if let Some(terms) = self.low_rank_backward(&x2, tape, &dy2)? {
            let d_down = terms.t.t()?.matmul(&x2)?;
            params.push(terms.grad_down(d_down)?);
            params.push(terms.d_up);
            low_rank = Some(InputShare {
                t: terms.t,
                down: terms.down,
            });
        }
        let dx = self.input_grad(&dy2, low_rank, input)?;
        let dx = dx.map(|d| d.reshape(xs.shape())).transpose()?;
        Ok((dx, params))
    }
}

/// `t` detached, in `dtype`, dense and flattened to rows `[m, features]`.
pub(super) fn rows(t: &Tensor, dtype: candle_core::DType) -> Result<Tensor> {
    t.detach().to_dtype(dtype)?.dense()?.flatten_to(D::Minus2)
}

/// An adapter's share `t · down` of a layer's input gradient [m, in], for `t` [rows, k] and `down` [k, cols] with
/// `rows · cols = m · in` (a LoRA's `rows` are `m`; LoKr's `m · in_m`). `down` may be the transposed view of a
/// contiguous [cols, k] (LoHa's): the product then reads it transposed, with no copy.
pub(super) struct InputShare {
    pub t: Tensor,
    pub down: Tensor,
}

impl InputShare {
    /// `t · down` as [m, in] (`like`'s shape).
    fn fresh(&self, like: (usize, usize)) -> Result<Tensor> {
        self.t.matmul(&self.down)?.reshape(like)
    }

    /// `acc + t · down` for `acc` [m, in] (in place on CUDA).
    fn add_to(&self, acc: Tensor) -> Result<Tensor> {
        let like = acc.dims2()?;
        let rows = self.t.dim(0)?;
        let (b, transposed) = if !self.down.is_contiguous() && self.down.t()?.is_contiguous() {
            (self.down.t()?, true)
        } else {
            (self.down.clone(), false)
        };
        if rows == like.0 {
            return add_matmul(acc, &self.t, &b, transposed);
        }
        let acc = acc.reshape((rows, like.0 * like.1 / rows.max(1)))?;
        add_matmul(acc, &self.t, &b, transposed)?.reshape(like)
    }
}

impl Linear {
    /// The input gradient `dy W (+ the adapter's share)` [m, in] for `dy2` [m, out], as `input` says.
    pub(super) fn input_grad(
        &self,
        dy2: &Tensor,
        share: Option<InputShare>,
        input: InputGrad,
    ) -> Result<Option<Tensor>> {
        let like = (dy2.dim(0)?, self.in_dim());
        let base = |acc: Tensor| self.base.input_grad(dy2, Some(acc));
        Ok(match (input, share) {
            (InputGrad::Skip, _) => None,
            (InputGrad::New, None) => Some(self.base.input_grad(dy2, None)?),
            // As in the forward: the small product first, the base product accumulating onto it.
            (InputGrad::New, Some(share)) if dy2.device().is_cuda() => {
                Some(base(share.fresh(like)?)?)
            }
            (InputGrad::New, Some(share)) => Some(share.add_to(self.base.input_grad(dy2, None)?)?),
            (InputGrad::Add(acc), share) => {
                let acc = base(acc.flatten_to(D::Minus2)?)?;
                Some(match share {
                    Some(share) => share.add_to(acc)?,
                    None => acc,
                })
            }
        })
    }
}

/// A LoRA linear's backward terms that do not involve its input gradient or `down`'s gradient.
pub(super) struct LowRankTerms {
    /// `(dy·s) B` [m, rank].
    pub t: Tensor,
    /// `down` [rank, in], detached, in the compute dtype.
    pub down: Tensor,
    /// `up`'s gradient.
    pub d_up: ParamGrad,
    /// The `down` variable and its dtype.
    down_var: Var,
}

impl LowRankTerms {
    /// `down`'s gradient from `tᵀ x` [rank, in] (in the compute dtype).
    pub fn grad_down(&self, d_down: Tensor) -> Result<ParamGrad> {
        Ok(ParamGrad {
            var: self.down_var.clone(),
            grad: d_down.to_dtype(self.down_var.dtype())?.contiguous()?,
        })
    }
}

impl Linear {
    /// The LoRA terms of the backward for the flattened input `x2` and output gradient `dy2` (compute dtype),
    /// `None` without a LoRA: `t = (dy·s) B`, `dUp = (dy·s)ᵀ (x Aᵀ)` with the low-rank activation from the tape
    /// (recomputed when the tape has none).
    pub(super) fn low_rank_backward(
        &self,
        x2: &Tensor,
        tape: &LinearTape,
        dy2: &Tensor,
    ) -> Result<Option<LowRankTerms>> {
        let Some(lora) = self.lora() else {
            return Ok(None);
        };
        let (down, up) = detached_factors(lora, x2.dtype())?;
        let s = lora.scale();
        let mid = match &tape.mid {
            Some(m) => m.clone(),
            None => (x2.matmul(&down.t()?)? * s)?,
        };
        let t = (dy2.matmul(&up)? * s)?;
        let d_up = dy2.t()?.matmul(&mid)?;
        Ok(Some(LowRankTerms {
            t,
            down,
            d_up: ParamGrad {
                var: lora.up.clone(),
                grad: d_up.to_dtype(lora.up.dtype())?,
            },
            down_var: lora.down.clone(),
        }))
    }
}

/// A LoRA-shaped update's low-rank side as [`Linear::finish_forward`] takes it.
pub(super) enum LowRank<'a> {
    /// The scaled activation [m, rank] and `up` [out, rank] in the compute dtype (LoHa's factored update).
    Scaled { mid: Tensor, up: Tensor },
    /// A LoRA's down product `x downᵀ` [m, rank] before its scale (a narrow of a batched product may be passed
    /// as it is), and the LoRA, whose `up` and scale finish it.
    Lora { raw: Tensor, lora: &'a Lora },
}

/// `[mid | 1 | 0…]` and `[up | bias | 0…]`: the low-rank factors with the bias as one more rank column, widened
/// with zero columns to a multiple of 8 ([`Linear::finish_forward`]).
fn with_bias_column(mid: &Tensor, up: &Tensor, bias: &Tensor) -> Result<(Tensor, Tensor)> {
    let (m, rank) = mid.dims2()?;
    let n = up.dim(0)?;
    let pad = (rank + 1).next_multiple_of(8) - rank - 1;
    let (dtype, dev) = (mid.dtype(), mid.device());
    let mut left = vec![mid.clone(), Tensor::ones((m, 1), dtype, dev)?];
    let mut right = vec![up.clone(), bias.reshape((n, 1))?];
    if pad > 0 {
        left.push(Tensor::zeros((m, pad), dtype, dev)?);
        right.push(Tensor::zeros((n, pad), dtype, dev)?);
    }
    Ok((Tensor::cat(&left, 1)?, Tensor::cat(&right, 1)?))
}

/// `c + a · bᵀ` (`b_transposed`, `b` [n, k]) or `c + a · b` (`b` [k, n]) for 2-D `a` [m, k] and `c` [m, n],
/// consuming `c`: accumulated in place by cuBLAS on CUDA (one rounding, no full-size add), a matmul and an add
/// elsewhere. `c` must be a tensor the caller owns (no other live handle expects its old values).
pub fn add_matmul(c: Tensor, a: &Tensor, b: &Tensor, b_transposed: bool) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        let a = a.dense()?;
        let b = b.dense()?;
        if crate::cuda::gemm::supported(&c, &a, &b) {
            crate::cuda::gemm::add_matmul_(&c, &a, &b, b_transposed)?;
            return Ok(c);
        }
    }
    let b = if b_transposed { b.t()? } else { b.clone() };
    c + a.matmul(&b)?
}

/// `c + a · bᵀ + bias` for 2-D `a` [m, k], `b` [n, k], `c` [m, n] and a `bias` [n] in `c`'s dtype ([`add_matmul`]
/// without one), consuming `c`: on CUDA one cuBLASLt product accumulated in place with the bias added in its
/// epilogue, where it has an algorithm for the shape; otherwise the product accumulated, then the bias added
/// ([`crate::ops::add_row`]). `c` must be a tensor the caller owns.
pub fn add_matmul_bias(c: Tensor, a: &Tensor, b: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let Some(bias) = bias else {
        return add_matmul(c, a, b, true);
    };
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::gemm_bias;
        let (a, b, bias) = (a.dense()?, b.dense()?, bias.dense()?);
        if gemm_bias::supported(&c, &a, &b, &bias)
            && gemm_bias::add_matmul_bias_(&c, &a, &b, &bias)?
        {
            return Ok(c);
        }
    }
    crate::ops::add_row(&add_matmul(c, a, b, true)?, bias)
}

/// `a · bᵀ + bias` for 2-D `a` [m, k], `b` [n, k] and a `bias` [n] in `a`'s dtype (none: the product alone): on
/// CUDA one cuBLASLt product with the bias added in its epilogue where it has an algorithm for the shape;
/// otherwise the product, then the bias added ([`crate::ops::add_row`]).
pub fn matmul_bias(a: &Tensor, b: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let Some(bias) = bias else {
        return a.matmul(&b.t()?);
    };
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::gemm_bias;
        let (a, b, bias) = (a.dense()?, b.dense()?, bias.dense()?);
        if gemm_bias::product_supported(&a, &b, &bias) {
            if let Some(y) = gemm_bias::matmul_bias(&a, &b, &bias)? {
                return Ok(y);
            }
        }
    }
    crate::ops::add_row(&a.matmul(&b.t()?)?, bias)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::fp8::{quantize, Fp8Scale};
    use crate::init::randn;
    use crate::linear::BaseWeight;
    use crate::testing::rel;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn layer(fp8: bool, rng: &mut StdRng) -> Result<Linear> {
        let dev = Device::Cpu;
        let w = randn(rng, (6, 10), 0.0, 0.3, &dev)?;
        let base = if fp8 {
            BaseWeight::Fp8(quantize(&w, Fp8Scale::Tensor)?)
        } else {
            BaseWeight::Dense(w)
        };
        let mut lin = Linear::from_base(base, Some(randn(rng, 6, 0.0, 0.1, &dev)?));
        let mut lora = Lora::new([10, 6, 3], 1.5, DType::F32, &dev, rng)?;
        lora.up = Var::from_tensor(&randn(rng, (6, 3), 0.0, 0.2, &dev)?)?;
        lora.multiplier = 0.8;
        lin.set_lora(Some(lora));
        Ok(lin)
    }

    /// Forward, input gradient and LoRA gradients equal candle's autograd through [`Linear::forward`], for a
    /// dense and an FP8 base.
    #[test]
    fn untracked_forward_and_backward_match_autograd() -> Result<()> {
        let rng = &mut StdRng::seed_from_u64(3);
        for fp8 in [false, true] {
            let lin = layer(fp8, rng)?;
            let x = Var::from_tensor(&randn(rng, (2, 4, 10), 0.0, 1.0, &Device::Cpu)?)?;
            let dy = randn(rng, (2, 4, 6), 0.0, 1.0, &Device::Cpu)?;
            let y_ref = lin.forward(x.as_tensor())?;
            let store = (&y_ref * &dy)?.sum_all()?.backward()?;
            let (y, tape) = lin.forward_untracked(x.as_tensor())?;
            assert!(!y.track_op(), "the untracked forward built a graph");
            assert!(rel(&y, &y_ref)? < 1e-6);
            let (dx, params) = lin.backward(x.as_tensor(), &tape, &dy, true)?;
            let dx = dx.ok_or_else(|| candle_core::Error::msg("no input gradient"))?;
            let dx_ref = store
                .get(x.as_tensor())
                .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
            assert!(rel(&dx, dx_ref)? < 1e-6, "input gradient (fp8 {fp8})");
            assert_eq!(params.len(), 2);
            for p in &params {
                let want = store
                    .get(p.var.as_tensor())
                    .ok_or_else(|| candle_core::Error::msg("no reference LoRA gradient"))?;
                assert!(rel(&p.grad, want)? < 1e-6, "LoRA gradient (fp8 {fp8})");
            }
            let (none, again) = lin.backward(x.as_tensor(), &tape, &dy, false)?;
            assert!(none.is_none());
            assert!(rel(&again[1].grad, &params[1].grad)? == 0.0);

            // Without a LoRA: bias added directly, no parameter gradients.
            let mut plain = lin.clone();
            plain.set_lora(None);
            let (y, tape) = plain.forward_untracked(x.as_tensor())?;
            assert!(rel(&y, &plain.forward(x.as_tensor())?)? < 1e-6);
            let (dx, params) = plain.backward(x.as_tensor(), &tape, &dy, true)?;
            assert!(params.is_empty() && dx.is_some());
        }
        Ok(())
    }
}
