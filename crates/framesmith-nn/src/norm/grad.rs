//! Input gradients of [`super::rms_norm`] and [`super::layer_norm`] outside autograd, for hand-written backward
//! passes: the fused CUDA kernels on f32 / bf16 CUDA tensors, the same math written with candle ops elsewhere.
//! Statistics and arithmetic in f32; the result in the input's dtype, as the forward's is.

use candle_core::{DType, Result, Tensor, D};

/// `x` in f32 and its per-row `rsqrt(mean(x²) + eps)`, or for LayerNorm the centred `x` and
/// `rsqrt(var + eps)`: the forward's statistics, recomputed.
fn stats(x: &Tensor, centre: bool, eps: f64) -> Result<(Tensor, Tensor)> {
    let x = x.to_dtype(DType::F32)?;
    let x = if centre {
        x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?
    } else {
        x
    };
    let rstd = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    Ok((x, rstd))
}

/// `dy · weight` in f32 (the gradient of the normalised value).
fn weighted(dy: &Tensor, weight: Option<&Tensor>) -> Result<Tensor> {
    let dy = dy.to_dtype(DType::F32)?;
    match weight {
        Some(w) => dy.broadcast_mul(&w.to_dtype(DType::F32)?),
        None => Ok(dy),
    }
}

/// Input gradient of [`super::rms_norm`] for the output gradient `dy`:
/// `rstd · (g − x̂ · mean(g · x̂))` with `g = dy · weight`, `x̂ = x · rstd`.
pub fn rms_norm_backward(
    xs: &Tensor,
    weight: Option<&Tensor>,
    dy: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_cuda_kernel(xs) {
        return crate::cuda::norm::rms_norm_backward(xs, weight, dy, eps);
    }
    let (x, rstd) = stats(xs, false, eps)?;
    let g = weighted(dy, weight)?;
    let xhat = x.broadcast_mul(&rstd)?;
    let proj = (&g * &xhat)?.mean_keepdim(D::Minus1)?;
    (g - xhat.broadcast_mul(&proj)?)?
        .broadcast_mul(&rstd)?
        .to_dtype(xs.dtype())
}

/// Input gradient of [`super::layer_norm`] (weight optional; the bias does not enter it) for the output gradient
/// `dy`: `rstd · (g − mean(g) − x̂ · mean(g · x̂))` with `g = dy · weight`, `x̂ = (x − mean) · rstd`.
pub fn layer_norm_backward(
    xs: &Tensor,
    weight: Option<&Tensor>,
    dy: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_cuda_kernel(xs) {
        return crate::cuda::norm::layer_norm_backward(xs, weight, dy, eps);
    }
    let (centred, rstd) = stats(xs, true, eps)?;
    let g = weighted(dy, weight)?;
    let xhat = centred.broadcast_mul(&rstd)?;
    let proj = (&g * &xhat)?.mean_keepdim(D::Minus1)?;
    let g = g.broadcast_sub(&g.mean_keepdim(D::Minus1)?)?;
    (g - xhat.broadcast_mul(&proj)?)?
        .broadcast_mul(&rstd)?
        .to_dtype(xs.dtype())
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::super::{layer_norm, rms_norm};
    use super::*;
    use crate::init::randn;
    use crate::testing::rel;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Each backward equals candle's autograd through the differentiable forward, with and without weight.
    #[test]
    fn norm_backwards_match_autograd() -> Result<()> {
        let dev = Device::Cpu;
        let rng = &mut StdRng::seed_from_u64(19);
        let x = Var::from_tensor(&(randn(rng, (2, 3, 16), 0.0, 1.0, &dev)? + 0.3)?)?;
        let w = randn(rng, 16, 1.0, 0.2, &dev)?;
        let b = randn(rng, 16, 0.0, 0.2, &dev)?;
        let dy = randn(rng, (2, 3, 16), 0.0, 1.0, &dev)?;
        for weight in [None, Some(&w)] {
            let cases = [
                (rms_norm(x.as_tensor(), weight, 1e-6)?, true),
                (layer_norm(x.as_tensor(), weight, Some(&b), 1e-5)?, false),
            ];
            for (y, rms) in cases {
                let store = (y * &dy)?.sum_all()?.backward()?;
                let want = store
                    .get(x.as_tensor())
                    .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
                let got = if rms {
                    rms_norm_backward(x.as_tensor(), weight, &dy, 1e-6)?
                } else {
                    layer_norm_backward(x.as_tensor(), weight, &dy, 1e-5)?
                };
                let r = rel(&got, want)?;
                assert!(r < 1e-5, "rms {rms}, weight {}: rel {r}", weight.is_some());
            }
        }
        Ok(())
    }
}
