//! LoKr's forward and backward on a [`Linear`] without forming `ΔW = s·(w1 ⊗ w2)`: with `x` read as
//! [m, b, d] (`w1` [a, b], `w2` [c, d]), `x ΔWᵀ` is `w2` applied on the last axis and `s·w1` on the middle one,
//! giving [m, a, c] = [m, out]; the backward applies the transposes to `dy` the same way, and the factors'
//! gradients are products over the tokens: `∂w2 = Σ_{t,j} R[t,j,:]ᵀ x[t,j,:]` with `R = (s·w1)ᵀ` on `dy`'s middle
//! axis, `∂w1 = s·Σ_{t,k} dy[t,:,k] z[t,:,k]ᵀ` with `z = w2` on `x`'s last axis.

use candle_core::{DType, Result, Tensor};

use super::super::grad::{InputGrad, InputShare, LinearTape, ParamGrad};
use super::super::Linear;
use crate::adapter::{Lokr, LOKR_CHUNK_ROWS as CHUNK_ROWS};

/// A LoKr's factors as matrices in the compute dtype: `s·w1` [a, b] and `w2` [c, d].
pub(super) struct Kron {
    w1s: Tensor,
    w2: Tensor,
    /// `[a, b, c, d]`.
    dims: [usize; 4],
    /// The factors' work dtype (f32), their gradients' dtype.
    work: DType,
}

impl Kron {
    /// `lokr`'s factors (products multiplied out, scale and multiplier on `w1`), in `dtype`.
    pub(super) fn new(lokr: &Lokr, dtype: DType) -> Result<Self> {
        let (w1, w2) = lokr.dense_factors()?;
        Self::from_factors(
            lokr,
            [(&w1 * lokr.scale())?.to_dtype(dtype)?, w2.to_dtype(dtype)?],
        )
    }

    /// The factors a forward kept on its tape ([`Kron::factors`]), or `lokr`'s built again in `dtype`.
    pub(super) fn of_tape(lokr: &Lokr, tape: &LinearTape, dtype: DType) -> Result<Self> {
        match &tape.factors {
            Some(f) if f[0].dtype() == dtype => Self::from_factors(lokr, f.clone()),
            _ => Self::new(lokr, dtype),
        }
    }

    fn from_factors(lokr: &Lokr, [w1s, w2]: [Tensor; 2]) -> Result<Self> {
        let (a, b) = w1s.dims2()?;
        let (c, d) = w2.dims2()?;
        Ok(Self {
            w1s,
            w2,
            dims: [a, b, c, d],
            work: lokr.work_dtype(),
        })
    }

    /// `s·w1` and `w2` in the compute dtype, for a tape.
    pub(super) fn factors(&self) -> [Tensor; 2] {
        [self.w1s.clone(), self.w2.clone()]
    }

    /// `W + ΔW` [out, in] in the compute dtype for the frozen weight `base` (in that dtype): the Kronecker product
    /// of the factors added in one pass ([`crate::ops::add_kron`]).
    pub(super) fn merged_in(&self, base: &Tensor) -> Result<Tensor> {
        crate::ops::add_kron(base, &self.w1s, &self.w2)
    }

    /// `x ΔWᵀ` [m, out] for `x2` [m, in].
    pub(super) fn apply(&self, x2: &Tensor) -> Result<Tensor> {
        let [a, b, c, _] = self.dims;
        let m = x2.dim(0)?;
        let z = self.half(x2)?;
        self.w1s
            .broadcast_as((m, a, b))?
            .matmul(&z)?
            .reshape((m, a * c))
    }

    /// `z[t, j, k] = Σ_l x[t, j, l] w2[k, l]`, [m, b, c].
    fn half(&self, x2: &Tensor) -> Result<Tensor> {
        let [_, b, c, d] = self.dims;
        let m = x2.dim(0)?;
        x2.reshape((m * b, d))?
            .matmul(&self.w2.t()?)?
            .reshape((m, b, c))
    }

    /// `Σ_{t,k} dy[t, i, k] z[t, j, k]` [a, b] in the work dtype for `dy3` [m, a, c] (before the scale): per
    /// chunk of [`CHUNK_ROWS`] tokens, one batched product `dy_t z_tᵀ` per token ([rows, a, b]) summed over the
    /// tokens by a product with a row of ones, so nothing is copied to bring the middle axes to the front and
    /// every product has room to spread over the GPU (a single product over `(t, k)` has an output of a few
    /// thousand values and a reduction axis of a million).
    fn w1_grad(&self, x2: &Tensor, dy3: &Tensor) -> Result<Tensor> {
        let [a, b, ..] = self.dims;
        let m = x2.dim(0)?;
        let mut sum: Option<Tensor> = None;
        for start in (0..m).step_by(CHUNK_ROWS) {
            let rows = CHUNK_ROWS.min(m - start);
            let z = self.half(&x2.narrow(0, start, rows)?)?;
            let per_token = dy3
                .narrow(0, start, rows)?
                .matmul(&z.t()?)?
                .reshape((rows, a * b))?;
            let ones = Tensor::ones((1, rows), per_token.dtype(), per_token.device())?;
            let part = ones
                .matmul(&per_token)?
                .to_dtype(self.work)?
                .reshape((a, b))?;
            sum = Some(match sum {
                Some(s) => (s + part)?,
                None => part,
            });
        }
        sum.ok_or_else(|| candle_core::Error::msg("LoKr backward: no rows"))
    }
}

impl Linear {
    /// LoKr's backward through its factors for `dy2` [m, out] (the factors from the forward's `tape` when it kept
    /// them): the input gradient `dy W + R w2` as `input` says and the factors' gradients (module docs).
    pub(super) fn lokr_backward(
        &self,
        lokr: &Lokr,
        (x2, tape, dy2): (&Tensor, &LinearTape, &Tensor),
        input: InputGrad,
    ) -> Result<(Option<Tensor>, Vec<ParamGrad>)> {
        let kron = Kron::of_tape(lokr, tape, x2.dtype())?;
        let [a, b, c, d] = kron.dims;
        let m = x2.dim(0)?;
        let dy3 = dy2.reshape((m, a, c))?;
        let d_w1 = (kron.w1_grad(x2, &dy3)? * lokr.scale())?;
        // R[t, j, k] = Σ_i s·w1[i, j] dy[t, i, k], as [m·b, c].
        let r = kron
            .w1s
            .t()?
            .broadcast_as((m, b, a))?
            .matmul(&dy3)?
            .reshape((m * b, c))?;
        let d_w2 = r.t()?.matmul(&x2.reshape((m * b, d))?)?;
        let params = lokr.factor_backward(&d_w1, &d_w2.to_dtype(kron.work)?)?;
        let share = InputShare {
            t: r,
            down: kron.w2,
        };
        let dx = self.input_grad(dy2, Some(share), input)?;
        Ok((dx, params))
    }
}
