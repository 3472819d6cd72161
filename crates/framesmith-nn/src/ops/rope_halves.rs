//! RoPE in the rotate-half layout with one table per head (LTX-2's video and audio attentions): each head's
//! first half rotates against its second, `y₁ = x₁ cos − x₂ sin`, `y₂ = x₂ cos + x₁ sin`, with tables
//! [b, l, heads, d/2] in the activations' dtype, each product and the sum rounded to it (as `x · [cos | cos] +
//! swap_halves(x) · [−sin | sin]` computes them). The RMSNorm before it and the rotation run as one kernel on
//! CUDA ([`crate::cuda::rms_rope`]); elsewhere, and under autograd, the candle ops.

use candle_core::{Result, Tensor, D};

/// `xs` [b, l, heads, d] rotated by `cos`, `sin` [b, l, heads, d/2] (cast to `xs`' dtype); differentiable.
pub fn rope_halves(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (x1, x2, cos, sin) = halves(xs, cos, sin)?;
    let y1 = (x1.mul(&cos)? - x2.mul(&sin)?)?;
    let y2 = (x2.mul(&cos)? + x1.mul(&sin)?)?;
    Tensor::cat(&[y1, y2], D::Minus1)
}

/// Input gradient of [`rope_halves`] (the transposed rotation): `d₁ = dy₁ cos + dy₂ sin`, `d₂ = dy₂ cos − dy₁ sin`,
/// rounded as `dy · [cos | cos] + swap_halves(dy · [−sin | sin])` computes them.
pub fn rope_halves_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (g1, g2, cos, sin) = halves(dy, cos, sin)?;
    let d1 = (g1.mul(&cos)? + g2.mul(&sin)?)?;
    let d2 = (g2.mul(&cos)? - g1.mul(&sin)?)?;
    Tensor::cat(&[d1, d2], D::Minus1)
}

/// Each head's halves of `xs` [b, l, heads, d] and the tables in its dtype.
fn halves(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let d = xs.dim(D::Minus1)?;
    if d % 2 != 0 || cos.dims() != sin.dims() || cos.dim(D::Minus1)? * 2 != d {
        candle_core::bail!(
            "rotate-half RoPE: heads {:?}, tables {:?} / {:?} (want [.., head width / 2])",
            xs.dims(),
            cos.dims(),
            sin.dims()
        );
    }
    Ok((
        xs.narrow(D::Minus1, 0, d / 2)?,
        xs.narrow(D::Minus1, d / 2, d / 2)?,
        cos.to_dtype(xs.dtype())?,
        sin.to_dtype(xs.dtype())?,
    ))
}

/// `rope_halves(rms_norm(x, weight))` with `x` [b, l, heads · d] split into heads first: [b, l, heads, d]. On
/// CUDA one kernel (no gradient) with the ops' arithmetic and roundings, elsewhere the ops.
pub fn rms_norm_rope_halves(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::rms_rope::applies(x) && !super::tracked(&[x, weight]) {
        return crate::cuda::rms_rope::rms_norm_rope_halves(x, weight, eps, heads, cos, sin);
    }
    let (b, l, cols) = x.dims3()?;
    let normed = crate::norm::rms_norm(x, Some(weight), eps)?;
    rope_halves(&normed.reshape((b, l, heads, cols / heads))?, cos, sin)
}

/// Input gradient of [`rms_norm_rope_halves`] for the rotated heads' gradient `dy` [b, l, heads, d]: `x`'s
/// [b, l, heads · d], outside autograd. On CUDA one kernel, elsewhere [`rope_halves_backward`] then
/// [`crate::norm::rms_norm_backward`].
pub fn rms_norm_rope_halves_backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::rms_rope::applies(x) {
        return crate::cuda::rms_rope::rms_norm_rope_halves_backward(x, weight, dy, eps, cos, sin);
    }
    let d = rope_halves_backward(dy, cos, sin)?.flatten_from(2)?;
    crate::norm::rms_norm_backward(x, Some(weight), &d, eps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};
    use rand::SeedableRng;

    /// The rotation equals the full-width form it replaces (`x · [cos | cos] + swap_halves(x) · [−sin | sin]`)
    /// exactly in bf16, and the fused pair's backward equals candle's autograd through the ops.
    #[test]
    fn rotation_and_backward_match_their_references() -> Result<()> {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(9);
        let dev = Device::Cpu;
        let (b, l, heads, d) = (2, 3, 2, 8);
        let angles = crate::init::randn(rng, (b, l, heads, d / 2), 0.0, 2.0, &dev)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let xs =
            crate::init::randn(rng, (b, l, heads, d), 0.0, 1.0, &dev)?.to_dtype(DType::BF16)?;
        let full_cos = Tensor::cat(&[&cos, &cos], 3)?.to_dtype(DType::BF16)?;
        let full_sin = Tensor::cat(&[&sin.neg()?, &sin], 3)?.to_dtype(DType::BF16)?;
        let swapped = Tensor::cat(&[xs.narrow(3, d / 2, d / 2)?, xs.narrow(3, 0, d / 2)?], 3)?;
        let want = (xs.mul(&full_cos)? + swapped.mul(&full_sin)?)?;
        let got = rope_halves(
            &xs,
            &cos.to_dtype(DType::BF16)?,
            &sin.to_dtype(DType::BF16)?,
        )?;
        let diff = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);

        let x = Var::from_tensor(&crate::init::randn(rng, (b, l, heads * d), 0.2, 1.0, &dev)?)?;
        let w = crate::init::randn(rng, heads * d, 1.0, 0.2, &dev)?;
        let dy = crate::init::randn(rng, (b, l, heads, d), 0.0, 1.0, &dev)?;
        let y = rms_norm_rope_halves(x.as_tensor(), &w, 1e-6, heads, &cos, &sin)?;
        let store = (&y * &dy)?.sum_all()?.backward()?;
        let want = store
            .get(x.as_tensor())
            .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
        let got = rms_norm_rope_halves_backward(x.as_tensor(), &w, &dy, 1e-6, &cos, &sin)?;
        assert!(crate::testing::rel(&got, want)? < 1e-5);
        Ok(())
    }
}
