//! Device checks of RMSNorm fused with RoPE (`nn::cuda::rms_rope`): forward and backward against the separate
//! device kernels they replace (the same arithmetic: equal up to a rare last-bit difference) and against the f32
//! CPU composition (candle's autograd for the backward), f32 and bf16, vectorised rows and the one-value path.

use candle_core::{DType, Device, Result, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, tol, CheckOutcome};
use crate::cuda::rms_rope;

/// Every fused RMSNorm + RoPE check.
pub fn rms_rope_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(117);
    let eps = 1e-6;
    let mut out = Vec::new();
    // [b, l, heads, head_dim]: 16-byte rows, and rows that take the one-value path in both dtypes.
    for [b, l, heads, d] in [[2, 37, 4, 64], [1, 5, 3, 6]] {
        let cols = heads * d;
        let angles = randn(rng, &[b, l, 1, d / 2], 0.0, 3.0, DType::F32)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let (cg, sg) = (cos.to_device(dev)?, sin.to_device(dev)?);
        for dtype in [DType::F32, DType::BF16] {
            let label = format!("[{b}, {l}, {heads}x{d}] {dtype:?}");
            let x = randn(rng, &[b, l, cols], 0.3, 2.0, dtype)?;
            let w = randn(rng, &[cols], 1.0, 0.2, dtype)?;
            let dy = randn(rng, &[b, l, heads, d], 0.0, 1.0, dtype)?;
            let (xg, wg, dyg) = (x.to_device(dev)?, w.to_device(dev)?, dy.to_device(dev)?);
            let same = if dtype == DType::BF16 { 1e-3 } else { 1e-6 };

            poison(dev)?;
            let fused = rms_rope::rms_norm_rope(&xg, &wg, eps, heads, &cg, &sg)?;
            let normed = crate::cuda::norm::rms_norm(&xg, Some(&wg), eps)?;
            let separate =
                crate::cuda::rope::rope_apply(&normed.reshape((b, l, heads, d))?, &cg, &sg)?;
            out.push(compare(
                format!("rms_norm_rope vs separate ops {label}"),
                &fused,
                &separate,
                same,
            )?);

            // The CPU reference in f32, with autograd for the backward.
            let xv = Var::from_tensor(&x.to_dtype(DType::F32)?)?;
            let wf = w.to_dtype(DType::F32)?;
            let normed = crate::norm::rms_norm_portable(xv.as_tensor(), Some(&wf), eps)?;
            let want =
                crate::cuda::rope::rope_reference(&normed.reshape((b, l, heads, d))?, &cos, &sin)?;
            out.push(compare(
                format!("rms_norm_rope vs CPU {label}"),
                &fused,
                &want,
                tol(dtype, 1e-5),
            )?);

            poison(dev)?;
            let fused = rms_rope::rms_norm_rope_backward(&xg, &wg, &dyg, eps, &cg, &sg)?;
            let d_normed = crate::cuda::rope::rope_backward(&dyg, &cg, &sg)?.flatten_from(2)?;
            let separate = crate::cuda::norm::rms_norm_backward(&xg, Some(&wg), &d_normed, eps)?;
            out.push(compare(
                format!("rms_norm_rope backward vs separate ops {label}"),
                &fused,
                &separate,
                same,
            )?);
            let store = (want * dy.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
            let want = store
                .get(xv.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg("no reference gradient".into()))?;
            out.push(compare(
                format!("rms_norm_rope backward vs CPU {label}"),
                &fused,
                want,
                tol(dtype, 1e-4),
            )?);
        }
    }
    Ok(out)
}
