//! Backward of the block's element-wise steps, outside autograd: the CUDA kernels' `*_backward` functions on
//! f32 / bf16 CUDA tensors, the same math written with candle ops elsewhere (the dispatch the forward in
//! `block.rs` makes).

use candle_core::{DType, Result, Tensor};

use crate::wan::rope::Rope;

#[cfg(feature = "cuda")]
fn on_kernel(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16)
}

/// `xs` in `dtype`; the vectorised f32 ↔ bf16 kernel on CUDA (candle's bf16 → f32 cast is five times slower).
pub(super) fn cast(xs: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) {
        return framesmith_nn::cuda::mixed::cast(xs, dtype);
    }
    xs.to_dtype(dtype)
}

/// `x * (1 + scale) + shift` computed in f32 (`x` cast to f32 first), returned in `dtype` (the casts fused in
/// on CUDA).
pub(super) fn modulate_to(
    x: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    dtype: DType,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(x) {
        return framesmith_nn::cuda::mixed::modulate_to(x, scale, shift, dtype);
    }
    super::super::modulate_f32(&x.to_dtype(DType::F32)?, scale, shift)?.to_dtype(dtype)
}

/// The residual `x + y` computed in f32 and returned in `x`'s dtype (the residual dtype), `y` in any float
/// dtype: on CUDA the gated-residual kernel with a unit gate (exactly the same arithmetic), no cast of `y`.
pub(super) fn residual_add(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(x) && on_kernel(y) {
        let (b, dim) = (x.dim(0)?, x.dim(candle_core::D::Minus1)?);
        let ones = Tensor::ones((b, 1, dim), DType::F32, x.device())?;
        return framesmith_nn::cuda::mixed::gated_residual_mixed(x, y, &ones);
    }
    (x.to_dtype(DType::F32)? + y.to_dtype(DType::F32)?)?.to_dtype(x.dtype())
}

/// Input gradient of `x * (1 + scale) + shift`: `dy * (1 + scale)` computed in f32, returned in `dtype`.
pub(super) fn modulate_backward(dy: &Tensor, scale: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dy) {
        return framesmith_nn::cuda::mixed::scaled_to(dy, scale, 1.0, dtype);
    }
    dy.to_dtype(DType::F32)?
        .broadcast_mul(&(scale + 1.0)?)?
        .to_dtype(dtype)
}

/// Gradient of the branch `y` of the gated residual `x + y · gate` for the residual gradient `dout`:
/// `dout · gate` computed in f32, returned in `dtype` (the branch's dtype).
pub(super) fn gate_backward(dout: &Tensor, gate: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dout) {
        return framesmith_nn::cuda::mixed::scaled_to(dout, gate, 0.0, dtype);
    }
    dout.to_dtype(DType::F32)?
        .broadcast_mul(gate)?
        .to_dtype(dtype)
}

/// Input gradient of GELU-tanh at `xs` for the output gradient `dy`, in `xs`' dtype:
/// `0.5 (1 + t) + 0.5 x (1 − t²) √(2/π) (1 + 3 · 0.044715 x²)` with `t = tanh(√(2/π) (x + 0.044715 x³))`.
pub(super) fn gelu_tanh_backward(xs: &Tensor, dy: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) {
        return framesmith_nn::cuda::elementwise::gelu_tanh_backward(xs, dy);
    }
    const C: f64 = 0.044_715;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let x = xs.to_dtype(DType::F32)?;
    let x2 = x.sqr()?;
    let t = ((&x + (&x * &x2)? * C)? * k)?.tanh()?;
    let left = ((&t + 1.0)? * 0.5)?;
    let right = ((&x * (t.sqr()?.neg()? + 1.0)?)? * ((x2 * (3.0 * C))? + 1.0)?)? * (0.5 * k);
    ((left + right)? * dy.to_dtype(DType::F32)?)?.to_dtype(xs.dtype())
}

/// Input gradient of [`Rope::apply`]: `dy` rotated by the negative angles.
pub(super) fn rope_backward(rope: &Rope, dy: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dy) {
        return framesmith_nn::cuda::rope::rope_backward(dy, &rope.cos, &rope.sin);
    }
    let inverse = Rope {
        cos: rope.cos.clone(),
        sin: rope.sin.neg()?,
    };
    inverse.apply(dy)
}

#[cfg(test)]
mod tests {
    use framesmith_nn::init::randn;
    use candle_core::{Device, Var};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use framesmith_nn::testing::rel;

    fn grad_of(x: &Var, y: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let store = (y * dy)?.sum_all()?.backward()?;
        store
            .get(x.as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::msg("no reference gradient"))
    }

    /// Each backward equals candle's autograd through the forward composition, per-sample and per-token
    /// modulation, and RoPE with padded rows.
    #[test]
    fn elementwise_backwards_match_autograd() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(41);
        let x = Var::from_tensor(&randn(rng, (2, 6, 8), 0.0, 1.5, &dev)?)?;
        let dy = randn(rng, (2, 6, 8), 0.0, 1.0, &dev)?;
        for tokens in [1, 6] {
            let scale = randn(rng, (2, tokens, 8), 0.0, 0.3, &dev)?;
            let shift = randn(rng, (2, tokens, 8), 0.0, 0.3, &dev)?;
            let y = x
                .as_tensor()
                .broadcast_mul(&(&scale + 1.0)?)?
                .broadcast_add(&shift)?;
            let want = grad_of(&x, &y, &dy)?;
            assert!(rel(&modulate_backward(&dy, &scale, DType::F32)?, &want)? < 1e-6);
            let y = x.as_tensor().broadcast_mul(&scale)?;
            let want = grad_of(&x, &y, &dy)?;
            assert!(rel(&gate_backward(&dy, &scale, DType::F32)?, &want)? < 1e-6);
        }
        let want = grad_of(&x, &x.as_tensor().gelu()?, &dy)?;
        let r = rel(&gelu_tanh_backward(x.as_tensor(), &dy)?, &want)?;
        assert!(r < 1e-5, "gelu rel {r}");

        let rope = Rope::new(&[[2, 2, 3], [1, 2, 2]], 12, 16, DType::F32, &dev)?;
        let q = Var::from_tensor(&randn(rng, (2, 12, 2, 16), 0.0, 1.0, &dev)?)?;
        let dq = randn(rng, (2, 12, 2, 16), 0.0, 1.0, &dev)?;
        let want = grad_of(&q, &rope.apply(q.as_tensor())?, &dq)?;
        assert!(rel(&rope_backward(&rope, &dq)?, &want)? < 1e-6);
        Ok(())
    }
}
