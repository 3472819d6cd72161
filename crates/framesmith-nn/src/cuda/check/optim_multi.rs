//! Device checks of the multi-tensor optimizer kernels (`nn::optim::adamw_update_all`, `sums_of_squares`) against
//! the per-tensor CUDA passes, candle's own sum of squares and the CPU, bit for bit, on tensors of mixed sizes and
//! dtypes.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::CheckOutcome;
use crate::init;
use crate::optim::{adamw_update, adamw_update_all, sums_of_squares, AdamWTensors, AdamWUpdate};

/// Sizes around the kernels' edges: candle's one-thread sum (n <= 32), its block sizes (powers of two up to 1024),
/// groups of four with a tail, and AdamW's 4096-element chunks.
const SIZES: [usize; 14] = [
    1,
    7,
    32,
    33,
    100,
    1023,
    1024,
    1025,
    4095,
    4096,
    4097,
    12_289,
    38_829,
    7 * 37_449,
];

/// (parameter, gradient) dtypes, cycled over the sizes.
const DTYPES: [(DType, DType); 4] = [
    (DType::F32, DType::F32),
    (DType::F32, DType::BF16),
    (DType::BF16, DType::F32),
    (DType::BF16, DType::BF16),
];

/// The outcome of comparing `got` with `want` bit for bit (as f32: bf16 widens exactly): `rel_err` is the share of
/// elements whose bits differ (NaN passes only as the same NaN), so the tolerance is 0.
fn bitwise(name: String, got: &Tensor, want: &Tensor) -> Result<CheckOutcome> {
    let host = |t: &Tensor| -> Result<Vec<f32>> {
        t.to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()
    };
    let (g, w) = (host(got)?, host(want)?);
    if g.len() != w.len() {
        candle_core::bail!("{name}: {} elements against {}", g.len(), w.len());
    }
    let mut differ = 0usize;
    let mut max_abs = 0f64;
    for (a, b) in g.iter().zip(&w) {
        if a.to_bits() != b.to_bits() {
            differ += 1;
            let d = (f64::from(*a) - f64::from(*b)).abs();
            max_abs = if d.is_nan() {
                f64::INFINITY
            } else {
                max_abs.max(d)
            };
        }
    }
    Ok(CheckOutcome {
        name,
        rel_err: differ as f64 / g.len().max(1) as f64,
        max_abs,
        tol: 0.0,
    })
}

/// One parameter's starting values on the CPU: param, gradient (the last one transposed, so not contiguous),
/// exp_avg, exp_avg_sq.
struct Case {
    p: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
}

fn cases(rng: &mut StdRng) -> Result<Vec<Case>> {
    let cpu = &Device::Cpu;
    let mut out = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let (pd, gd) = DTYPES[i % DTYPES.len()];
        let p = init::randn(&mut *rng, n, 0.0, 1.0, cpu)?.to_dtype(pd)?;
        let g = if i + 1 == SIZES.len() {
            // The last size, 7 · 37_449: stored [37_449, 7] and transposed to [7, 37_449], then flattened by the shape.
            init::randn(&mut *rng, (37_449, 7), 0.0, 0.1, cpu)?
                .to_dtype(gd)?
                .t()?
        } else {
            init::randn(&mut *rng, n, 0.0, 0.1, cpu)?.to_dtype(gd)?
        };
        let p = if i + 1 == SIZES.len() {
            p.reshape((7, 37_449))?
        } else {
            p
        };
        let m = init::randn(&mut *rng, p.shape(), 0.0, 0.01, cpu)?;
        let v = init::randn(&mut *rng, p.shape(), 0.0, 0.01, cpu)?.sqr()?;
        out.push(Case { p, g, m, v });
    }
    Ok(out)
}

/// The parameters and moments of `cases` as variables on `dev`.
fn vars(cases: &[Case], dev: &Device) -> Result<Vec<[Var; 3]>> {
    cases
        .iter()
        .map(|c| {
            Ok([
                Var::from_tensor(&c.p.to_device(dev)?)?,
                Var::from_tensor(&c.m.to_device(dev)?)?,
                Var::from_tensor(&c.v.to_device(dev)?)?,
            ])
        })
        .collect()
}

/// AdamW over all the cases in one call against the per-tensor passes on the device and on the CPU.
fn adamw_checks(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let cases = cases(rng)?;
    let grads = cases
        .iter()
        .map(|c| c.g.to_device(dev))
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for (grad_scale, decay) in [(1.0, 1.0), (0.37, 0.999)] {
        let u = AdamWUpdate {
            decay,
            ..AdamWUpdate::at_step(5, 2e-4, (0.9, 0.999), 1e-8, 0.0, grad_scale)
        };
        let multi = vars(&cases, dev)?;
        let items: Vec<_> = multi
            .iter()
            .zip(&grads)
            .map(|([p, m, v], grad)| AdamWTensors {
                param: p.as_tensor(),
                grad,
                exp_avg: m.as_tensor(),
                exp_avg_sq: v.as_tensor(),
            })
            .collect();
        adamw_update_all(&items, &u)?;
        let single = vars(&cases, dev)?;
        let cpu = vars(&cases, &Device::Cpu)?;
        for (i, case) in cases.iter().enumerate() {
            let [p, m, v] = &single[i];
            adamw_update(p.as_tensor(), &grads[i], m.as_tensor(), v.as_tensor(), &u)?;
            let [p, m, v] = &cpu[i];
            adamw_update(p.as_tensor(), &case.g, m.as_tensor(), v.as_tensor(), &u)?;
            let name = format!(
                "adamw_update_all n {} {:?} param, {:?} grad, clip {grad_scale}",
                case.p.elem_count(),
                case.p.dtype(),
                case.g.dtype()
            );
            for (k, what) in ["param", "exp_avg", "exp_avg_sq"].iter().enumerate() {
                let got = multi[i][k].as_tensor();
                out.push(bitwise(
                    format!("{name} {what} vs per-tensor"),
                    got,
                    single[i][k].as_tensor(),
                )?);
                out.push(bitwise(
                    format!("{name} {what} vs CPU"),
                    got,
                    cpu[i][k].as_tensor(),
                )?);
            }
        }
    }
    Ok(out)
}

/// The sums of squares in one call against candle's per-tensor `to_dtype(f32).sqr().sum_all()` on the device
/// (what the gradient norm computed before, so the norm keeps its bits), including a tensor that starts inside its
/// buffer and a NaN.
fn sum_checks(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut tensors = Vec::new();
    for (i, &n) in SIZES.iter().chain(&[1 << 20, 3 << 19]).enumerate() {
        let dtype = if i % 2 == 0 { DType::F32 } else { DType::BF16 };
        tensors.push(init::randn(&mut *rng, n, 0.0, 0.1, dev)?.to_dtype(dtype)?);
    }
    let big = init::randn(&mut *rng, 10_007, 0.0, 1.0, dev)?;
    tensors.push(big.narrow(0, 3, 9_001)?);
    let mut with_nan = init::randn(&mut *rng, 4_099, 0.0, 1.0, &Device::Cpu)?.to_vec1::<f32>()?;
    with_nan[2_050] = f32::NAN;
    tensors.push(Tensor::new(with_nan, dev)?);
    let got = sums_of_squares(&tensors)?;
    let want = tensors
        .iter()
        .map(|t| t.to_dtype(DType::F32)?.sqr()?.sum_all()?.to_scalar::<f32>())
        .collect::<Result<Vec<_>>>()?;
    let name = format!(
        "sums_of_squares of {} tensors (sizes {:?}…, f32 and bf16, an offset view, a NaN) vs candle's per tensor",
        tensors.len(),
        &SIZES[..4]
    );
    Ok(vec![bitwise(
        name,
        &Tensor::new(got, &Device::Cpu)?,
        &Tensor::new(want, &Device::Cpu)?,
    )?])
}

/// Every multi-tensor optimizer check.
pub fn optim_multi_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(37);
    let mut out = adamw_checks(dev, rng)?;
    out.extend(sum_checks(dev, rng)?);
    Ok(out)
}
