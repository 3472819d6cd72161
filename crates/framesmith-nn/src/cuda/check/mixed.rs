//! Device checks of the mixed-dtype element-wise kernels (`nn::cuda::mixed`) and the in-place accumulating
//! matmul (`nn::cuda::gemm`) against f32 CPU references on seeded random inputs, vectorised and scalar paths.

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, tol, CheckOutcome};
use crate::cuda::{gemm, mixed};

/// Shapes with a vectorisable last dim and one without (odd sizes take the one-value path).
const SHAPES: [[usize; 3]; 2] = [[2, 37, 1536], [3, 5, 7]];

/// Every mixed-kernel and accumulate-matmul check.
pub fn mixed_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(108);
    let mut out = Vec::new();
    for shape in SHAPES {
        out.extend(casts(dev, rng, &shape)?);
        out.extend(modulation(dev, rng, &shape)?);
    }
    out.extend(add_matmul(dev, rng)?);
    out.extend(row_copies(dev, rng)?);
    out.extend(tracked_gradients(dev, rng)?);
    out.extend(token_sums(dev, rng)?);
    Ok(out)
}

/// The row copy (`ops::contiguous`) against candle's copy on the CPU: a narrow of the last dimension (16-byte
/// chunks, and a width and offset that are not), heads split out of a fused projection, a broadcast row.
fn row_copies(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let x = randn(rng, &[2, 37, 3 * 1536], 0.0, 1.0, dtype)?;
        let odd = randn(rng, &[3, 5, 21], 0.0, 1.0, dtype)?;
        let g = x.to_device(dev)?;
        let gd = odd.to_device(dev)?;
        let cases: [(&str, Tensor, Tensor); 4] = [
            ("narrow", g.narrow(2, 1536, 1536)?, x.narrow(2, 1536, 1536)?),
            ("narrow odd", gd.narrow(2, 7, 7)?, odd.narrow(2, 7, 7)?),
            (
                "heads",
                g.reshape((2, 37, 3, 12, 128))?
                    .narrow(2, 2, 1)?
                    .squeeze(2)?,
                x.reshape((2, 37, 3, 12, 128))?
                    .narrow(2, 2, 1)?
                    .squeeze(2)?,
            ),
            (
                "broadcast row",
                g.narrow(1, 3, 1)?.broadcast_as((2, 9, 3 * 1536))?,
                x.narrow(1, 3, 1)?.broadcast_as((2, 9, 3 * 1536))?,
            ),
        ];
        for (label, got, want) in cases {
            poison(dev)?;
            let got = crate::ops::contiguous(&got)?;
            if !got.is_contiguous() {
                candle_core::bail!("row copy {label}: the result is not contiguous");
            }
            out.push(compare(
                format!("row copy {label} {dtype:?}"),
                &got,
                &want.contiguous()?,
                0.0,
            )?);
        }
    }
    Ok(out)
}

/// The ops whose fused kernels have no backward keep the gradient of a tracked input (they take the
/// differentiable composition then): `modulate_to`, `cast`, `contiguous` against the same on the CPU.
fn tracked_gradients(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    let x = randn(rng, &[2, 37, 3 * 64], 0.0, 1.0, DType::F32)?;
    let scale = randn(rng, &[2, 1, 3 * 64], 0.0, 0.5, DType::F32)?;
    let shift = randn(rng, &[2, 1, 3 * 64], 0.0, 0.5, DType::F32)?;
    type Op = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
    let ops: [(&str, Op); 3] = [
        ("modulate_to", |x, s, h| {
            crate::ops::modulate_to(x, s, h, DType::BF16)
        }),
        ("cast", |x, _, _| crate::ops::cast(x, DType::BF16)),
        ("contiguous", |x, _, _| {
            crate::ops::contiguous(&x.narrow(2, 64, 64)?)
        }),
    ];
    for (label, op) in ops {
        let grad_on = |d: &Device| -> Result<Tensor> {
            let v = candle_core::Var::from_tensor(&x.to_device(d)?)?;
            let y = op(v.as_tensor(), &scale.to_device(d)?, &shift.to_device(d)?)?;
            let grads = y.to_dtype(DType::F32)?.sqr()?.sum_all()?.backward()?;
            match grads.get(v.as_tensor()) {
                Some(g) => g.to_device(&Device::Cpu),
                None => candle_core::bail!("{label}: no gradient reached the tracked input"),
            }
        };
        out.push(compare(
            format!("gradient through {label} (tracked input)"),
            &grad_on(dev)?,
            &grad_on(&Device::Cpu)?,
            2e-2,
        )?);
    }
    Ok(out)
}

/// The fused token sums (modulation-vector gradients) against f32 sums on the CPU.
fn token_sums(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for shape in SHAPES {
            let a = randn(rng, &shape, 0.0, 1.0, dtype)?;
            let g = randn(rng, &shape, 0.0, 1.0, dtype)?;
            poison(dev)?;
            let (ga, gb) = crate::ops::token_sums(&a.to_device(dev)?, &g.to_device(dev)?, true)?;
            let g32 = g.to_dtype(DType::F32)?;
            let want_a = (&g32 * a.to_dtype(DType::F32)?)?.sum_keepdim(1)?;
            let want_b = g32.sum_keepdim(1)?;
            let gb =
                gb.ok_or_else(|| candle_core::Error::Msg("token_sums: no plain sum".into()))?;
            out.push(compare(
                format!("token sums g*a {dtype:?} {shape:?}"),
                &ga,
                &want_a,
                1e-5,
            )?);
            out.push(compare(
                format!("token sums g {dtype:?} {shape:?}"),
                &gb,
                &want_b,
                1e-5,
            )?);
        }
    }
    Ok(out)
}

fn casts(dev: &Device, rng: &mut StdRng, shape: &[usize]) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for (from, to) in [(DType::F32, DType::BF16), (DType::BF16, DType::F32)] {
        poison(dev)?;
        let x = randn(rng, shape, 0.3, 3.0, from)?;
        let got = mixed::cast(&x.to_device(dev)?, to)?;
        if got.dtype() != to {
            candle_core::bail!("cast gave {:?}, not {to:?}", got.dtype());
        }
        // Both sides round to nearest even: the results must be identical.
        out.push(compare(
            format!("cast {from:?}->{to:?} {shape:?}"),
            &got,
            &x.to_dtype(to)?,
            1e-7,
        )?);
    }
    Ok(out)
}

fn modulation(dev: &Device, rng: &mut StdRng, shape: &[usize]) -> Result<Vec<CheckOutcome>> {
    let (b, l, d) = (shape[0], shape[1], shape[2]);
    let mut out = Vec::new();
    for mod_tokens in [1, l] {
        let scale = randn(rng, &[b, mod_tokens, d], 0.0, 0.5, DType::F32)?;
        let shift = randn(rng, &[b, mod_tokens, d], 0.0, 0.5, DType::F32)?;
        let (sg, hg) = (scale.to_device(dev)?, shift.to_device(dev)?);
        let x = randn(rng, shape, 0.0, 2.0, DType::F32)?;
        let xb = randn(rng, shape, 0.0, 2.0, DType::BF16)?;
        let xf = xb.to_dtype(DType::F32)?;
        let label = format!("{shape:?} mod_tokens {mod_tokens}");

        poison(dev)?;
        let got = mixed::modulate_to(&x.to_device(dev)?, &sg, &hg, DType::BF16)?;
        let want = x.broadcast_mul(&(&scale + 1.0)?)?.broadcast_add(&shift)?;
        out.push(compare(
            format!("modulate_to F32->BF16 {label}"),
            &got,
            &want,
            tol(DType::BF16, 0.0),
        )?);

        poison(dev)?;
        let got = mixed::scaled_to(&xb.to_device(dev)?, &sg, 1.0, DType::F32)?;
        let want = xf.broadcast_mul(&(&scale + 1.0)?)?;
        out.push(compare(
            format!("scaled_to(1) BF16->F32 {label}"),
            &got,
            &want,
            1e-6,
        )?);

        poison(dev)?;
        let got = mixed::scaled_to(&x.to_device(dev)?, &sg, 0.0, DType::BF16)?;
        let want = x.broadcast_mul(&scale)?;
        out.push(compare(
            format!("scaled_to(0) F32->BF16 {label}"),
            &got,
            &want,
            tol(DType::BF16, 0.0),
        )?);

        poison(dev)?;
        let got = mixed::gated_residual_mixed(&x.to_device(dev)?, &xb.to_device(dev)?, &sg)?;
        if got.dtype() != DType::F32 {
            candle_core::bail!("gated_residual_mixed gave {:?}, not F32", got.dtype());
        }
        let want = (&x + xf.broadcast_mul(&scale)?)?;
        out.push(compare(
            format!("gated_residual_mixed F32+BF16 {label}"),
            &got,
            &want,
            1e-6,
        )?);
    }
    Ok(out)
}

fn add_matmul(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    let (m, n) = (257, 136);
    for dtype in [DType::BF16, DType::F32] {
        for k in [40, 33] {
            for transposed in [true, false] {
                poison(dev)?;
                let c = randn(rng, &[m, n], 0.0, 1.0, dtype)?;
                let a = randn(rng, &[m, k], 0.0, 1.0, dtype)?;
                let b = if transposed {
                    randn(rng, &[n, k], 0.0, 1.0, dtype)?
                } else {
                    randn(rng, &[k, n], 0.0, 1.0, dtype)?
                };
                let cg = c.to_device(dev)?.copy()?;
                gemm::add_matmul_(&cg, &a.to_device(dev)?, &b.to_device(dev)?, transposed)?;
                let f = |t: &Tensor| t.to_dtype(DType::F32);
                let bt = if transposed { f(&b)?.t()? } else { f(&b)? };
                let want = (f(&c)? + f(&a)?.matmul(&bt)?)?;
                out.push(compare(
                    format!(
                        "add_matmul {dtype:?} m{m} n{n} k{k} b{}",
                        if transposed { "ᵀ" } else { "" }
                    ),
                    &cg,
                    &want,
                    tol(dtype, 1e-5),
                )?);
            }
        }
    }
    Ok(out)
}
