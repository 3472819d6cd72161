//! Device checks of a LoRA layer's bias columns (`fs_lora_mid_*`, `fs_lora_up_*` in `kernels/adapter.cu`, through
//! `crate::ops::{lora_mid, lora_up}`): against candle's affine, cast and concatenation on the device (the ops the
//! kernels replace, equal bit for bit) and on the CPU, for an activation read in place from a column narrow of a
//! batched product, f32 and bf16.

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, CheckOutcome};
use crate::ops;

/// Every bias-column check: a rank-32 LoRA's activation at 6,144 tokens taken from the middle of a batched q/k/v
/// product (width 40), and odd sizes (rank 5, width 8); scales exact in bf16 and not.
pub fn lora_bias_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(137);
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for (m, r, n, width) in [(6144, 32, 4096, 40), (77, 5, 33, 8)] {
            for scale in [1.0, 0.3] {
                out.extend(mid_checks(dev, rng, dtype, [m, r, width], scale)?);
            }
            out.extend(up_checks(dev, rng, dtype, [n, r, width])?);
        }
    }
    Ok(out)
}

/// `[mid | 1 | 0…]` by concatenation, `mid` = raw · scale: the composition the kernel replaces.
fn composed_mid(raw: &Tensor, scale: f64, width: usize) -> Result<(Tensor, Tensor)> {
    let (m, r) = raw.dims2()?;
    let mid = (raw * scale)?;
    let (dtype, dev) = (mid.dtype(), mid.device());
    let ones = Tensor::ones((m, 1), dtype, dev)?;
    let zeros = Tensor::zeros((m, width - r - 1), dtype, dev)?;
    let mid1 = Tensor::cat(&[&mid, &ones, &zeros], 1)?;
    Ok((mid, mid1))
}

fn mid_checks(
    dev: &Device,
    rng: &mut StdRng,
    dtype: DType,
    [m, r, width]: [usize; 3],
    scale: f64,
) -> Result<Vec<CheckOutcome>> {
    // The activation is the middle third of a batched product's columns, read in place.
    let batched = randn(rng, &[m, 3 * r], 0.0, 1.0, dtype)?;
    let raw = batched.narrow(1, r, r)?;
    let on_device = batched.to_device(dev)?.narrow(1, r, r)?;
    poison(dev)?;
    let (mid, mid1) = ops::lora_mid(&on_device, scale, width)?;
    let (dev_mid, dev_mid1) = composed_mid(&on_device, scale, width)?;
    let (cpu_mid, cpu_mid1) = composed_mid(&raw, scale, width)?;
    let name = format!("LoRA activation [{m}, {r}] → {width} × {scale} {dtype:?}");
    let cpu_tol = if dtype == DType::BF16 { 1e-3 } else { 1e-6 };
    Ok(vec![
        compare(format!("{name}: mid = device ops"), &mid, &dev_mid, 0.0)?,
        compare(
            format!("{name}: with bias column = device ops"),
            &mid1,
            &dev_mid1,
            0.0,
        )?,
        compare(format!("{name}: mid = CPU"), &mid, &cpu_mid, cpu_tol)?,
        compare(
            format!("{name}: with bias column = CPU"),
            &mid1,
            &cpu_mid1,
            cpu_tol,
        )?,
    ])
}

fn up_checks(
    dev: &Device,
    rng: &mut StdRng,
    dtype: DType,
    [n, r, width]: [usize; 3],
) -> Result<Vec<CheckOutcome>> {
    let up = randn(rng, &[n, r], 0.0, 0.1, DType::F32)?;
    let bias = randn(rng, &[n], 0.0, 1.0, dtype)?;
    let composed = |up: &Tensor, bias: &Tensor| -> Result<Tensor> {
        let zeros = Tensor::zeros((n, width - r - 1), dtype, up.device())?;
        Tensor::cat(&[&up.to_dtype(dtype)?, &bias.reshape((n, 1))?, &zeros], 1)
    };
    let (gup, gbias) = (up.to_device(dev)?, bias.to_device(dev)?);
    poison(dev)?;
    let got = ops::lora_up(&gup, &gbias, width)?;
    let name = format!("LoRA up [{n}, {r}] with its bias → {width} {dtype:?}");
    Ok(vec![
        compare(
            format!("{name} = device ops"),
            &got,
            &composed(&gup, &gbias)?,
            0.0,
        )?,
        compare(format!("{name} = CPU"), &got, &composed(&up, &bias)?, 0.0)?,
    ])
}
