//! Device checks of `c += a · bᵀ + bias` through cuBLASLt's bias epilogue (`cuda::gemm_bias`) against the same sum
//! in f32 on the CPU from the same (rounded) values, on FLUX.1-sized and unaligned shapes, an input that starts
//! inside a larger buffer, and through [`add_matmul_bias`] (which falls back where cuBLASLt has no algorithm).

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, CheckOutcome};
use crate::cuda::gemm_bias::add_matmul_bias_;
use crate::linear::add_matmul_bias;

/// Every check of the bias-epilogue product.
pub fn gemm_bias_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(137);
    let mut out = Vec::new();
    // FLUX.1's qkv and single-block linear2 at fewer rows (cuBLASLt must have an algorithm for these), then
    // widths that are multiples of nothing, and an input starting `offset` rows into a larger buffer.
    for (dims, offset, must_run) in [
        ([512, 9216, 3072], 0, true),
        ([300, 3072, 15360], 0, true),
        ([512, 384, 256], 3, true),
        ([77, 100, 72], 0, false),
        ([77, 100, 75], 1, false),
    ] {
        for dtype in [DType::BF16, DType::F16] {
            out.extend(case(dev, rng, dims, offset, dtype, must_run)?);
        }
    }
    Ok(out)
}

/// One product `c [m, n] += a [m, k] · bᵀ + bias` on `dev` against the CPU; with `must_run`, a missing
/// algorithm fails the check.
fn case(
    dev: &Device,
    rng: &mut StdRng,
    [m, n, k]: [usize; 3],
    offset: usize,
    dtype: DType,
    must_run: bool,
) -> Result<Vec<CheckOutcome>> {
    let a_all = randn(rng, &[m + offset, k], 0.0, 1.0, dtype)?;
    let a = a_all.narrow(0, offset, m)?;
    let b = randn(rng, &[n, k], 0.0, 0.05, dtype)?;
    let c = randn(rng, &[m, n], 0.0, 1.0, dtype)?;
    let bias = randn(rng, &[n], 0.0, 0.5, dtype)?;
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let want = ((f32(&c)? + f32(&a)?.matmul(&f32(&b)?.t()?)?)?.broadcast_add(&f32(&bias)?))?;
    let name = format!("c += a·bᵀ + bias {dtype:?} [{m}, {k}] × [{k}, {n}], a at row {offset}");
    let on_dev = |t: &Tensor| t.to_device(dev);
    poison(dev)?;
    let a_dev = on_dev(&a_all)?.narrow(0, offset, m)?;
    let (b_dev, bias_dev) = (on_dev(&b)?, on_dev(&bias)?);
    let c_dev = on_dev(&c)?;
    let ran = add_matmul_bias_(&c_dev, &a_dev, &b_dev, &bias_dev)?;
    let mut out = Vec::new();
    if ran {
        out.push(compare(format!("{name} (cuBLASLt)"), &c_dev, &want, 1e-2)?);
    } else if must_run {
        out.push(CheckOutcome {
            name: format!("{name}: cuBLASLt has no bias-epilogue algorithm"),
            rel_err: f64::NAN,
            max_abs: f64::NAN,
            tol: 0.0,
        });
    }
    let y = add_matmul_bias(on_dev(&c)?, &a_dev, &b_dev, Some(&bias_dev))?;
    out.push(compare(
        format!("{name} (add_matmul_bias)"),
        &y,
        &want,
        1e-2,
    )?);
    Ok(out)
}
