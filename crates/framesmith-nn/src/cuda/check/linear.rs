//! Device checks of a LoRA [`Linear`] outside autograd (`forward_untracked`, `backward_with`), the path every
//! hand-written block backward takes: on CUDA the low-rank products are written first and the base product
//! accumulates onto them in place, against the same layer in f32 on the CPU, with and without a bias, over a
//! dense and an FP8 base, for each way the input gradient is wanted (fresh, added to a sum, none).

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, CheckOutcome};
use crate::fp8::{quantize, Fp8Scale};
use crate::linear::{BaseWeight, InputGrad, Linear};
use crate::lora::Lora;

/// Every untracked-linear check.
pub fn linear_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(113);
    let mut out = Vec::new();
    for fp8 in [false, true] {
        for bias in [false, true] {
            // An aligned shape like Wan's, and one whose rows and widths are not multiples of 8.
            for (m, n, k) in [(512, 384, 256), (77, 100, 72)] {
                out.extend(layer(dev, rng, fp8, bias, [m, n, k])?);
            }
        }
    }
    out.extend(shared(dev, rng)?);
    Ok(out)
}

/// Three layers on one input (`q`, `k`, `v`: different ranks and widths, one with a bias) through the batched
/// `forward_untracked_shared` / `backward_shared` against the separate calls on the same device.
fn shared(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let (m, k) = (300, 256);
    let mut lins = Vec::new();
    for (n, rank, bias) in [(256, 16, true), (128, 8, false), (256, 4, false)] {
        let w = randn(rng, &[n, k], 0.0, 0.05, DType::BF16)?.to_device(dev)?;
        let b = randn(rng, &[n], 0.0, 0.5, DType::BF16)?.to_device(dev)?;
        let mut lin = Linear::from_weights(w, bias.then_some(b));
        let down = randn(rng, &[rank, k], 0.0, 0.1, DType::F32)?.to_device(dev)?;
        let up = randn(rng, &[n, rank], 0.0, 0.1, DType::F32)?.to_device(dev)?;
        lin.set_lora(Some(Lora::from_tensors(&down, &up, rank as f64)?));
        lins.push(lin);
    }
    let refs: Vec<&Linear> = lins.iter().collect();
    let x = randn(rng, &[1, m, k], 0.0, 1.0, DType::BF16)?.to_device(dev)?;
    let acc = randn(rng, &[1, m, k], 0.0, 1.0, DType::BF16)?.to_device(dev)?;
    poison(dev)?;
    let batched = Linear::forward_untracked_shared(&refs, &x)?;
    let mut out = Vec::new();
    let mut dys = Vec::new();
    for (i, ((y, _), lin)) in batched.iter().zip(&lins).enumerate() {
        let (want, _) = lin.forward_untracked(&x)?;
        out.push(compare(
            format!("shared linears forward {i}"),
            y,
            &want,
            5e-3,
        )?);
        dys.push(randn(rng, y.dims(), 0.0, 1.0, DType::BF16)?.to_device(dev)?);
    }
    let tapes: Vec<_> = batched.iter().map(|(_, t)| t).collect();
    for (case, input) in [
        ("fresh", InputGrad::New),
        ("added", InputGrad::Add(acc.copy()?)),
    ] {
        let (dx, grads) = Linear::backward_shared(&refs, &x, &tapes, &dys, input)?;
        let mut want = (case == "added")
            .then(|| acc.to_dtype(DType::F32))
            .transpose()?;
        let mut want_grads = Vec::new();
        for ((lin, tape), dy) in lins.iter().zip(&tapes).zip(&dys) {
            let (d, g) = lin.backward(&x, tape, dy, true)?;
            let d = d
                .ok_or_else(|| missing("shared linears"))?
                .to_dtype(DType::F32)?;
            want = Some(match want {
                Some(w) => (w + d)?,
                None => d,
            });
            want_grads.extend(g);
        }
        let (dx, want) = (
            dx.ok_or_else(|| missing("shared linears"))?,
            want.ok_or_else(|| missing("shared"))?,
        );
        out.push(compare(
            format!("shared linears input gradient ({case})"),
            &dx,
            &want,
            5e-3,
        )?);
        for (i, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            out.push(compare(
                format!("shared linears LoRA gradient {i} ({case})"),
                &g.grad,
                &w.grad,
                5e-3,
            )?);
        }
    }
    Ok(out)
}

/// One layer (rank 16, scale 1.5 · 0.8) on `dev` in bf16 against its f32 twin on the CPU holding the same
/// (rounded) values.
fn layer(
    dev: &Device,
    rng: &mut StdRng,
    fp8: bool,
    bias: bool,
    [m, n, k]: [usize; 3],
) -> Result<Vec<CheckOutcome>> {
    let rank = 16;
    let w = randn(rng, &[n, k], 0.0, 0.05, DType::F32)?;
    let b = randn(rng, &[n], 0.0, 0.5, DType::BF16)?.to_dtype(DType::F32)?;
    let down = randn(rng, &[rank, k], 0.0, 0.1, DType::BF16)?.to_dtype(DType::F32)?;
    let up = randn(rng, &[n, rank], 0.0, 0.1, DType::BF16)?.to_dtype(DType::F32)?;
    let x = randn(rng, &[2, m, k], 0.0, 1.0, DType::BF16)?;
    let dy = randn(rng, &[2, m, n], 0.0, 1.0, DType::BF16)?;
    let acc = randn(rng, &[2, m, k], 0.0, 1.0, DType::BF16)?;
    let build = |device: &Device, dtype: DType| -> Result<Linear> {
        let base = if fp8 {
            BaseWeight::Fp8(quantize(&w, Fp8Scale::Block64)?.to_device(device)?)
        } else {
            BaseWeight::Dense(
                w.to_dtype(DType::BF16)?
                    .to_dtype(dtype)?
                    .to_device(device)?,
            )
        };
        let bias = if bias {
            Some(b.to_dtype(dtype)?.to_device(device)?)
        } else {
            None
        };
        let mut lin = Linear::from_base(base, bias);
        let mut lora = Lora::from_tensors(
            &down.to_device(device)?,
            &up.to_device(device)?,
            1.5 * rank as f64,
        )?;
        lora.multiplier = 0.8;
        lin.set_lora(Some(lora));
        Ok(lin)
    };
    let (gpu, cpu) = (build(dev, DType::BF16)?, build(&Device::Cpu, DType::F32)?);
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let name = format!(
        "untracked linear {}{} [{m}, {k}] -> {n}",
        if fp8 { "fp8 block64" } else { "bf16" },
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
    let (dx, dx_ref) = (
        dx.ok_or_else(|| missing(&name))?,
        dx_ref.ok_or_else(|| missing(&name))?,
    );
    out.push(compare(
        format!("{name} input gradient"),
        &dx,
        &dx_ref,
        1e-2,
    )?);
    for ((g, r), which) in grads.iter().zip(&grads_ref).zip(["down", "up"]) {
        out.push(compare(format!("{name} d{which}"), &g.grad, &r.grad, 1e-2)?);
    }
    let (sum, _) = gpu.backward_with(
        &x.to_device(dev)?,
        &tape,
        &dy.to_device(dev)?,
        InputGrad::Add(acc.to_device(dev)?.copy()?),
    )?;
    let want = (f32(&acc)? + &dx_ref)?;
    out.push(compare(
        format!("{name} input gradient added"),
        &sum.ok_or_else(|| missing(&name))?,
        &want,
        1e-2,
    )?);
    let (none, _) = gpu.backward_with(
        &x.to_device(dev)?,
        &tape,
        &dy.to_device(dev)?,
        InputGrad::Skip,
    )?;
    out.push(CheckOutcome {
        name: format!("{name} no input gradient when skipped"),
        rel_err: if none.is_none() { 0.0 } else { f64::NAN },
        max_abs: 0.0,
        tol: 0.0,
    });
    Ok(out)
}

fn missing(name: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{name}: no input gradient"))
}
