//! Differentiable normalisations (RMSNorm, LayerNorm) written as compositions of candle ops that all have a
//! backward: candle's fused `ops::rms_norm` / `layer_norm` return no gradient. Statistics are computed in f32 and
//! the result cast back, as the official Wan code does. With the `cuda` feature, f32 / bf16 CUDA tensors run the
//! fused kernels of [`crate::cuda::norm`] (autograd-capable custom ops with the same numerics).

use candle_core::{DType, Result, Tensor, D};

use crate::vb::Vb;

mod grad;
pub use grad::{layer_norm_backward, rms_norm_backward};

/// Whether the fused CUDA kernels take `xs` (the condition [`crate::cuda::norm`] checks before falling back).
#[cfg(feature = "cuda")]
fn on_cuda_kernel(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16) && xs.rank() > 0
}

/// `x * rsqrt(mean(x²) + eps) * weight` over the last dimension, computed in f32, returned in `xs`' dtype.
/// Differentiable; CUDA f32 / bf16 tensors run the fused kernel, everything else [`rms_norm_portable`].
pub fn rms_norm(xs: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_cuda_kernel(xs) {
        return crate::cuda::norm::rms_norm(xs, weight, eps);
    }
    rms_norm_portable(xs, weight, eps)
}

/// [`rms_norm`] as a composition of candle ops, on any device (the CPU path and the CUDA kernel's reference).
pub fn rms_norm_portable(xs: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let dtype = xs.dtype();
    let x = xs.to_dtype(DType::F32)?;
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x.broadcast_div(&(ms + eps)?.sqrt()?)?.to_dtype(dtype)?;
    match weight {
        Some(w) => normed.broadcast_mul(&w.to_dtype(dtype)?),
        None => Ok(normed),
    }
}

/// LayerNorm over the last dimension in f32 with optional affine parameters, returned in `xs`' dtype.
/// Differentiable; CUDA f32 / bf16 tensors run the fused kernel, everything else [`layer_norm_portable`].
pub fn layer_norm(
    xs: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_cuda_kernel(xs) {
        return crate::cuda::norm::layer_norm(xs, weight, bias, eps);
    }
    layer_norm_portable(xs, weight, bias, eps)
}

/// [`layer_norm`] as a composition of candle ops, on any device (the CPU path and the CUDA kernel's reference).
pub fn layer_norm_portable(
    xs: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let dtype = xs.dtype();
    let x = xs.to_dtype(DType::F32)?;
    let mean = x.mean_keepdim(D::Minus1)?;
    let centred = x.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    let mut out = centred.broadcast_div(&(var + eps)?.sqrt()?)?;
    if let Some(w) = weight {
        out = out.broadcast_mul(&w.to_dtype(DType::F32)?)?;
    }
    if let Some(b) = bias {
        out = out.broadcast_add(&b.to_dtype(DType::F32)?)?;
    }
    out.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::randn;
    use candle_core::{Device, Var};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn norms_have_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(23);
        let x = Var::from_tensor(&randn(rng, (3, 8), 0.0, 1.0, &dev)?)?;
        let w = randn(rng, 8, 1.0, 0.1, &dev)?;
        let probe = randn(rng, (3, 8), 0.0, 1.0, &dev)?;
        for y in [
            rms_norm(x.as_tensor(), Some(&w), 1e-6)?,
            layer_norm(x.as_tensor(), Some(&w), Some(&w), 1e-6)?,
        ] {
            let grads = (y * &probe)?.sum_all()?.backward()?;
            let g = grads.get(x.as_tensor()).map(|g| g.abs()).transpose()?;
            let total = g
                .map(|g| g.sum_all()?.to_scalar::<f32>())
                .transpose()?
                .unwrap_or(0.0);
            assert!(total > 0.0, "input gradient missing");
        }
        Ok(())
    }
}

/// A LayerNorm with its affine `weight` and `bias` [dim] (PyTorch's `nn.LayerNorm`), read from a checkpoint.
#[derive(Clone)]
pub struct AffineNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl AffineNorm {
    /// Reads `weight` and `bias` [dim] under `vb`.
    pub fn new(dim: usize, eps: f64, vb: &Vb) -> Result<Self> {
        Ok(Self {
            weight: vb.get(dim, "weight")?,
            bias: vb.get(dim, "bias")?,
            eps,
        })
    }

    /// `xs` [..., dim] normalised over its last dim, scaled and shifted.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        layer_norm(xs, Some(&self.weight), Some(&self.bias), self.eps)
    }
}
