//! Device checks of LayerNorm fused with the block's modulation (`nn::cuda::norm_mod`): the fused kernels against
//! the separate device ops they replace (the same arithmetic, so equal to within a rounding) and against the f32
//! CPU composition, for per-sample and per-token modulation, f32 and bf16 residuals, vectorised and scalar rows.

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, tol, CheckOutcome};
use crate::cuda::norm_mod::{self, Stats};

/// Rows of a vectorisable width and of one that is not (odd widths take the one-value path).
const SHAPES: [[usize; 3]; 2] = [[2, 37, 1536], [3, 5, 7]];

/// Relative error allowed against the separate device ops: none beyond a rare last-bit difference.
fn same_ops_tol(dtype: DType) -> f64 {
    if dtype == DType::BF16 {
        1e-3
    } else {
        1e-6
    }
}

/// Every fused LayerNorm check.
pub fn norm_mod_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(112);
    let eps = 1e-6;
    let mut out = Vec::new();
    for shape in SHAPES {
        let [b, l, d] = shape;
        for per_token in [false, true] {
            let mod_shape = [b, if per_token { l } else { 1 }, d];
            let scale = randn(rng, &mod_shape, 0.0, 0.5, DType::F32)?;
            let shift = randn(rng, &mod_shape, 0.0, 0.5, DType::F32)?;
            let (sg, hg) = (scale.to_device(dev)?, shift.to_device(dev)?);
            let w = randn(rng, &[d], 1.0, 0.1, DType::F32)?;
            let wg = w.to_device(dev)?;
            for (residual, compute) in [
                (DType::F32, DType::BF16),
                (DType::F32, DType::F32),
                (DType::BF16, DType::BF16),
            ] {
                let label = format!(
                    "{shape:?} {} modulation, {residual:?} residual, {compute:?} compute",
                    if per_token { "per-token" } else { "per-sample" }
                );
                let coarse = if residual == DType::BF16 || compute == DType::BF16 {
                    DType::BF16
                } else {
                    DType::F32
                };
                let x = randn(rng, &shape, 0.5, 2.0, residual)?;
                let xg = x.to_device(dev)?;

                poison(dev)?;
                let fused =
                    norm_mod::layer_norm_modulate(&xg, &sg, &hg, Stats::Layer(eps), compute)?;
                let separate = crate::ops::modulate_to(
                    &crate::norm::layer_norm(&xg, None, None, eps)?,
                    &sg,
                    &hg,
                    compute,
                )?;
                out.push(compare(
                    format!("layer_norm_modulate vs separate ops {label}"),
                    &fused,
                    &separate,
                    same_ops_tol(compute),
                )?);
                let cpu = crate::ops::modulate_to(
                    &crate::norm::layer_norm_portable(&x.to_dtype(DType::F32)?, None, None, eps)?,
                    &scale,
                    &shift,
                    DType::F32,
                )?;
                out.push(compare(
                    format!("layer_norm_modulate vs CPU {label}"),
                    &fused,
                    &cpu,
                    tol(coarse, 1e-5),
                )?);

                let dh = randn(rng, &shape, 0.0, 1.0, compute)?.to_device(dev)?;
                let dres = randn(rng, &shape, 0.0, 1.0, residual)?.to_device(dev)?;
                for (weight, modulated) in [(None, true), (Some(&wg), false)] {
                    let case = if modulated { "modulated" } else { "weighted" };
                    poison(dev)?;
                    let s = modulated.then_some(&sg);
                    let stats = Stats::Layer(eps);
                    let fused =
                        norm_mod::layer_norm_backward_add(&xg, weight, &dh, s, &dres, stats)?;
                    let dy = match s {
                        Some(s) => crate::ops::modulate_backward(&dh, s, residual)?,
                        None => crate::ops::cast(&dh, residual)?,
                    };
                    let separate =
                        (&dres + crate::norm::layer_norm_backward(&xg, weight, &dy, eps)?)?;
                    out.push(compare(
                        format!("layer_norm_backward_add ({case}) vs separate ops {label}"),
                        &fused,
                        &separate,
                        same_ops_tol(residual),
                    )?);
                    let cpu =
                        cpu_backward(&x, weight.map(|_| &w), &dh, s.map(|_| &scale), &dres, eps)?;
                    out.push(compare(
                        format!("layer_norm_backward_add ({case}) vs CPU {label}"),
                        &fused,
                        &cpu,
                        tol(coarse, 1e-4),
                    )?);
                }
            }
        }
    }
    out.extend(layer_norm_to_checks(dev, rng, eps)?);
    out.extend(residual_layer_norm_checks(dev, rng, eps)?);
    Ok(out)
}

/// The residual update fused with the LayerNorm after it (`norm_mod::residual_layer_norm`) against the separate
/// device ops and the f32 CPU composition: with a per-sample or per-token gate or none, affine or modulated.
fn residual_layer_norm_checks(
    dev: &Device,
    rng: &mut StdRng,
    eps: f64,
) -> Result<Vec<CheckOutcome>> {
    use crate::ops::{residual_layer_norm as separate_or_fused, NormAfter};
    let mut out = Vec::new();
    for shape in SHAPES {
        let [b, l, d] = shape;
        for (residual, compute) in [
            (DType::F32, DType::BF16),
            (DType::F32, DType::F32),
            (DType::BF16, DType::BF16),
        ] {
            for (gated, per_token, modulated) in [
                (true, false, false),
                (false, false, true),
                (true, true, true),
                (false, true, false),
            ] {
                let label = format!(
                    "{shape:?} {residual:?} residual, {compute:?} compute, {} gate, {}",
                    if gated {
                        if per_token {
                            "per-token"
                        } else {
                            "per-sample"
                        }
                    } else {
                        "no"
                    },
                    if modulated { "modulated" } else { "affine" }
                );
                let mod_shape = [b, if per_token { l } else { 1 }, d];
                let x = randn(rng, &shape, 0.5, 2.0, residual)?;
                let y = randn(rng, &shape, 0.0, 1.0, compute)?;
                let gate = randn(rng, &mod_shape, 0.0, 0.5, DType::F32)?;
                let scale = randn(rng, &mod_shape, 0.0, 0.5, DType::F32)?;
                let shift = randn(rng, &mod_shape, 0.0, 0.5, DType::F32)?;
                let w = randn(rng, &[d], 1.0, 0.3, residual)?;
                let bias = randn(rng, &[d], 0.0, 0.3, residual)?;
                let g = |t: &Tensor| t.to_device(dev);
                let (xg, yg, gg, sg, hg, wg, bg) = (
                    g(&x)?,
                    g(&y)?,
                    g(&gate)?,
                    g(&scale)?,
                    g(&shift)?,
                    g(&w)?,
                    g(&bias)?,
                );
                let norm = if modulated {
                    NormAfter::Modulated {
                        scale: &sg,
                        shift: &hg,
                    }
                } else {
                    NormAfter::Affine(Some(&wg), Some(&bg))
                };
                poison(dev)?;
                let gate_g = gated.then_some(&gg);
                let affine = match norm {
                    NormAfter::Affine(w, b) => (w, b),
                    NormAfter::Modulated { .. } | NormAfter::Rms(_) => (None, None),
                };
                let modulation = modulated.then_some((&sg, &hg));
                let (xo, h) = norm_mod::residual_layer_norm(
                    &xg,
                    &yg,
                    gate_g,
                    affine,
                    modulation,
                    Stats::Layer(eps),
                )?;
                // The separate device ops: the residual kernel, then the LayerNorm kernels.
                let x_sep = match gate_g {
                    Some(gate) => crate::ops::gated_residual(&xg, &yg, gate, residual)?,
                    None => crate::ops::residual_add(&xg, &yg)?,
                };
                let h_sep = match norm {
                    NormAfter::Affine(w, b) => norm_mod::layer_norm_to(&x_sep, w, b, eps, compute)?,
                    NormAfter::Modulated { scale, shift } => norm_mod::layer_norm_modulate(
                        &x_sep,
                        scale,
                        shift,
                        Stats::Layer(eps),
                        compute,
                    )?,
                    NormAfter::Rms(_) => {
                        candle_core::bail!("the LayerNorm checks build no RMSNorm")
                    }
                };
                out.push(compare(
                    format!("residual_layer_norm residual vs separate ops {label}"),
                    &xo,
                    &x_sep,
                    same_ops_tol(residual),
                )?);
                let coarse = if residual == DType::BF16 || compute == DType::BF16 {
                    DType::BF16
                } else {
                    DType::F32
                };
                out.push(compare(
                    format!("residual_layer_norm norm vs separate ops {label}"),
                    &h,
                    &h_sep,
                    same_ops_tol(coarse),
                )?);
                // The CPU composition in f32.
                let f32 = |t: &Tensor| t.to_dtype(DType::F32);
                let xc = match gated {
                    true => (f32(&x)? + f32(&y)?.broadcast_mul(&gate)?)?,
                    false => (f32(&x)? + f32(&y)?)?,
                };
                let hc = if modulated {
                    crate::norm::layer_norm_portable(&xc, None, None, eps)?
                        .broadcast_mul(&(&scale + 1.0)?)?
                        .broadcast_add(&shift)?
                } else {
                    crate::norm::layer_norm_portable(&xc, Some(&f32(&w)?), Some(&f32(&bias)?), eps)?
                };
                out.push(compare(
                    format!("residual_layer_norm residual vs CPU {label}"),
                    &xo,
                    &xc,
                    tol(coarse, 1e-6),
                )?);
                out.push(compare(
                    format!("residual_layer_norm norm vs CPU {label}"),
                    &h,
                    &hc,
                    tol(coarse, 1e-5),
                )?);
                // The dispatching op takes the fused kernel here.
                let (xo2, h2) = separate_or_fused(&xg, &yg, gate_g, norm, eps, compute)?;
                out.push(compare(
                    format!("residual_layer_norm via ops {label}"),
                    &h2,
                    &h,
                    0.0,
                )?);
                out.push(compare(
                    format!("residual_layer_norm residual via ops {label}"),
                    &xo2,
                    &xo,
                    0.0,
                )?);
            }
        }
    }
    Ok(out)
}

/// LayerNorm written in another dtype (`norm_mod::layer_norm_to`, Wan's `norm3`) against the plain kernel and a
/// cast, and against the f32 CPU composition, with and without affine parameters.
fn layer_norm_to_checks(dev: &Device, rng: &mut StdRng, eps: f64) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for shape in SHAPES {
        let d = shape[2];
        for (input, output) in [
            (DType::F32, DType::BF16),
            (DType::F32, DType::F32),
            (DType::BF16, DType::F32),
            (DType::BF16, DType::BF16),
        ] {
            let x = randn(rng, &shape, 0.5, 2.0, input)?;
            let w = randn(rng, &[d], 1.0, 0.3, input)?;
            let b = randn(rng, &[d], 0.0, 0.3, input)?;
            let (xg, wg, bg) = (x.to_device(dev)?, w.to_device(dev)?, b.to_device(dev)?);
            for affine in [false, true] {
                let label = format!(
                    "{shape:?} {input:?} -> {output:?}{}",
                    if affine { " affine" } else { "" }
                );
                let (wo, bo) = if affine {
                    (Some(&wg), Some(&bg))
                } else {
                    (None, None)
                };
                poison(dev)?;
                let fused = norm_mod::layer_norm_to(&xg, wo, bo, eps, output)?;
                let separate =
                    crate::ops::cast(&crate::norm::layer_norm(&xg, wo, bo, eps)?, output)?;
                let coarse = if input == DType::BF16 || output == DType::BF16 {
                    DType::BF16
                } else {
                    DType::F32
                };
                out.push(compare(
                    format!("layer_norm_to vs separate ops {label}"),
                    &fused,
                    &separate,
                    same_ops_tol(coarse),
                )?);
                let f32 = |t: &Tensor| t.to_dtype(DType::F32);
                let (wc, bc) = (f32(&w)?, f32(&b)?);
                let (wc, bc) = if affine {
                    (Some(&wc), Some(&bc))
                } else {
                    (None, None)
                };
                let cpu = crate::norm::layer_norm_portable(&f32(&x)?, wc, bc, eps)?;
                out.push(compare(
                    format!("layer_norm_to vs CPU {label}"),
                    &fused,
                    &cpu,
                    tol(coarse, 1e-5),
                )?);
            }
        }
    }
    Ok(out)
}

/// The backward on the CPU in f32: `dres + LayerNorm_bwd(x, w, dh · (1 + scale))`.
fn cpu_backward(
    x: &Tensor,
    w: Option<&Tensor>,
    dh: &Tensor,
    scale: Option<&Tensor>,
    dres: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F32);
    let dh = cpu(dh)?;
    let dy = match scale {
        Some(s) => dh.broadcast_mul(&(s + 1.0)?)?,
        None => dh,
    };
    cpu(dres)? + crate::norm::layer_norm_backward(&x.to_dtype(DType::F32)?, w, &dy, eps)?
}
