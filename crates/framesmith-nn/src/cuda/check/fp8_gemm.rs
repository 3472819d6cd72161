//! Device checks of the FP8 tensor-core products (`nn::cuda::fp8_gemm`): the row-wise activation quantisation
//! against its CPU reference (codes and scales equal to every bit), the cuBLASLt product against an f32 CPU
//! product of the same dequantised operands, and a [`Linear`] marked for FP8 products against the same layer
//! computing in bf16; the same for the input gradient's FP8 product (its quantisation with column factors, the
//! codes' transpose, the product fresh and added to a sum, a layer's backward).

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, poison, randn, random_codes, CheckOutcome};
use crate::cuda::fp8_gemm;
use crate::fp8::{quantize, quantize_rows_reference, Fp8Scale, Fp8Weight};
use crate::linear::{BaseWeight, Linear};

/// Every FP8-product check.
pub fn fp8_gemm_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(109);
    let mut out = Vec::new();
    // A vectorised width, one that is a multiple of 8 but not of 256 · 8, and one that is not a multiple of 8.
    for (rows, cols) in [(64, 5120), (33, 200), (7, 100)] {
        out.extend(quantisation(dev, rng, rows, cols, false)?);
        out.extend(quantisation(dev, rng, rows, cols, true)?);
    }
    for (rows, cols) in [(64, 64), (100, 200), (30, 70), (48, 4096), (5120, 13824)] {
        out.push(transpose(dev, rng, rows, cols)?);
    }
    for (m, n, k) in [(77, 128, 256), (512, 1536, 1536), (3, 48, 4096)] {
        out.push(product(dev, rng, m, n, k)?);
    }
    for (m, n, k, add) in [
        (77, 128, 256, false),
        (512, 1536, 1536, true),
        (300, 640, 4096, true),
    ] {
        out.push(input_grad_product(dev, rng, m, n, k, add)?);
    }
    out.extend(layer(dev, rng)?);
    Ok(out)
}

/// Activations whose rows differ in magnitude by 10^±4, an all-zero row and a row with one outlier.
fn activations(rng: &mut StdRng, rows: usize, cols: usize) -> Result<Tensor> {
    let x = randn(rng, &[rows, cols], 0.0, 1.0, DType::F32)?;
    let magnitudes: Vec<f32> = (0..rows)
        .map(|r| match r % 5 {
            0 => 1e-4,
            1 => 1.0,
            2 => 1e4,
            3 => 0.0,
            _ => 3.0,
        })
        .collect();
    let x = x.broadcast_mul(&Tensor::from_vec(magnitudes, (rows, 1), &Device::Cpu)?)?;
    let mut values = x.flatten_all()?.to_vec1::<f32>()?;
    if rows > 4 {
        values[4 * cols + cols / 2] = 5e3;
    }
    Tensor::from_vec(values, (rows, cols), &Device::Cpu)?.to_dtype(DType::BF16)
}

/// The row quantisation against its CPU reference, with column factors (`scaled`) the reference of `x ·
/// diag(factors)` formed in f32.
fn quantisation(
    dev: &Device,
    rng: &mut StdRng,
    rows: usize,
    cols: usize,
    scaled: bool,
) -> Result<Vec<CheckOutcome>> {
    let x = activations(rng, rows, cols)?;
    let factors = crate::init::uniform(rng, cols, 1e-3, 4.0, &Device::Cpu)?;
    poison(dev)?;
    let (codes, scale, want_codes, want_scale) = if scaled {
        let (codes, scale) =
            fp8_gemm::quantize_rows_scaled(&x.to_device(dev)?, Some(&factors.to_device(dev)?))?;
        let product = x
            .to_dtype(DType::F32)?
            .broadcast_mul(&factors.reshape((1, cols))?)?;
        let (want_codes, want_scale) = quantize_rows_reference(&product)?;
        (codes, scale, want_codes, want_scale)
    } else {
        let (codes, scale) = fp8_gemm::quantize_rows(&x.to_device(dev)?)?;
        let (want_codes, want_scale) = quantize_rows_reference(&x)?;
        (codes, scale, want_codes, want_scale)
    };
    let what = if scaled { " with column factors" } else { "" };
    Ok(vec![
        compare(
            format!("fp8 quantise rows{what} codes [{rows},{cols}]"),
            &codes.to_dtype(DType::F32)?,
            &want_codes.to_dtype(DType::F32)?,
            0.0,
        )?,
        compare(
            format!("fp8 quantise rows{what} scales [{rows},{cols}]"),
            &scale,
            &want_scale,
            0.0,
        )?,
    ])
}

/// The codes' transpose against the CPU's, exactly (edges of partial 64 × 64 tiles included).
fn transpose(dev: &Device, rng: &mut StdRng, rows: usize, cols: usize) -> Result<CheckOutcome> {
    let codes = random_codes(rng, rows, cols)?;
    poison(dev)?;
    let got = fp8_gemm::transpose_bytes(&codes.to_device(dev)?)?;
    compare(
        format!("fp8 codes transposed [{rows},{cols}]"),
        &got.to_dtype(DType::F32)?,
        &codes.t()?.contiguous()?.to_dtype(DType::F32)?,
        0.0,
    )
}

/// The input gradient's FP8 product `dy · W` (W `[n, k]` codes with per-output-channel scales), fresh or added
/// to a sum, against the f32 product of the same quantised operands: `dy · diag(scale)` quantised per row as the
/// CPU reference does, times the bare codes.
fn input_grad_product(
    dev: &Device,
    rng: &mut StdRng,
    m: usize,
    n: usize,
    k: usize,
    add: bool,
) -> Result<CheckOutcome> {
    let dy = activations(rng, m, n)?;
    let codes = random_codes(rng, n, k)?;
    let scale = crate::init::uniform(rng, n, 1e-4, 1e-2, &Device::Cpu)?;
    let acc = randn(rng, &[m, k], 0.0, 1.0, DType::BF16)?;
    poison(dev)?;
    let got = fp8_gemm::fp8_input_grad(
        &dy.to_device(dev)?,
        &codes.to_device(dev)?,
        &scale.to_device(dev)?,
        add.then(|| acc.to_device(dev)).transpose()?,
    )?;
    let scaled = dy
        .to_dtype(DType::F32)?
        .broadcast_mul(&scale.reshape((1, n))?)?;
    let (dq, ds) = quantize_rows_reference(&scaled)?;
    let ones = Tensor::ones(n, DType::F32, &Device::Cpu)?;
    let mut want = dequantised(&dq, &ds)?.matmul(&dequantised(&codes, &ones)?)?;
    if add {
        want = (want + acc.to_dtype(DType::F32)?)?;
    }
    compare(
        format!(
            "fp8 input gradient [{m},{n}]x[{n},{k}]{}",
            if add { " added to a sum" } else { "" }
        ),
        &got,
        &want,
        8e-3,
    )
}

/// The dense values of codes `[r, c]` with one scale per row, in f32 on the CPU.
fn dequantised(codes: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
    Fp8Weight::from_raw(cpu(codes)?, cpu(scale)?, Fp8Scale::Channel)?.dequantize(DType::F32)
}

/// The cuBLASLt product against the f32 product of the same quantised operands: only the accumulation order and
/// the bf16 output rounding differ.
fn product(dev: &Device, rng: &mut StdRng, m: usize, n: usize, k: usize) -> Result<CheckOutcome> {
    let x = activations(rng, m, k)?;
    let codes = random_codes(rng, n, k)?;
    let scale = crate::init::uniform(rng, n, 1e-4, 1e-2, &Device::Cpu)?;
    poison(dev)?;
    let got = fp8_gemm::fp8_linear(
        &x.to_device(dev)?,
        &codes.to_device(dev)?,
        &scale.to_device(dev)?,
    )?;
    let (xq, xs) = quantize_rows_reference(&x)?;
    let want = dequantised(&xq, &xs)?.matmul(&dequantised(&codes, &scale)?.t()?)?;
    compare(
        format!("fp8 product [{m},{k}]x[{k},{n}]"),
        &got,
        &want,
        8e-3,
    )
}

/// A layer marked for FP8 products (its weight re-quantised per channel from block-64 scales) against a dense
/// bf16 layer of the very same weight values: the difference is the activations' e4m3 rounding, a few percent.
fn layer(dev: &Device, rng: &mut StdRng) -> Result<Vec<CheckOutcome>> {
    let (m, n, k) = (300, 640, 1536);
    let w = randn(rng, &[n, k], 0.0, 0.02, DType::F32)?;
    let x = randn(rng, &[2, m / 2, k], 0.0, 1.0, DType::BF16)?.to_device(dev)?;
    let weight = quantize(&w, Fp8Scale::Block64)?.for_fp8_products()?;
    let dense = Linear::from_weights(weight.dequantize(DType::BF16)?.to_device(dev)?, None);
    let products = Linear::from_base(BaseWeight::Fp8(weight.to_device(dev)?), None);
    let dy = randn(rng, &[2, m / 2, n], 0.0, 1.0, DType::BF16)?.to_device(dev)?;
    poison(dev)?;
    let got = products.forward(&x)?;
    let (untracked, tape) = products.forward_untracked(&x)?;
    let want = dense.forward(&x)?;
    let (dx, _) = products.backward(&x, &tape, &dy, true)?;
    let (want_dx, _) = dense.backward(&x, &tape, &dy, true)?;
    // The tracked forward's backward (candle's autograd through the frozen product).
    let var = candle_core::Var::from_tensor(&x)?;
    let grads = (products.forward(var.as_tensor())? * &dy)?
        .sum_all()?
        .backward()?;
    let tracked_dx = grads
        .get(var.as_tensor())
        .ok_or_else(|| candle_core::Error::msg("no input gradient"))?;
    Ok(vec![
        compare("fp8 products layer forward", &got, &want, 6e-2)?,
        compare("fp8 products layer untracked", &untracked, &got, 0.0)?,
        compare(
            "fp8 products layer input gradient",
            dx.as_ref()
                .ok_or_else(|| candle_core::Error::msg("no input gradient"))?,
            want_dx
                .as_ref()
                .ok_or_else(|| candle_core::Error::msg("no input gradient"))?,
            6e-2,
        )?,
        compare(
            "fp8 products layer input gradient, tracked",
            tracked_dx,
            dx.as_ref()
                .ok_or_else(|| candle_core::Error::msg("no input gradient"))?,
            1e-2,
        )?,
    ])
}
