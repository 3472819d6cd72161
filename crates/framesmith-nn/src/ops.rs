//! Element-wise steps of the transformer blocks and their backward, each on the fused CUDA kernel for CUDA
//! tensors and written with candle ops elsewhere: models call these, never `crate::cuda` directly, so every
//! CUDA dispatch lives here.

use candle_core::{DType, Result, Tensor, D};

/// `x * (1 + scale) + shift` for an f32 `x` with f32 modulation vectors; the fused kernel on CUDA (same f32
/// arithmetic, one pass instead of four).
pub fn modulate(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return crate::cuda::modulate(x, scale, shift);
    }
    x.broadcast_mul(&(scale + 1.0)?)?.broadcast_add(shift)
}

/// The gated residual `x + y · gate` in f32, returned in `residual`; the fused kernel on CUDA when `x` is
/// already in `residual` (it computes in f32 and keeps `x`'s dtype).
pub fn gated_residual(x: &Tensor, y: &Tensor, gate: &Tensor, residual: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && x.dtype() == residual {
        // Outside autograd, the kernel that reads a bf16 branch directly (no cast of `y` to f32 first).
        if !(x.track_op() || y.track_op() || gate.track_op()) {
            return crate::cuda::mixed::gated_residual_mixed(x, y, gate);
        }
        return crate::cuda::gated_residual(x, y, gate);
    }
    let update = y.to_dtype(DType::F32)?.broadcast_mul(gate)?;
    (x.to_dtype(DType::F32)? + update)?.to_dtype(residual)
}

/// GELU with the tanh approximation (candle's `gelu`); the fused kernel on CUDA.
pub fn gelu_tanh(xs: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if xs.device().is_cuda() {
        return crate::cuda::gelu_tanh(xs);
    }
    xs.gelu()
}

#[cfg(feature = "cuda")]
fn on_kernel(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16)
}

/// `xs` in `dtype`; the vectorised f32 ↔ bf16 kernel on CUDA (candle's bf16 → f32 cast is five times slower).
pub fn cast(xs: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) {
        return crate::cuda::mixed::cast(xs, dtype);
    }
    xs.to_dtype(dtype)
}

/// `x * (1 + scale) + shift` computed in f32 (`x` cast to f32 first), returned in `dtype` (the casts fused in
/// on CUDA).
pub fn modulate_to(x: &Tensor, scale: &Tensor, shift: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(x) {
        return crate::cuda::mixed::modulate_to(x, scale, shift, dtype);
    }
    modulate(&x.to_dtype(DType::F32)?, scale, shift)?.to_dtype(dtype)
}

/// The residual `x + y` computed in f32 and returned in `x`'s dtype (the residual dtype), `y` in any float
/// dtype: on CUDA the gated-residual kernel with a unit gate (exactly the same arithmetic), no cast of `y`.
pub fn residual_add(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(x) && on_kernel(y) {
        let (b, dim) = (x.dim(0)?, x.dim(candle_core::D::Minus1)?);
        let ones = Tensor::ones((b, 1, dim), DType::F32, x.device())?;
        return crate::cuda::mixed::gated_residual_mixed(x, y, &ones);
    }
    (x.to_dtype(DType::F32)? + y.to_dtype(DType::F32)?)?.to_dtype(x.dtype())
}

/// Input gradient of `x * (1 + scale) + shift`: `dy * (1 + scale)` computed in f32, returned in `dtype`.
pub fn modulate_backward(dy: &Tensor, scale: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dy) {
        return crate::cuda::mixed::scaled_to(dy, scale, 1.0, dtype);
    }
    dy.to_dtype(DType::F32)?
        .broadcast_mul(&(scale + 1.0)?)?
        .to_dtype(dtype)
}

/// Gradient of the branch `y` of the gated residual `x + y · gate` for the residual gradient `dout`:
/// `dout · gate` computed in f32, returned in `dtype` (the branch's dtype).
pub fn gate_backward(dout: &Tensor, gate: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dout) {
        return crate::cuda::mixed::scaled_to(dout, gate, 0.0, dtype);
    }
    dout.to_dtype(DType::F32)?
        .broadcast_mul(gate)?
        .to_dtype(dtype)
}

/// Input gradient of GELU-tanh at `xs` for the output gradient `dy`, in `xs`' dtype:
/// `0.5 (1 + t) + 0.5 x (1 − t²) √(2/π) (1 + 3 · 0.044715 x²)` with `t = tanh(√(2/π) (x + 0.044715 x³))`.
pub fn gelu_tanh_backward(xs: &Tensor, dy: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) {
        return crate::cuda::elementwise::gelu_tanh_backward(xs, dy);
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

/// Rotates `xs` [b, seq_len, heads, head_dim] pairwise (adjacent elements form a complex number) by the angles
/// whose cosines and sines are `cos` and `sin` [b, seq_len, 1, head_dim / 2]. Differentiable off CUDA (built from
/// ops that all have a backward); on CUDA the fused kernel rotates in f32 in one pass.
pub fn rope_apply(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16) {
        return crate::cuda::rope_apply(xs, cos, sin);
    }
    let (b, l, h, d) = xs.dims4()?;
    let pairs = xs.reshape((b, l, h, d / 2, 2))?;
    let re = pairs.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
    let im = pairs.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
    let cos = cos.to_dtype(xs.dtype())?;
    let sin = sin.to_dtype(xs.dtype())?;
    let out_re = (re.broadcast_mul(&cos)? - im.broadcast_mul(&sin)?)?;
    let out_im = (re.broadcast_mul(&sin)? + im.broadcast_mul(&cos)?)?;
    Tensor::stack(&[out_re, out_im], D::Minus1)?.reshape((b, l, h, d))
}

/// Input gradient of [`rope_apply`]: `dy` rotated by the negative angles.
pub fn rope_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dy) {
        return crate::cuda::rope::rope_backward(dy, cos, sin);
    }
    rope_apply(dy, cos, &sin.neg()?)
}

/// Softmax over the last dimension: candle's fused kernel on the GPU (built with this crate's `cuda` feature;
/// without it candle has only the CPU version, and the encoders' attention failed on a CUDA device) and on the CPU.
pub fn softmax_last_dim(xs: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax_last_dim(xs)
}
