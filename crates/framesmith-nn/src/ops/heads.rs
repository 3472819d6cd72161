//! Per-head gates of an attention's output (LTX-2.3's gated attention: each head times `2·sigmoid` of its own
//! logit per token) and their backward. On CUDA outside autograd one pass each ([`crate::cuda::head_gate`]);
//! elsewhere, and under autograd, the gates spread over the head width by a rank-1 product (exact in any dtype)
//! and dense products: candle's broadcast multiply computes a strided index per value and ran at a tenth of a
//! dense pass on the GPU.

use candle_core::{Result, Tensor, D};

/// Each head of `xs` [b, l, heads, d] times its gate of `gates` [b, l, heads] (in `xs`' dtype, the product
/// rounded to it). Differentiable off the kernel.
pub fn head_gate(xs: &Tensor, gates: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::head_gate::applies(xs) && !super::tracked(&[xs, gates]) {
        return crate::cuda::head_gate::head_gate(xs, gates);
    }
    xs.mul(&per_value(
        &gates.to_dtype(xs.dtype())?,
        xs.dim(D::Minus1)?,
    )?)
}

/// The per-head gates `2·sigmoid(logits)` of LTX-2.3's gated attention, computed as
/// `(exp(−logits) + 1)⁻¹ · 2` in the logits' dtype, each step rounded to it: one pass on CUDA outside autograd
/// (the same values bit for bit), candle's ops elsewhere (differentiable).
pub fn sigmoid_gates(logits: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::head_gate::applies(logits) && !super::tracked(&[logits]) {
        return crate::cuda::head_gate::sigmoid_gates(logits);
    }
    (logits.neg()?.exp()? + 1.0)?.recip()? * 2.0
}

/// The logits' gradient of [`sigmoid_gates`] from the gates `g` and their gradient `dg`, outside autograd:
/// `dg/dz = 2σ(1 − σ) = g · (1 − g/2)`, as `(dg · g) · (1 − g · 0.5)` in `g`'s dtype, each step rounded to it
/// (one pass on CUDA, the same values).
pub fn sigmoid_gates_backward(dg: &Tensor, g: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::head_gate::applies(g) {
        return crate::cuda::head_gate::sigmoid_gates_backward(dg, g);
    }
    let dg = dg.to_dtype(g.dtype())?;
    (dg * g)? * (1.0 - (g * 0.5)?)?
}

/// The backward of [`head_gate`] at `xs` for its output gradient `dy`, outside autograd: `xs`' gradient
/// `dy · gate` and the gates' `Σ_d dy · xs` [b, l, heads] (the products rounded to `xs`' dtype, summed in f32),
/// both in `xs`' dtype.
pub fn head_gate_backward(dy: &Tensor, xs: &Tensor, gates: &Tensor) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if crate::cuda::head_gate::applies(xs) {
        return crate::cuda::head_gate::head_gate_backward(dy, xs, gates);
    }
    let dy = dy.to_dtype(xs.dtype())?;
    Ok((head_gate(&dy, gates)?, head_sums(&(&dy * xs)?)?))
}

/// `gates` [b, l, heads] repeated over `d` values: [b, l, heads, d], dense (`gates · 1ᵀ`, exact in any dtype).
fn per_value(gates: &Tensor, d: usize) -> Result<Tensor> {
    let (b, l, heads) = gates.dims3()?;
    let ones = Tensor::ones((1, d), gates.dtype(), gates.device())?;
    gates
        .reshape((b * l * heads, 1))?
        .matmul(&ones)?
        .reshape((b, l, heads, d))
}

/// The sums over each head's values of `xs` [b, l, heads, d]: [b, l, heads], as a product with a ones vector
/// (f32 accumulation, a matrix-vector product instead of candle's slower last-dimension sum).
fn head_sums(xs: &Tensor) -> Result<Tensor> {
    let (b, l, heads, d) = xs.dims4()?;
    let ones = Tensor::ones((d, 1), xs.dtype(), xs.device())?;
    xs.reshape((b * l * heads, d))?
        .matmul(&ones)?
        .reshape((b, l, heads))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};
    use rand::SeedableRng;

    /// The gates are 2·sigmoid of their logits, and their logits' gradient is autograd's through them.
    #[test]
    fn sigmoid_gates_and_their_gradient_match_autograd() -> Result<()> {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(13);
        let dev = Device::Cpu;
        let z = Var::from_tensor(&crate::init::randn(rng, (2, 3, 4), 0.0, 2.0, &dev)?)?;
        let g = sigmoid_gates(z.as_tensor())?;
        let want = (candle_nn_sigmoid(z.as_tensor())? * 2.0)?;
        assert!(crate::testing::rel(&g, &want)? < 1e-6);
        let dg = crate::init::randn(rng, (2, 3, 4), 0.0, 1.0, &dev)?;
        let store = (&g * &dg)?.sum_all()?.backward()?;
        let want = store
            .get(z.as_tensor())
            .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
        let got = sigmoid_gates_backward(&dg, &g.detach())?;
        assert!(crate::testing::rel(&got, want)? < 1e-6);
        Ok(())
    }

    /// sigmoid(z) = 1 / (1 + e^−z) elementwise, in f64 for the reference.
    fn candle_nn_sigmoid(z: &Tensor) -> Result<Tensor> {
        let v: Vec<f32> = z.flatten_all()?.to_vec1()?;
        let s: Vec<f32> = v
            .iter()
            .map(|&x| (1.0 / (1.0 + (-(x as f64)).exp())) as f32)
            .collect();
        Tensor::from_vec(s, z.shape(), z.device())
    }

    /// The backward equals candle's autograd through the gate's product, for the heads and the gates.
    #[test]
    fn head_gate_backward_matches_autograd() -> Result<()> {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(12);
        let dev = Device::Cpu;
        let (b, l, heads, d) = (2, 3, 4, 6);
        let xs = Var::from_tensor(&crate::init::randn(rng, (b, l, heads, d), 0.0, 1.0, &dev)?)?;
        let gates = Var::from_tensor(&crate::init::randn(rng, (b, l, heads), 1.0, 0.5, &dev)?)?;
        let dy = crate::init::randn(rng, (b, l, heads, d), 0.0, 1.0, &dev)?;
        let y = head_gate(xs.as_tensor(), gates.as_tensor())?;
        let want_y = xs
            .as_tensor()
            .broadcast_mul(&gates.as_tensor().unsqueeze(3)?)?;
        assert!(crate::testing::rel(&y, &want_y)? < 1e-7);
        let store = (y * &dy)?.sum_all()?.backward()?;
        let (dx, dg) = head_gate_backward(&dy, xs.as_tensor(), gates.as_tensor())?;
        for (got, var) in [(&dx, &xs), (&dg, &gates)] {
            let want = store
                .get(var.as_tensor())
                .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
            assert!(crate::testing::rel(got, want)? < 1e-6);
        }
        assert_eq!(dg.dtype(), DType::F32);
        Ok(())
    }
}
