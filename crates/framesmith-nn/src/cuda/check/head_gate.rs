//! Device checks of the per-head gates (`nn::cuda::head_gate`): forward and backward against the composition of
//! device ops they replace (rank-1 spread and dense products; equal up to a rare last-bit difference in the
//! gates' gradient, summed in another order) and against candle's autograd in f32 on the CPU, f32 and bf16,
//! vectorised heads and the one-value path; and the gates `2·sigmoid(z)` from their logits and the logits'
//! gradient, one pass each, against candle's ops on the device (bit for bit) and on the CPU.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, tol, CheckOutcome};
use crate::cuda::head_gate;

/// Every per-head gate check.
pub fn head_gate_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(141);
    let mut out = Vec::new();
    for [b, l, heads, d] in [[2, 37, 4, 128], [1, 5, 3, 6]] {
        for dtype in [DType::F32, DType::BF16] {
            let label = format!("[{b}, {l}, {heads}x{d}] {dtype:?}");
            let x = randn(rng, &[b, l, heads, d], 0.0, 1.0, dtype)?;
            let g = randn(rng, &[b, l, heads], 1.0, 0.5, dtype)?;
            let dy = randn(rng, &[b, l, heads, d], 0.0, 1.0, dtype)?;
            let (xg, gg, dyg) = (x.to_device(dev)?, g.to_device(dev)?, dy.to_device(dev)?);
            let same = if dtype == DType::BF16 { 1e-3 } else { 1e-6 };
            // The composition on the device: the gates spread by a rank-1 product, dense products, a sum by a
            // matrix-vector product.
            let spread = |g: &Tensor| -> Result<Tensor> {
                let ones = Tensor::ones((1, d), dtype, dev)?;
                g.reshape((b * l * heads, 1))?
                    .matmul(&ones)?
                    .reshape((b, l, heads, d))
            };
            let sums = |t: &Tensor| -> Result<Tensor> {
                let ones = Tensor::ones((d, 1), dtype, dev)?;
                t.reshape((b * l * heads, d))?
                    .matmul(&ones)?
                    .reshape((b, l, heads))
            };

            poison(dev)?;
            let fused = head_gate::head_gate(&xg, &gg)?;
            let separate = xg.mul(&spread(&gg)?)?;
            out.push(compare(
                format!("head_gate vs separate ops {label}"),
                &fused,
                &separate,
                same,
            )?);
            let xv = Var::from_tensor(&x.to_dtype(DType::F32)?)?;
            let gv = Var::from_tensor(&g.to_dtype(DType::F32)?)?;
            let want = xv
                .as_tensor()
                .broadcast_mul(&gv.as_tensor().unsqueeze(3)?)?;
            out.push(compare(
                format!("head_gate vs CPU {label}"),
                &fused,
                &want,
                tol(dtype, 1e-6),
            )?);

            poison(dev)?;
            let (dx, dg) = head_gate::head_gate_backward(&dyg, &xg, &gg)?;
            let dx_sep = dyg.mul(&spread(&gg)?)?;
            let dg_sep = sums(&dyg.mul(&xg)?)?;
            out.push(compare(
                format!("head_gate backward (heads) vs separate ops {label}"),
                &dx,
                &dx_sep,
                same,
            )?);
            out.push(compare(
                format!("head_gate backward (gates) vs separate ops {label}"),
                &dg,
                &dg_sep,
                if dtype == DType::BF16 { 1e-2 } else { 1e-5 },
            )?);
            let store = (want * dy.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
            for (got, var, what) in [(&dx, &xv, "heads"), (&dg, &gv, "gates")] {
                let want = store
                    .get(var.as_tensor())
                    .ok_or_else(|| candle_core::Error::Msg("no reference gradient".into()))?;
                out.push(compare(
                    format!("head_gate backward ({what}) vs CPU {label}"),
                    got,
                    want,
                    tol(dtype, 1e-5),
                )?);
            }
        }
    }
    for dtype in [DType::F32, DType::BF16] {
        out.extend(sigmoid_gate_checks(dev, rng, dtype)?);
    }
    Ok(out)
}

/// The gates `2·sigmoid(z)` from their logits and the logits' gradient, one pass each: against candle's ops on
/// the device (the composition they replace, bit for bit) and against f32 on the CPU, over LTX-2.3's
/// [1, 6144, 32] gates and an odd length.
fn sigmoid_gate_checks(dev: &Device, rng: &mut StdRng, dtype: DType) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for shape in [[1, 6144, 32], [1, 7, 3]] {
        let label = format!("{shape:?} {dtype:?}");
        let z = randn(rng, &shape, 0.0, 2.0, dtype)?;
        let dg = randn(rng, &shape, 0.0, 1.0, dtype)?;
        let (zg, dgg) = (z.to_device(dev)?, dg.to_device(dev)?);
        poison(dev)?;
        let g = head_gate::sigmoid_gates(&zg)?;
        let g_ops = ((zg.neg()?.exp()? + 1.0)?.recip()? * 2.0)?;
        out.push(compare(
            format!("sigmoid gates vs device ops {label}"),
            &g,
            &g_ops,
            0.0,
        )?);
        let z32 = z.to_dtype(DType::F32)?;
        let g_cpu = ((z32.neg()?.exp()? + 1.0)?.recip()? * 2.0)?;
        out.push(compare(
            format!("sigmoid gates vs CPU {label}"),
            &g,
            &g_cpu,
            tol(dtype, 1e-6),
        )?);
        poison(dev)?;
        let dz = head_gate::sigmoid_gates_backward(&dgg, &g)?;
        let dz_ops = ((&dgg * &g)? * (1.0 - (&g * 0.5)?)?)?;
        out.push(compare(
            format!("sigmoid gates backward vs device ops {label}"),
            &dz,
            &dz_ops,
            0.0,
        )?);
        let dg32 = dg.to_dtype(DType::F32)?;
        let dz_cpu = ((&dg32 * &g_cpu)? * (1.0 - (&g_cpu * 0.5)?)?)?;
        out.push(compare(
            format!("sigmoid gates backward vs CPU {label}"),
            &dz,
            &dz_cpu,
            tol(dtype, 1e-6),
        )?);
    }
    Ok(out)
}
