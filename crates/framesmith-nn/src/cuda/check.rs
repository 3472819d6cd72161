//! Device checks: every kernel against its CPU reference on seeded random inputs (the same on every run), forward and gradients. Run by
//! the `#[test]`s below (cuda builds, on a machine with a GPU) and by `framesmith-bench check` on the test
//! machine. References run in f32 on the CPU from the same (rounded) input values; NaN never passes.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{elementwise, fp8, norm, rope};
use crate::init;

mod adapter;
mod fp8_gemm;
mod gemm_bias;
mod head_gate;
mod linear;
mod lora_bias;
mod mixed;
mod norm_mod;
mod optim;
mod optim_multi;
mod rms_halves;
mod rms_rope;

pub use crate::device::CheckOutcome;

/// Compares `got` with `want` (any devices / float dtypes) in f64 on the CPU.
pub fn compare(
    name: impl Into<String>,
    got: &Tensor,
    want: &Tensor,
    tol: f64,
) -> Result<CheckOutcome> {
    let name = name.into();
    if got.dims() != want.dims() {
        candle_core::bail!("{name}: shape {:?} against {:?}", got.dims(), want.dims());
    }
    let g = got
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let w = want
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let (mut diff2, mut ref2, mut max_abs) = (0f64, 0f64, 0f64);
    for (a, b) in g.iter().zip(&w) {
        let d = a - b;
        diff2 += d * d;
        ref2 += b * b;
        max_abs = if d.abs() > max_abs || d.is_nan() {
            d.abs()
        } else {
            max_abs
        };
    }
    let rel_err = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    let rel_err = if g.iter().chain(&w).any(|v| v.is_nan()) {
        f64::NAN
    } else {
        rel_err
    };
    Ok(CheckOutcome {
        name,
        rel_err,
        max_abs,
        tol,
    })
}

/// Fills and frees a block of device memory with NaN so that outputs a kernel fails to write show up as NaN
/// (the stream-ordered allocator hands the same memory out again).
fn poison(dev: &Device) -> Result<()> {
    let t = Tensor::full(f32::NAN, 8 << 20, dev)?;
    drop(t);
    Ok(())
}

fn tol(dtype: DType, f32_tol: f64) -> f64 {
    if dtype == DType::BF16 {
        2e-2
    } else {
        f32_tol
    }
}

/// Seeds the random probe `sum(out · probe)` is differentiated along (the same probe for every case's shape).
const PROBE_SEED: u64 = 100;

type Op<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;

/// Runs `device_op` on `dev` and `reference` on the CPU in f32 from the same inputs, and compares the output
/// and the gradients of the inputs marked in `wants_grad` (of the loss `sum(out · probe)`, probe random).
fn fwd_bwd_case(
    name: &str,
    dev: &Device,
    inputs: &[Tensor],
    wants_grad: &[bool],
    device_op: Op,
    reference: Op,
) -> Result<Vec<CheckOutcome>> {
    poison(dev)?;
    let gpu_vars = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_device(dev)?))
        .collect::<Result<Vec<_>>>()?;
    let cpu_vars = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_dtype(DType::F32)?))
        .collect::<Result<Vec<_>>>()?;
    let gpu_in: Vec<Tensor> = gpu_vars.iter().map(|v| v.as_tensor().clone()).collect();
    let cpu_in: Vec<Tensor> = cpu_vars.iter().map(|v| v.as_tensor().clone()).collect();
    let got = device_op(&gpu_in)?;
    let want = reference(&cpu_in)?;
    let probe = randn(
        &mut StdRng::seed_from_u64(PROBE_SEED),
        want.dims(),
        0.0,
        1.0,
        DType::F32,
    )?;
    let dtype = got.dtype();
    let mut out = vec![compare(
        format!("{name} forward"),
        &got,
        &want,
        tol(dtype, 1e-5),
    )?];
    let g_grads = (got.to_dtype(DType::F32)? * probe.to_device(dev)?)?
        .sum_all()?
        .backward()?;
    let c_grads = (want * &probe)?.sum_all()?.backward()?;
    for (i, wanted) in wants_grad.iter().enumerate() {
        if !wanted {
            continue;
        }
        let label = format!("{name} grad[{i}]");
        let (Some(g), Some(c)) = (
            g_grads.get(gpu_vars[i].as_tensor()),
            c_grads.get(cpu_vars[i].as_tensor()),
        ) else {
            candle_core::bail!("{label}: gradient missing");
        };
        // A gradient that flows back through a bf16 output (or into a bf16 input) carries bf16 rounding even when
        // the input itself is f32 (the modulation vectors).
        let grad_dtype = if dtype == DType::BF16 {
            dtype
        } else {
            inputs[i].dtype()
        };
        out.push(compare(label, g, c, tol(grad_dtype, 1e-4))?);
    }
    Ok(out)
}

/// Normal samples on the CPU from the check's seeded generator, so a check sees the same inputs on every run.
fn randn(rng: &mut StdRng, shape: &[usize], mean: f32, std: f32, dtype: DType) -> Result<Tensor> {
    init::randn(rng, shape, mean, std, &Device::Cpu)?.to_dtype(dtype)
}

/// RMSNorm and LayerNorm (with and without affine parameters), f32 and bf16.
pub fn norm_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(101);
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let x = randn(rng, &[2, 37, 1536], 0.5, 3.0, dtype)?;
        let w = randn(rng, &[1536], 1.0, 0.1, dtype)?;
        let b = randn(rng, &[1536], 0.0, 0.1, dtype)?;
        let inputs = [x, w, b];
        let eps = 1e-6;
        out.extend(fwd_bwd_case(
            &format!("rms_norm {dtype:?} [2,37,1536]"),
            dev,
            &inputs[..2],
            &[true, true],
            &|t| norm::rms_norm(&t[0], Some(&t[1]), eps),
            &|t| crate::norm::rms_norm_portable(&t[0], Some(&t[1]), eps),
        )?);
        out.extend(fwd_bwd_case(
            &format!("layer_norm affine {dtype:?} [2,37,1536]"),
            dev,
            &inputs,
            &[true, true, true],
            &|t| norm::layer_norm(&t[0], Some(&t[1]), Some(&t[2]), eps),
            &|t| crate::norm::layer_norm_portable(&t[0], Some(&t[1]), Some(&t[2]), eps),
        )?);
        out.extend(fwd_bwd_case(
            &format!("layer_norm plain {dtype:?} [2,37,1536]"),
            dev,
            &inputs[..1],
            &[true],
            &|t| norm::layer_norm(&t[0], None, None, eps),
            &|t| crate::norm::layer_norm_portable(&t[0], None, None, eps),
        )?);
    }
    Ok(out)
}

/// Modulation (per sample and per token), gated residual (f32 and bf16 residual stream) and GELU-tanh.
pub fn elementwise_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(102);
    let mut out = Vec::new();
    let (b, l, d) = (2, 33, 1536);
    for dtype in [DType::F32, DType::BF16] {
        for mod_tokens in [1, l] {
            let inputs = [
                randn(rng, &[b, l, d], 0.0, 1.0, dtype)?,
                randn(rng, &[b, mod_tokens, d], 0.0, 0.5, DType::F32)?,
                randn(rng, &[b, mod_tokens, d], 0.0, 0.5, DType::F32)?,
            ];
            out.extend(fwd_bwd_case(
                &format!("modulate {dtype:?} mod [{b},{mod_tokens},{d}]"),
                dev,
                &inputs,
                &[true, true, true],
                &|t| elementwise::modulate(&t[0], &t[1], &t[2]),
                &|t| elementwise::modulate_reference(&t[0], &t[1], &t[2]),
            )?);
            out.extend(fwd_bwd_case(
                &format!("gated_residual {dtype:?} gate [{b},{mod_tokens},{d}]"),
                dev,
                &inputs[..2],
                &[true, true],
                &|t| elementwise::gated_residual(&t[0], &t[0].affine(0.5, 0.1)?, &t[1]),
                &|t| elementwise::gated_residual_reference(&t[0], &t[0].affine(0.5, 0.1)?, &t[1]),
            )?);
        }
        out.extend(fwd_bwd_case(
            &format!("gelu_tanh {dtype:?} [3,1000]"),
            dev,
            &[randn(rng, &[3, 1000], 0.0, 2.0, dtype)?],
            &[true],
            &|t| elementwise::gelu_tanh(&t[0]),
            &|t| elementwise::gelu_tanh_reference(&t[0]),
        )?);
    }
    Ok(out)
}

/// Rotary embedding with random angle tables, f32 and bf16; the input gradient is the inverse rotation.
pub fn rope_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(103);
    let mut out = Vec::new();
    let (b, l, h, d) = (2, 40, 3, 128);
    let angles = init::uniform(rng, (b, l, 1, d / 2), -10.0, 10.0, &Device::Cpu)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    for dtype in [DType::F32, DType::BF16] {
        let (c_dev, s_dev) = (cos.to_device(dev)?, sin.to_device(dev)?);
        out.extend(fwd_bwd_case(
            &format!("rope {dtype:?} [{b},{l},{h},{d}]"),
            dev,
            &[randn(rng, &[b, l, h, d], 0.0, 1.0, dtype)?],
            &[true],
            &|t| rope::rope_apply(&t[0], &c_dev, &s_dev),
            &|t| rope::rope_reference(&t[0], &cos, &sin),
        )?);
    }
    Ok(out)
}

type Direct = Box<dyn Fn(&Tensor, &Tensor) -> Result<Tensor>>;
type Reference = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;

/// The input-gradient functions used outside autograd (`*_backward`) against the reference's gradient of
/// `sum(y · dy)`.
pub fn direct_backward_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(104);
    let (l, d, h, hd) = (37, 1536, 3, 128);
    let w = randn(rng, &[d], 1.0, 0.1, DType::F32)?;
    let scale = randn(rng, &[2, 1, d], 0.0, 0.5, DType::F32)?;
    let shift = scale.zeros_like()?;
    let angles = init::uniform(rng, (2, l, 1, hd / 2), -10.0, 10.0, &Device::Cpu)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    let (wg, sg, cg, ssg) = (
        w.to_device(dev)?,
        scale.to_device(dev)?,
        cos.to_device(dev)?,
        sin.to_device(dev)?,
    );
    let eps = 1e-6;
    let cases: Vec<(&str, Vec<usize>, Direct, Reference)> = vec![
        (
            "rms_norm_backward",
            vec![2, l, d],
            {
                let wg = wg.clone();
                Box::new(move |x, dy| norm::rms_norm_backward(x, Some(&wg), dy, eps))
            },
            {
                let w = w.clone();
                Box::new(move |t| crate::norm::rms_norm_portable(&t[0], Some(&w), eps))
            },
        ),
        (
            "layer_norm_backward",
            vec![2, l, d],
            Box::new(move |x, dy| norm::layer_norm_backward(x, Some(&wg), dy, eps)),
            Box::new(move |t| crate::norm::layer_norm_portable(&t[0], Some(&w), None, eps)),
        ),
        (
            "modulate_backward",
            vec![2, l, d],
            Box::new(move |_, dy| elementwise::modulate_backward(dy, &sg)),
            Box::new(move |t| elementwise::modulate_reference(&t[0], &scale, &shift)),
        ),
        (
            "gelu_tanh_backward",
            vec![2, l, d],
            Box::new(elementwise::gelu_tanh_backward),
            Box::new(|t| elementwise::gelu_tanh_reference(&t[0])),
        ),
        (
            "rope_backward",
            vec![2, l, h, hd],
            Box::new(move |_, dy| rope::rope_backward(dy, &cg, &ssg)),
            Box::new(move |t| rope::rope_reference(&t[0], &cos, &sin)),
        ),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for (name, shape, direct, reference) in &cases {
            poison(dev)?;
            let x = randn(rng, shape, 0.5, 2.0, dtype)?;
            let dy = randn(rng, shape, 0.0, 1.0, dtype)?;
            let got = direct(&x.to_device(dev)?, &dy.to_device(dev)?)?;
            let xv = Var::from_tensor(&x.to_dtype(DType::F32)?)?;
            let y = reference(&[xv.as_tensor().clone()])?;
            let grads = (y * dy.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
            let Some(want) = grads.get(xv.as_tensor()) else {
                candle_core::bail!("{name}: reference gradient missing");
            };
            out.push(compare(
                format!("{name} {dtype:?} {shape:?}"),
                &got,
                want,
                tol(dtype, 1e-4),
            )?);
        }
    }
    Ok(out)
}

/// Random e4m3fn codes (NaN codes excluded) as `U8`.
fn random_codes(rng: &mut StdRng, rows: usize, cols: usize) -> Result<Tensor> {
    let u = init::uniform(rng, (rows, cols), 0.0, 254.0, &Device::Cpu)?.to_vec2::<f32>()?;
    let codes: Vec<u8> = u
        .into_iter()
        .flatten()
        .map(|v| {
            let c = v.floor().clamp(0.0, 253.0) as u8;
            // Skip 0x7f (NaN): shift codes at and above it by one; 0xff is never drawn.
            if c >= 0x7f {
                c + 1
            } else {
                c
            }
        })
        .collect();
    Tensor::from_vec(codes, (rows, cols), &Device::Cpu)
}

/// FP8 dequantisation: per tensor, per channel and block-64 scales; vectorised (cols % 8 == 0) and scalar
/// paths; bf16 and f32 outputs. Both sides round the same f32 products, so the tolerance is tight.
pub fn fp8_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(105);
    let mut out = Vec::new();
    for (rows, cols) in [(96, 1536), (33, 200)] {
        let codes = random_codes(rng, rows, cols)?;
        let scales = [
            ("tensor", init::uniform(rng, 1, 0.001, 0.01, &Device::Cpu)?),
            (
                "channel",
                init::uniform(rng, rows, 0.001, 0.01, &Device::Cpu)?,
            ),
            (
                "block64",
                init::uniform(
                    rng,
                    (rows, cols.div_ceil(crate::fp8::BLOCK_SIZE)),
                    0.001,
                    0.01,
                    &Device::Cpu,
                )?,
            ),
        ];
        for (mode, scale) in &scales {
            for dtype in [DType::BF16, DType::F32] {
                poison(dev)?;
                let got = fp8::dequantize_fp8_cuda(
                    &codes.to_device(dev)?,
                    &scale.to_device(dev)?,
                    dtype,
                )?;
                let want = fp8::dequantize_fp8_reference(&codes, scale, dtype)?;
                out.push(compare(
                    format!("fp8 {mode} -> {dtype:?} [{rows},{cols}]"),
                    &got,
                    &want,
                    1e-7,
                )?);
            }
        }
    }
    Ok(out)
}

/// cuDNN fused attention against the reference: self attention with and without key lengths, and cross
/// attention over padded text keys; output and the three input gradients.
#[cfg(feature = "cudnn")]
pub fn attention_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(106);
    use crate::attention::naive_attention;
    let mut out = Vec::new();
    let (b, h, d) = (2, 4, 128);
    for (lq, lk, lens) in [
        (300, 300, None),
        (300, 300, Some(vec![300, 211])),
        (300, 77, Some(vec![77, 50])),
    ] {
        let inputs = [
            randn(rng, &[b, lq, h, d], 0.0, 1.0, DType::BF16)?,
            randn(rng, &[b, lk, h, d], 0.0, 1.0, DType::BF16)?,
            randn(rng, &[b, lk, h, d], 0.0, 1.0, DType::BF16)?,
        ];
        let lens_ref = lens.as_deref();
        out.extend(fwd_bwd_case(
            &format!("cudnn attention q [{b},{lq},{h},{d}] k [{b},{lk}] lens {lens:?}"),
            dev,
            &inputs,
            &[true, true, true],
            &|t| super::attention::attention(&t[0], &t[1], &t[2], lens_ref),
            &|t| naive_attention(&t[0], &t[1], &t[2], lens_ref),
        )?);
    }
    Ok(out)
}

/// The non-autograd forward+backward entry point against the reference's gradients of `sum(o · d_o)`.
#[cfg(feature = "cudnn")]
pub fn attention_direct_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    let rng = &mut StdRng::seed_from_u64(107);
    use crate::attention::naive_attention;
    let (b, lq, lk, h, d) = (2, 200, 150, 2, 128);
    let lens = [150, 97];
    let q = randn(rng, &[b, lq, h, d], 0.0, 1.0, DType::BF16)?;
    let k = randn(rng, &[b, lk, h, d], 0.0, 1.0, DType::BF16)?;
    let v = randn(rng, &[b, lk, h, d], 0.0, 1.0, DType::BF16)?;
    let d_o = randn(rng, &[b, lq, h, d], 0.0, 1.0, DType::BF16)?;
    poison(dev)?;
    let on = |t: &Tensor| t.to_device(dev);
    let (o, dq, dk, dv) = super::attention::attention_forward_backward(
        &on(&q)?,
        &on(&k)?,
        &on(&v)?,
        &on(&d_o)?,
        Some(&lens),
    )?;
    let vars = [&q, &k, &v].map(|t| t.to_dtype(DType::F32).and_then(|t| Var::from_tensor(&t)));
    let [qv, kv, vv] = vars;
    let (qv, kv, vv) = (qv?, kv?, vv?);
    let o_ref = naive_attention(qv.as_tensor(), kv.as_tensor(), vv.as_tensor(), Some(&lens))?;
    let grads = (&o_ref * d_o.to_dtype(DType::F32)?)?
        .sum_all()?
        .backward()?;
    let grad = |v: &Var| {
        grads
            .get(v.as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::Msg("gradient missing".into()))
    };
    let name =
        format!("cudnn attention_forward_backward q [{b},{lq},{h},{d}] k [{b},{lk}] lens {lens:?}");
    Ok(vec![
        compare(format!("{name} o"), &o, &o_ref, 2e-2)?,
        compare(format!("{name} dq"), &dq, &grad(&qv)?, 2e-2)?,
        compare(format!("{name} dk"), &dk, &grad(&kv)?, 2e-2)?,
        compare(format!("{name} dv"), &dv, &grad(&vv)?, 2e-2)?,
    ])
}

/// Every check this build has.
pub fn run_all(dev: &Device) -> Result<Vec<CheckOutcome>> {
    run_groups(dev, &[])
}

/// One group of checks: its name (what [`run_groups`] is given) and how it runs.
type Group = (&'static str, fn(&Device) -> Result<Vec<CheckOutcome>>);

/// Every group of checks, in the order [`run_all`] runs them.
const GROUPS: &[Group] = &[
    ("fp8", fp8_checks),
    ("fp8_gemm", fp8_gemm::fp8_gemm_checks),
    ("linear", linear::linear_checks),
    ("norm", norm_checks),
    ("elementwise", elementwise_checks),
    ("rope", rope_checks),
    ("direct_backward", direct_backward_checks),
    ("mixed", mixed::mixed_checks),
    ("norm_mod", norm_mod::norm_mod_checks),
    ("rms_rope", rms_rope::rms_rope_checks),
    ("rms_halves", rms_halves::rms_halves_checks),
    ("head_gate", head_gate::head_gate_checks),
    ("optim", optim::optim_checks),
    ("optim_multi", optim_multi::optim_multi_checks),
    ("adapter", adapter::adapter_checks),
    ("lora_bias", lora_bias::lora_bias_checks),
    ("gemm_bias", gemm_bias::gemm_bias_checks),
    #[cfg(feature = "cudnn")]
    ("attention", attention_checks),
    #[cfg(feature = "cudnn")]
    ("attention_direct", attention_direct_checks),
];

/// The names of the groups of checks this build has.
pub fn group_names() -> Vec<&'static str> {
    GROUPS.iter().map(|(name, _)| *name).collect()
}

/// The checks of the groups named in `only` (every group when it is empty), so a short run can check the kernels
/// a change touched. An unknown name is an error that lists the groups.
pub fn run_groups(dev: &Device, only: &[String]) -> Result<Vec<CheckOutcome>> {
    if let Some(unknown) = only.iter().find(|n| !GROUPS.iter().any(|(g, _)| g == n)) {
        candle_core::bail!(
            "no group of device checks is called {unknown:?}; the groups are: {}",
            group_names().join(", ")
        );
    }
    let mut out = Vec::new();
    for (name, run) in GROUPS {
        if only.is_empty() || only.iter().any(|n| n == name) {
            out.extend(run(dev)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_all_pass(outcomes: Vec<CheckOutcome>) {
        assert!(!outcomes.is_empty());
        let failed: Vec<_> = outcomes.iter().filter(|o| !o.passed()).collect();
        assert!(failed.is_empty(), "failed: {failed:#?}");
    }

    #[test]
    fn compare_rejects_nan_and_mismatch() -> Result<()> {
        let a = Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?;
        let nan = Tensor::new(&[1f32, f32::NAN, 3.], &Device::Cpu)?;
        assert!(!compare("nan", &nan, &a, 1.0)?.passed());
        assert!(!compare("off", &(&a * 1.1)?, &a, 1e-3)?.passed());
        assert!(compare("same", &a, &a, 0.0)?.passed());
        Ok(())
    }

    // The device tests need a CUDA GPU: they run in cuda builds on the test machine (and through
    // `framesmith-bench check`), never in CPU CI, which does not compile this module.
    #[test]
    fn fp8_kernels_match_reference() -> Result<()> {
        assert_all_pass(fp8_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn fp8_products_match_reference() -> Result<()> {
        assert_all_pass(fp8_gemm::fp8_gemm_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn untracked_linear_matches_reference() -> Result<()> {
        assert_all_pass(linear::linear_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn rms_norm_rope_matches_reference() -> Result<()> {
        assert_all_pass(rms_rope::rms_rope_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn norm_kernels_match_reference() -> Result<()> {
        assert_all_pass(norm_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn elementwise_kernels_match_reference() -> Result<()> {
        assert_all_pass(elementwise_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn direct_backward_kernels_match_reference() -> Result<()> {
        assert_all_pass(direct_backward_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn adapter_kernels_match_reference() -> Result<()> {
        assert_all_pass(adapter::adapter_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn multi_tensor_optimizer_matches_per_tensor() -> Result<()> {
        assert_all_pass(optim_multi::optim_multi_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn lora_bias_kernels_match_reference() -> Result<()> {
        assert_all_pass(lora_bias::lora_bias_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn bias_epilogue_product_matches_reference() -> Result<()> {
        assert_all_pass(gemm_bias::gemm_bias_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[test]
    fn rope_kernel_matches_reference() -> Result<()> {
        assert_all_pass(rope_checks(&Device::new_cuda(0)?)?);
        Ok(())
    }

    #[cfg(feature = "cudnn")]
    #[test]
    fn cudnn_attention_matches_reference() -> Result<()> {
        let dev = Device::new_cuda(0)?;
        assert_all_pass(attention_checks(&dev)?);
        assert_all_pass(attention_direct_checks(&dev)?);
        Ok(())
    }
}
