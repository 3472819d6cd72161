//! Device checks of the kernels LTX-2's blocks run: RMSNorm fused with the rotate-half RoPE
//! (`rms_rope::rms_norm_rope_halves` and its backward), and the fused norm kernels with RMSNorm's statistics
//! (`norm_mod` with [`Stats::Rms`]: modulated, after a residual update, and the backward with the residual
//! gradient). Each against the separate device ops it replaces (the same arithmetic: equal up to a rare
//! last-bit difference) and against the f32 CPU composition (candle's autograd for the RoPE backward), f32 and
//! bf16, vectorised rows and the one-value path.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, tol, CheckOutcome};
use crate::cuda::norm_mod::{self, Stats};
use crate::cuda::rms_rope;

/// Relative error allowed against the separate device ops: none beyond a rare last-bit difference.
fn same_ops_tol(dtype: DType) -> f64 {
    if dtype == DType::BF16 {
        1e-3
    } else {
        1e-6
    }
}

/// Every check of LTX-2's fused kernels.
pub fn rms_halves_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(136);
    let mut out = rope_checks(dev, rng)?;
    out.extend(rms_stats_checks(dev, rng)?);
    Ok(out)
}

fn rope_checks(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let eps = 1e-6;
    let mut out = Vec::new();
    // [b, l, heads, head_dim]: halves of whole 16-byte chunks, and halves that take the one-value path.
    for [b, l, heads, d] in [[2, 37, 4, 64], [1, 5, 3, 6]] {
        let cols = heads * d;
        let angles = randn(rng, &[b, l, heads, d / 2], 0.0, 3.0, DType::F32)?;
        for dtype in [DType::F32, DType::BF16] {
            let label = format!("[{b}, {l}, {heads}x{d}] {dtype:?}");
            // The tables in the activations' dtype, as LTX-2 holds them.
            let (cos, sin) = (
                angles.cos()?.to_dtype(dtype)?,
                angles.sin()?.to_dtype(dtype)?,
            );
            let (cg, sg) = (cos.to_device(dev)?, sin.to_device(dev)?);
            let x = randn(rng, &[b, l, cols], 0.3, 2.0, dtype)?;
            let w = randn(rng, &[cols], 1.0, 0.2, dtype)?;
            let dy = randn(rng, &[b, l, heads, d], 0.0, 1.0, dtype)?;
            let (xg, wg, dyg) = (x.to_device(dev)?, w.to_device(dev)?, dy.to_device(dev)?);

            poison(dev)?;
            let fused = rms_rope::rms_norm_rope_halves(&xg, &wg, eps, heads, &cg, &sg)?;
            let normed = crate::cuda::norm::rms_norm(&xg, Some(&wg), eps)?;
            let separate = crate::ops::rope_halves(&normed.reshape((b, l, heads, d))?, &cg, &sg)?;
            out.push(compare(
                format!("rms_norm_rope_halves vs separate ops {label}"),
                &fused,
                &separate,
                same_ops_tol(dtype),
            )?);

            let xv = Var::from_tensor(&x.to_dtype(DType::F32)?)?;
            let f32 = |t: &Tensor| t.to_dtype(DType::F32);
            let normed = crate::norm::rms_norm_portable(xv.as_tensor(), Some(&f32(&w)?), eps)?;
            let want = crate::ops::rope_halves(
                &normed.reshape((b, l, heads, d))?,
                &f32(&cos)?,
                &f32(&sin)?,
            )?;
            out.push(compare(
                format!("rms_norm_rope_halves vs CPU {label}"),
                &fused,
                &want,
                tol(dtype, 1e-5),
            )?);

            poison(dev)?;
            let fused = rms_rope::rms_norm_rope_halves_backward(&xg, &wg, &dyg, eps, &cg, &sg)?;
            let d_normed = crate::ops::rope_halves_backward(&dyg, &cg, &sg)?.flatten_from(2)?;
            let separate = crate::cuda::norm::rms_norm_backward(&xg, Some(&wg), &d_normed, eps)?;
            out.push(compare(
                format!("rms_norm_rope_halves backward vs separate ops {label}"),
                &fused,
                &separate,
                same_ops_tol(dtype),
            )?);
            let store = (want * dy.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
            let want = store
                .get(xv.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg("no reference gradient".into()))?;
            out.push(compare(
                format!("rms_norm_rope_halves backward vs CPU {label}"),
                &fused,
                want,
                tol(dtype, 1e-4),
            )?);
        }
    }
    Ok(out)
}

/// One case's inputs on the device: activations `x`, branch `y`, gradients `dh`, `dres` in `dtype`; modulation
/// vectors (scale, shift, gate) f32.
struct Case {
    x: Tensor,
    y: Tensor,
    dh: Tensor,
    dres: Tensor,
    scale: Tensor,
    shift: Tensor,
    gate: Tensor,
    dtype: DType,
    label: String,
}

/// The fused norm kernels with RMSNorm's statistics against `rms_norm` then `modulate_to`, the gated residual
/// then those, and `modulate_backward` then `rms_norm_backward` plus the residual gradient; per-sample and
/// per-token modulation, bf16 and f32.
fn rms_stats_checks(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for shape in [[2, 37, 1536], [3, 5, 7]] {
        let [b, l, d] = shape;
        for (per_token, dtype) in [
            (false, DType::BF16),
            (true, DType::BF16),
            (false, DType::F32),
        ] {
            let mod_shape = [b, if per_token { l } else { 1 }, d];
            let mut m = || randn(rng, &mod_shape, 0.0, 0.5, DType::F32)?.to_device(dev);
            let (scale, shift, gate) = (m()?, m()?, m()?);
            let mut a = |mean: f32, std: f32| randn(rng, &shape, mean, std, dtype)?.to_device(dev);
            let case = Case {
                x: a(0.5, 2.0)?,
                y: a(0.0, 1.0)?,
                dh: a(0.0, 1.0)?,
                dres: a(0.0, 1.0)?,
                scale,
                shift,
                gate,
                dtype,
                label: format!(
                    "{shape:?} {dtype:?}, {} modulation",
                    if per_token { "per-token" } else { "per-sample" }
                ),
            };
            out.extend(rms_forward_checks(dev, &case)?);
            out.extend(rms_backward_checks(&case)?);
        }
    }
    Ok(out)
}

const EPS: f64 = 1e-6;

fn f32_cpu(t: &Tensor) -> Result<Tensor> {
    t.to_device(&Device::Cpu)?.to_dtype(DType::F32)
}

fn rms_forward_checks(dev: &Device, c: &Case) -> Result<Vec<CheckOutcome>> {
    let (dtype, label) = (c.dtype, &c.label);
    let rms = |t: &Tensor| crate::cuda::norm::rms_norm(t, None, EPS);
    let same = same_ops_tol(dtype);
    let mut out = Vec::new();
    poison(dev)?;
    let fused = norm_mod::layer_norm_modulate(&c.x, &c.scale, &c.shift, Stats::Rms(EPS), dtype)?;
    let separate = crate::ops::modulate_to(&rms(&c.x)?, &c.scale, &c.shift, dtype)?;
    out.push(compare(
        format!("rms_norm_modulate vs separate ops {label}"),
        &fused,
        &separate,
        same,
    )?);
    let cpu = crate::ops::modulate_to(
        &crate::norm::rms_norm_portable(&f32_cpu(&c.x)?, None, EPS)?,
        &f32_cpu(&c.scale)?,
        &f32_cpu(&c.shift)?,
        DType::F32,
    )?;
    out.push(compare(
        format!("rms_norm_modulate vs CPU {label}"),
        &fused,
        &cpu,
        tol(dtype, 1e-5),
    )?);
    for modulation in [Some((&c.scale, &c.shift)), None] {
        let case = if modulation.is_some() {
            "modulated"
        } else {
            "plain"
        };
        poison(dev)?;
        let (xo, h) = norm_mod::residual_layer_norm(
            &c.x,
            &c.y,
            Some(&c.gate),
            (None, None),
            modulation,
            Stats::Rms(EPS),
        )?;
        let x_sep = crate::ops::gated_residual(&c.x, &c.y, &c.gate, dtype)?;
        let h_sep = match modulation {
            Some((s, t)) => crate::ops::modulate_to(&rms(&x_sep)?, s, t, dtype)?,
            None => rms(&x_sep)?,
        };
        out.push(compare(
            format!("residual rms_norm ({case}) residual vs separate ops {label}"),
            &xo,
            &x_sep,
            same,
        )?);
        out.push(compare(
            format!("residual rms_norm ({case}) norm vs separate ops {label}"),
            &h,
            &h_sep,
            same,
        )?);
    }
    Ok(out)
}

fn rms_backward_checks(c: &Case) -> Result<Vec<CheckOutcome>> {
    let (dtype, label) = (c.dtype, &c.label);
    let mut out = Vec::new();
    for s in [Some(&c.scale), None] {
        let case = if s.is_some() { "modulated" } else { "plain" };
        poison(c.x.device())?;
        let fused =
            norm_mod::layer_norm_backward_add(&c.x, None, &c.dh, s, &c.dres, Stats::Rms(EPS))?;
        let dy = match s {
            Some(s) => crate::ops::modulate_backward(&c.dh, s, dtype)?,
            None => c.dh.clone(),
        };
        let separate = (&c.dres + crate::norm::rms_norm_backward(&c.x, None, &dy, EPS)?)?;
        out.push(compare(
            format!("rms_norm_backward_add ({case}) vs separate ops {label}"),
            &fused,
            &separate,
            same_ops_tol(dtype),
        )?);
        let xv = Var::from_tensor(&f32_cpu(&c.x)?)?;
        let mut yc = crate::norm::rms_norm_portable(xv.as_tensor(), None, EPS)?;
        if let Some(s) = s {
            yc = yc.broadcast_mul(&(f32_cpu(s)? + 1.0)?)?;
        }
        let store = (yc * f32_cpu(&c.dh)?)?.sum_all()?.backward()?;
        let want = store
            .get(xv.as_tensor())
            .ok_or_else(|| candle_core::Error::Msg("no reference gradient".into()))?;
        let want = (want + f32_cpu(&c.dres)?)?;
        out.push(compare(
            format!("rms_norm_backward_add ({case}) vs CPU {label}"),
            &fused,
            &want,
            tol(dtype, 1e-4),
        )?);
    }
    Ok(out)
}
