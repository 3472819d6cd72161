//! Device checks of the adapters' kernels (`kernels/adapter.cu` through `crate::ops`: LoHa's pair products and
//! their gradients, DoRA's row norms, the merged weights) against the candle compositions on the CPU, and of LoHa,
//! DoRA and LoKr layers outside autograd (`forward_untracked`, `backward_with`) in bf16 on the device against their
//! f32 twins on the CPU holding the same values (LoKr at 300 rows runs its forward on the merged weight, at 16
//! through its factors).

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, CheckOutcome};
use crate::adapter::{Adapter, AdapterKind, AdapterShape};
use crate::linear::{BaseWeight, InputGrad, Linear};
use crate::ops;

/// Every adapter check.
pub fn adapter_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(131);
    let mut out = Vec::new();
    // FLUX.1's rank 16 on a 3072-wide layer, and sizes that are multiples of nothing.
    for [n, r] in [[3072, 16], [77, 5]] {
        out.extend(pair_checks(dev, rng, [n, r])?);
        out.extend(norm_checks(dev, rng, [n, r])?);
    }
    out.extend(add_product_checks(dev, rng)?);
    out.extend(add_kron_checks(dev, rng)?);
    let lokr = AdapterKind::Lokr {
        factor: -1,
        decompose_both: false,
        full_matrix: false,
    };
    for kind in [AdapterKind::Loha, AdapterKind::Dora, lokr] {
        for bias in [false, true] {
            out.extend(layer(dev, rng, kind, bias, [300, 384, 256])?);
        }
    }
    for bias in [false, true] {
        out.extend(layer(dev, rng, lokr, bias, [16, 384, 256])?);
    }
    Ok(out)
}

/// `pair_products` (row and column factors, f32 and bf16 outputs) and its backward (f32 and bf16 gradients).
fn pair_checks(dev: &Device, rng: &mut StdRng, [n, r]: [usize; 2]) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    let scale = 0.75;
    for columns in [false, true] {
        let shape = if columns { [r, n] } else { [n, r] };
        let a = randn(rng, &shape, 0.0, 1.0, DType::F32)?;
        let b = randn(rng, &shape, 0.0, 1.0, DType::F32)?;
        let (ga, gb) = (a.to_device(dev)?, b.to_device(dev)?);
        let name = format!("pair products [{n}, {r}] columns {columns}");
        for dtype in [DType::F32, DType::BF16] {
            poison(dev)?;
            let got = ops::pair_products(&ga, &gb, columns, scale, dtype)?;
            let want = ops::pair_products(&a, &b, columns, scale, dtype)?;
            let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-6 };
            out.push(compare(format!("{name} {dtype:?}"), &got, &want, tol)?);
            let d = randn(rng, &[n, r * r], 0.0, 1.0, dtype)?;
            poison(dev)?;
            let (da, db) =
                ops::pair_products_backward(&d.to_device(dev)?, &ga, &gb, columns, scale)?;
            let (wa, wb) = ops::pair_products_backward(&d, &a, &b, columns, scale)?;
            out.push(compare(
                format!("{name} backward {dtype:?} ∂a"),
                &da,
                &wa,
                1e-5,
            )?);
            out.push(compare(
                format!("{name} backward {dtype:?} ∂b"),
                &db,
                &wb,
                1e-5,
            )?);
        }
    }
    Ok(out)
}

/// `add_product` in f32 and bf16, on a vectorised length and on an odd one: the same roundings as the CPU's.
fn add_product_checks(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for shape in [[384, 256], [77, 5]] {
            let w = randn(rng, &shape, 0.0, 0.3, dtype)?;
            let p1 = randn(rng, &shape, 0.0, 1.0, dtype)?;
            let p2 = randn(rng, &shape, 0.0, 1.0, dtype)?;
            let on = |t: &Tensor| t.to_device(dev);
            poison(dev)?;
            let got = ops::add_product(&on(&w)?, &on(&p1)?, &on(&p2)?)?;
            let want = ops::add_product(&w, &p1, &p2)?;
            out.push(compare(
                format!("add product {dtype:?} {shape:?}"),
                &got,
                &want,
                1e-7,
            )?);
        }
    }
    Ok(out)
}

/// `add_kron` in f32 and bf16 on FLUX.1's qkv factors (vectorised), on a `d` not a multiple of 8 and on a single
/// `w1` entry: the same roundings as the CPU's (the product and the sum in f32, rounded once).
fn add_kron_checks(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for [a, b, c, d] in [[96, 48, 96, 64], [6, 4, 5, 7], [1, 1, 127, 24]] {
            let w = randn(rng, &[a * c, b * d], 0.0, 0.3, dtype)?;
            let w1 = randn(rng, &[a, b], 0.0, 1.0, dtype)?;
            let w2 = randn(rng, &[c, d], 0.0, 0.1, dtype)?;
            let on = |t: &Tensor| t.to_device(dev);
            poison(dev)?;
            let got = ops::add_kron(&on(&w)?, &on(&w1)?, &on(&w2)?)?;
            let want = ops::add_kron(&w, &w1, &w2)?;
            out.push(compare(
                format!("add kron {dtype:?} w1 [{a}, {b}] w2 [{c}, {d}]"),
                &got,
                &want,
                1e-7,
            )?);
        }
    }
    Ok(out)
}

/// `dora_row_norms` with `A Wᵀ` in f32 and in bf16.
fn norm_checks(dev: &Device, rng: &mut StdRng, [out, r]: [usize; 2]) -> Result<Vec<CheckOutcome>> {
    let squares = randn(rng, &[out, 1], 0.0, 1.0, DType::F32)?.sqr()?;
    let up = randn(rng, &[out, r], 0.0, 0.3, DType::F32)?;
    let down = randn(rng, &[r, 64], 0.0, 0.3, DType::F32)?;
    let gram = down.matmul(&down.t()?)?;
    let mut checks = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let wa = randn(rng, &[r, out], 0.0, 0.3, dtype)?;
        let on = |t: &Tensor| t.to_device(dev);
        poison(dev)?;
        let got =
            ops::dora_row_norms(&on(&squares)?, &on(&up)?, &on(&wa)?, &on(&gram)?, 0.6, 1e-7)?;
        let want = ops::dora_row_norms(&squares, &up, &wa, &gram, 0.6, 1e-7)?;
        checks.push(compare(
            format!("DoRA row norms [{out}, {r}] A Wᵀ {dtype:?}"),
            &got,
            &want,
            1e-5,
        )?);
    }
    Ok(checks)
}

/// A layer with an adapter of `kind` (rank 8, every factor random) in bf16 on `dev` against its f32 twin on the
/// CPU: forward, input gradient (fresh and added to a sum) and every factor's gradient.
fn layer(
    dev: &Device,
    rng: &mut StdRng,
    kind: AdapterKind,
    bias: bool,
    [m, n, k]: [usize; 3],
) -> Result<Vec<CheckOutcome>> {
    let rank = 8;
    let w = randn(rng, &[n, k], 0.0, 0.05, DType::BF16)?.to_dtype(DType::F32)?;
    let b = randn(rng, &[n], 0.0, 0.5, DType::BF16)?.to_dtype(DType::F32)?;
    let shape = AdapterShape {
        in_dim: k,
        out_dim: n,
        rank,
        alpha: rank as f64 / 2.0,
        dtype: DType::F32,
    };
    let mut adapter = Adapter::new(kind, shape, &BaseWeight::Dense(w.clone()), rng)?;
    for (name, v) in adapter.named_vars() {
        let noise = randn(rng, v.dims(), 0.0, 0.2, DType::F32)?;
        let value = if name == "dora_scale" {
            (v.as_tensor() * (noise + 1.0)?)?
        } else {
            noise
        };
        v.set(&value)?;
    }
    adapter.set_multiplier(0.8);
    let build = |device: &Device, dtype: DType| -> Result<Linear> {
        let base = BaseWeight::Dense(w.to_dtype(dtype)?.to_device(device)?);
        let bias = bias
            .then(|| b.to_dtype(dtype)?.to_device(device))
            .transpose()?;
        let mut lin = Linear::from_base(base, bias);
        let moved = adapter.map_vars(|_, v| Var::from_tensor(&v.as_tensor().to_device(device)?))?;
        lin.set_adapter(Some(moved));
        Ok(lin)
    };
    let (gpu, cpu) = (build(dev, DType::BF16)?, build(&Device::Cpu, DType::F32)?);
    let x = randn(rng, &[1, m, k], 0.0, 1.0, DType::BF16)?;
    let dy = randn(rng, &[1, m, n], 0.0, 1.0, DType::BF16)?;
    let acc = randn(rng, &[1, m, k], 0.0, 1.0, DType::BF16)?;
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let name = format!(
        "{} linear{} [{m}, {k}] -> {n}",
        kind.name(),
        if bias { " + bias" } else { "" }
    );
    poison(dev)?;
    let (y, tape) = gpu.forward_untracked(&x.to_device(dev)?)?;
    let (y_ref, tape_ref) = cpu.forward_untracked(&f32(&x)?)?;
    let mut out = vec![compare(format!("{name} forward"), &y, &y_ref, 1e-2)?];
    let (dx, grads) = gpu.backward_with(
        &x.to_device(dev)?,
        &tape,
        &dy.to_device(dev)?,
        InputGrad::New,
    )?;
    let (dx_ref, grads_ref) =
        cpu.backward_with(&f32(&x)?, &tape_ref, &f32(&dy)?, InputGrad::New)?;
    let missing = || candle_core::Error::Msg(format!("{name}: no input gradient"));
    let dx_ref = dx_ref.ok_or_else(missing)?;
    out.push(compare(
        format!("{name} input gradient"),
        &dx.ok_or_else(missing)?,
        &dx_ref,
        1e-2,
    )?);
    for ((g, r), (var, _)) in grads.iter().zip(&grads_ref).zip(adapter.named_vars()) {
        out.push(compare(format!("{name} ∂{var}"), &g.grad, &r.grad, 2e-2)?);
    }
    let added = InputGrad::Add(acc.to_device(dev)?.copy()?);
    let (sum, _) = gpu.backward_with(&x.to_device(dev)?, &tape, &dy.to_device(dev)?, added)?;
    out.push(compare(
        format!("{name} input gradient added"),
        &sum.ok_or_else(missing)?,
        &(f32(&acc)? + &dx_ref)?,
        1e-2,
    )?);
    Ok(out)
}
