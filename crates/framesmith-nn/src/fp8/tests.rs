#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `n` standard-normal samples from a fixed seed (Box-Muller), shared by the `nn` tests.
pub(crate) fn randn(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random::<f64>().max(1e-300);
            let u2: f64 = rng.random::<f64>();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

/// A weight `[out, in]` whose rows and 64-blocks have very different magnitudes, so per-tensor, per-channel
/// and per-block scales all differ.
fn uneven_weight(seed: u64, out_dim: usize, in_dim: usize) -> Vec<f32> {
    let mut w = randn(seed, out_dim * in_dim);
    for (i, v) in w.iter_mut().enumerate() {
        let (row, col) = (i / in_dim, i % in_dim);
        *v *= 10f32.powi((row % 5) as i32 - 2) * (1.0 + (col / 64) as f32 * 3.0);
    }
    w
}

fn finite_codes() -> Vec<(u8, f32)> {
    (0..=255u8)
        .filter(|&c| !is_nan_code(c))
        .map(|c| (c, e4m3_decode(c)))
        .collect()
}

/// The correctly rounded e4m3 value of `x` by exhaustive search: nearest finite value, ties to the even code,
/// magnitudes beyond 448 saturated.
fn nearest_e4m3(x: f32, codes: &[(u8, f32)]) -> f32 {
    let x = x.clamp(-E4M3_MAX, E4M3_MAX) as f64;
    let mut best: Option<(u8, f64)> = None;
    for &(c, v) in codes {
        let d = (x - v as f64).abs();
        best = match best {
            Some((bc, bd)) if bd < d || (bd == d && c & 1 == 1 && bc & 1 == 0) => Some((bc, bd)),
            _ => Some((c, d)),
        };
    }
    best.map(|(c, _)| e4m3_decode(c)).unwrap_or(f32::NAN)
}

#[test]
fn encoder_is_round_to_nearest_even_with_saturation() {
    let codes = finite_codes();
    let mut xs: Vec<f32> = randn(1, 4000)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 2f32.powi((i % 24) as i32 - 14))
        .collect();
    // Exact midpoints between neighbours (ties), the neighbours themselves, and values just off the midpoints.
    let mut positive: Vec<f32> = codes
        .iter()
        .map(|&(_, v)| v)
        .filter(|v| *v >= 0.0)
        .collect();
    positive.sort_by(f32::total_cmp);
    positive.dedup();
    for pair in positive.windows(2) {
        let mid = (pair[0] + pair[1]) / 2.0;
        for x in [pair[0], mid, mid * (1.0 + 1e-6), mid * (1.0 - 1e-6)] {
            xs.extend([x, -x]);
        }
    }
    xs.extend([
        0.0,
        -0.0,
        448.0,
        449.0,
        463.9,
        464.0,
        464.1,
        1e6,
        -1e6,
        f32::MAX,
        2f32.powi(-10),
        1e-30,
    ]);
    for x in xs {
        let got = e4m3_decode(e4m3_encode(x));
        let want = nearest_e4m3(x, &codes);
        assert!(
            got == want,
            "x = {x:e}: encoder gave {got:e}, nearest-even is {want:e}"
        );
    }
    // A tie that must go to the even code: 1.0625 lies between 1.0 (code 0x38) and 1.125 (0x39).
    assert_eq!(e4m3_encode(1.0625), 0x38);
    assert_eq!(e4m3_encode(1.1875), 0x3a);
}

/// The bit-level encoder agrees with the `float8` crate (a port of NVIDIA's cuda_fp8.hpp conversion with
/// saturation) on a sweep of f32 bit patterns from 0 to beyond 448, both signs, plus specials.
#[test]
fn encoder_agrees_with_nvidia_conversion() {
    let mut checked = 0;
    let mut bits = 0u32;
    while bits < 0x4400_0000 {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            assert_eq!(e4m3_encode(x), F8E4M3::from_f32(x).to_bits(), "x = {x:e}");
            checked += 1;
        }
        bits += 997;
    }
    for x in [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        464.0,
        464.0001,
        2f32.powi(-10),
    ] {
        assert_eq!(e4m3_encode(x), F8E4M3::from_f32(x).to_bits(), "x = {x:e}");
    }
    assert!(is_nan_code(e4m3_encode(f32::NAN)));
    assert!(checked > 2_000_000);
}

/// The CPU loop and the table-lookup path used on other devices give identical weights.
#[test]
fn cpu_and_tensor_op_dequantisation_agree() {
    let (out_dim, in_dim) = (5, 192);
    let w = Tensor::from_vec(
        uneven_weight(8, out_dim, in_dim),
        (out_dim, in_dim),
        &Device::Cpu,
    )
    .unwrap();
    for mode in [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64] {
        let q = quantize(&w, mode).unwrap();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let a = q.dequantize(dtype).unwrap();
            let b = q.dequantize_with_tensor_ops(dtype).unwrap();
            assert_eq!(a.dtype(), dtype);
            let diff = (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(diff, 0.0, "{mode} {dtype:?}");
        }
    }
}

fn scale_of(w: &Fp8Weight) -> Vec<f32> {
    w.scale()
        .flatten_all()
        .and_then(|s| s.to_vec1::<f32>())
        .unwrap()
}

/// Per element `|deq - w| <= max(2^-4 |w|, 2^-10 s) (1 + 1e-5) + 2^-148`, where `s` is the element's group
/// scale. Derivation: `y = w / s` is rounded once in f32 (relative 2^-24); e4m3 keeps 3 mantissa bits, so in
/// its normal range (|y| >= 2^-6) rounding to nearest moves `y` by at most half an ulp, i.e. 2^-4 |y|, and in
/// its subnormal range by at most half the subnormal step 2^-9, i.e. 2^-10; clamping to 448 only trims f32
/// rounding of `amax / s`; multiplying back by `s` is one more f32 rounding (and 2^-149 at most among f32
/// subnormals). So the relative bound 2^-4 holds except for values below 2^-6 of the scale, which get the
/// absolute bound 2^-10 s.
fn assert_within_e4m3_bound(w: &[f32], deq: &[f32], scales: &[f32], group_len: usize) -> f32 {
    let mut worst_rel = 0f32;
    for (i, (&x, &d)) in w.iter().zip(deq).enumerate() {
        let s = scales[i / group_len];
        let bound = (x.abs() / 16.0).max(s / 1024.0) * (1.0 + 1e-5) + 2f32.powi(-148);
        let err = (d - x).abs();
        assert!(err <= bound, "element {i}: w = {x:e}, dequantised {d:e}, error {err:e} > bound {bound:e} (s = {s:e})");
        if x.abs() >= s / 64.0 && x != 0.0 {
            worst_rel = worst_rel.max(err / x.abs());
        }
    }
    worst_rel
}

fn round_trip(w: &[f32], out_dim: usize, in_dim: usize, mode: Fp8Scale) -> (Fp8Weight, Vec<f32>) {
    let t = Tensor::from_vec(w.to_vec(), (out_dim, in_dim), &Device::Cpu).unwrap();
    let q = quantize(&t, mode).unwrap();
    let deq = dense_values(&q);
    (q, deq)
}

/// The weight's dequantised values, flattened.
fn dense_values(w: &Fp8Weight) -> Vec<f32> {
    w.dequantize(DType::F32)
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.to_vec1::<f32>())
        .unwrap()
}

#[test]
fn round_trip_error_is_within_e4m3_bounds_for_every_mode() {
    let (out_dim, in_dim) = (12, 256);
    let w = uneven_weight(2, out_dim, in_dim);
    for (mode, group_len, scale_dims) in [
        (Fp8Scale::Tensor, out_dim * in_dim, vec![1]),
        (Fp8Scale::Channel, in_dim, vec![out_dim]),
        (Fp8Scale::Block64, 64, vec![out_dim, in_dim / 64]),
    ] {
        let (q, deq) = round_trip(&w, out_dim, in_dim, mode);
        assert_eq!(q.mode(), mode);
        assert_eq!(q.scale().dims(), scale_dims.as_slice());
        let scales = scale_of(&q);
        // Each group's scale is its amax / 448.
        for (g, &s) in scales.iter().enumerate() {
            let amax = w[g * group_len..(g + 1) * group_len]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                (s * 448.0 - amax).abs() <= amax * 1e-6,
                "{mode}: group {g} scale {s} amax {amax}"
            );
        }
        let worst = assert_within_e4m3_bound(&w, &deq, &scales, group_len);
        // The bound is nearly reached (rounding really happens) but never passed.
        assert!(
            worst > 0.04 && worst <= 0.0625 * (1.0 + 1e-5),
            "{mode}: worst relative error {worst}"
        );
    }
}

#[test]
fn finer_scales_give_smaller_error() {
    let (out_dim, in_dim) = (10, 192);
    let w = uneven_weight(3, out_dim, in_dim);
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let errs: Vec<f64> = [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64]
        .into_iter()
        .map(|mode| {
            let (_, deq) = round_trip(&w, out_dim, in_dim, mode);
            let diff: Vec<f32> = w.iter().zip(&deq).map(|(a, b)| a - b).collect();
            norm(&diff) / norm(&w)
        })
        .collect();
    // Per-tensor scaling pushes the small rows into e4m3's subnormal range.
    assert!(
        errs[0] > errs[1] && errs[1] >= errs[2],
        "relative errors tensor/channel/block: {errs:?}"
    );
    assert!(errs[2] < 0.03, "block64 relative error {}", errs[2]);
}

#[test]
fn zero_groups_huge_values_and_subnormals_round_trip() {
    let (out_dim, in_dim) = (4, 128);
    let mut w = vec![0f32; out_dim * in_dim];
    // Row 0 stays zero; row 1 huge; row 2 f32 subnormals; row 3 mixes a zero block with normal values.
    for c in 0..in_dim {
        w[in_dim + c] = if c % 2 == 0 {
            f32::MAX
        } else {
            -3e38 * ((c as f32 + 1.0) / 128.0)
        };
        w[2 * in_dim + c] =
            f32::from_bits(1 + c as u32 * 997) * if c % 3 == 0 { -1.0 } else { 1.0 };
        w[3 * in_dim + c] = if c < 64 {
            0.0
        } else {
            (c as f32 - 90.0) * 0.01
        };
    }
    for mode in [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64] {
        let (q, deq) = round_trip(&w, out_dim, in_dim, mode);
        assert!(
            deq.iter().all(|v| v.is_finite()),
            "{mode}: non-finite output"
        );
        assert!(
            deq[..in_dim].iter().all(|&v| v == 0.0),
            "{mode}: zero row changed"
        );
        let scales = scale_of(&q);
        assert!(
            scales.iter().all(|s| s.is_finite() && *s > 0.0),
            "{mode}: scales {scales:?}"
        );
        if mode != Fp8Scale::Tensor {
            let group_len = if mode == Fp8Scale::Channel {
                in_dim
            } else {
                64
            };
            assert_within_e4m3_bound(&w, &deq, &scales, group_len);
            assert_eq!(deq[in_dim], f32::MAX, "{mode}: amax must survive exactly");
        }
    }
    let all_zero = Tensor::zeros((3, 64), DType::F32, &Device::Cpu).unwrap();
    let q = quantize(&all_zero, Fp8Scale::Tensor).unwrap();
    assert_eq!(scale_of(&q), vec![1.0]);
    let deq = q
        .dequantize(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_eq!(
        deq.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
}

#[test]
fn non_finite_weights_are_rejected() {
    for bad in [f32::NAN, f32::INFINITY] {
        let mut w = vec![0.5f32; 2 * 64];
        w[70] = bad;
        let t = Tensor::from_vec(w, (2, 64), &Device::Cpu).unwrap();
        let err = quantize(&t, Fp8Scale::Block64).unwrap_err().to_string();
        assert!(err.contains("[1, 6]"), "{err}");
    }
}

#[test]
fn block64_falls_back_to_channel_when_rows_do_not_split() {
    let w = Tensor::from_vec(randn(4, 3 * 96), (3, 96), &Device::Cpu).unwrap();
    let q = quantize(&w, Fp8Scale::Block64).unwrap();
    assert_eq!(q.mode(), Fp8Scale::Channel);
    assert_eq!(q.scale().dims(), &[3]);
}

#[test]
fn checkpoint_scale_layouts_are_recognised() {
    let (out_dim, in_dim) = (6, 128);
    let w = Tensor::from_vec(
        uneven_weight(5, out_dim, in_dim),
        (out_dim, in_dim),
        &Device::Cpu,
    )
    .unwrap();
    for mode in [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64] {
        let q = quantize(&w, mode).unwrap();
        let want = q.dequantize(DType::F32).unwrap();
        // The same codes as a checkpoint's F8E4M3 tensor (decoded values are exact in e4m3, so the cast is too).
        let values = q
            .table
            .index_select(&q.codes().flatten_all().unwrap(), 0)
            .unwrap();
        let f8 = values
            .reshape((out_dim, in_dim))
            .unwrap()
            .to_dtype(DType::F8E4M3)
            .unwrap();
        let s = q.scale().clone();
        let layouts: Vec<Tensor> = match mode {
            Fp8Scale::Tensor => vec![
                s.reshape(()).unwrap(),
                s.clone(),
                s.reshape((1, 1)).unwrap(),
            ],
            Fp8Scale::Channel => vec![s.clone(), s.reshape((out_dim, 1)).unwrap()],
            Fp8Scale::Block64 => vec![s.clone(), s.reshape((out_dim, 2, 1)).unwrap()],
        };
        for layout in layouts {
            for codes in [q.codes(), &f8] {
                let scale = layout
                    .to_dtype(DType::BF16)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap();
                let p = Fp8Weight::from_checkpoint(codes, Some(&layout)).unwrap();
                assert_eq!(p.mode(), mode, "layout {:?}", layout.dims());
                let got = p.dequantize(DType::F32).unwrap();
                let diff = (got - &want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert_eq!(diff, 0.0, "{mode} layout {:?}", layout.dims());
                // bf16 scales (musubi-tuner keeps the model dtype) are accepted too.
                assert!(Fp8Weight::from_checkpoint(codes, Some(&scale)).is_ok());
            }
        }
    }
    let q = quantize(&w, Fp8Scale::Channel).unwrap();
    let bad = Tensor::ones((out_dim, 3), DType::F32, &Device::Cpu).unwrap();
    let err = Fp8Weight::from_checkpoint(q.codes(), Some(&bad))
        .unwrap_err()
        .to_string();
    assert!(err.contains("[6, 3]"), "{err}");
}

#[test]
fn unscaled_and_nan_codes() {
    let codes = Tensor::from_vec(vec![0x38u8, 0xb8, 0x7e, 0x01], (2, 2), &Device::Cpu).unwrap();
    let w = Fp8Weight::from_checkpoint(&codes, None).unwrap();
    let deq = w
        .dequantize(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(deq, vec![1.0, -1.0, 448.0, 2f32.powi(-9)]);
    let nan = Tensor::from_vec(vec![0x38u8, 0x7f], (1, 2), &Device::Cpu).unwrap();
    let err = Fp8Weight::from_checkpoint(&nan, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("NaN"), "{err}");
}

#[test]
fn dequantize_rounds_once_to_the_requested_dtype() {
    let w = Tensor::from_vec(randn(6, 4 * 64), (4, 64), &Device::Cpu).unwrap();
    let q = quantize(&w, Fp8Scale::Block64).unwrap();
    let f32_then_bf16 = q
        .dequantize(DType::F32)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let bf16 = q.dequantize(DType::BF16).unwrap();
    assert_eq!(bf16.dtype(), DType::BF16);
    let diff = (f32_then_bf16.to_dtype(DType::F32).unwrap() - bf16.to_dtype(DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(diff, 0.0);
    assert_eq!(q.storage_bytes(), 4 * 64 + 4 * 4);
}

#[test]
fn scale_mode_names_round_trip() {
    for mode in [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64] {
        assert_eq!(mode.as_str().parse::<Fp8Scale>(), Ok(mode));
    }
    assert!("block128".parse::<Fp8Scale>().is_err());
}

#[test]
fn raw_parts_are_checked_for_shape_and_dtype() {
    let w = Tensor::from_vec(randn(7, 4 * 128), (4, 128), &Device::Cpu).unwrap();
    let q = quantize(&w, Fp8Scale::Block64).unwrap();
    let raw = Fp8Weight::from_raw(q.codes().clone(), q.scale().clone(), Fp8Scale::Block64).unwrap();
    let diff = (raw.dequantize(DType::F32).unwrap() - q.dequantize(DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(diff, 0.0);
    let wrong_mode = Fp8Weight::from_raw(q.codes().clone(), q.scale().clone(), Fp8Scale::Channel);
    assert!(wrong_mode.unwrap_err().to_string().contains("[4]"));
    let wrong_dtype = Fp8Weight::from_raw(
        q.codes().to_dtype(DType::F32).unwrap(),
        q.scale().clone(),
        Fp8Scale::Block64,
    );
    assert!(wrong_dtype.is_err());
}

#[test]
fn every_name_parses_to_the_mode_of_that_name() {
    for name in Fp8Scale::NAMES {
        let mode: Fp8Scale = name.parse().expect("a listed name parses");
        assert_eq!(mode.as_str(), name);
    }
    assert!("block32".parse::<Fp8Scale>().is_err());
}

/// The row quantisation FP8 products use: each row's largest magnitude maps to ±448 exactly, every value is the
/// nearest e4m3 of `x / scale` (saturating), an all-zero row gets scale 1, a row of tiny values a normal scale.
#[test]
fn activation_rows_quantise_to_their_own_scale() {
    let (rows, cols) = (5, 96);
    let mut x = randn(70, rows * cols);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= [1e-3, 1.0, 1e3, 0.0, 1e-40][i / cols];
    }
    x[cols + 7] = -900.0;
    let t = Tensor::from_vec(x.clone(), (rows, cols), &Device::Cpu).unwrap();
    let (codes, scales) = quantize_rows_reference(&t).unwrap();
    let codes = codes.flatten_all().unwrap().to_vec1::<u8>().unwrap();
    let scales = scales.to_vec1::<f32>().unwrap();
    let table = finite_codes();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = scales[r];
        match r {
            3 => assert_eq!(s, 1.0),
            4 => assert_eq!(s, f32::MIN_POSITIVE),
            _ => assert_eq!(s, amax / E4M3_MAX),
        }
        for (c, &v) in row.iter().enumerate() {
            let code = codes[r * cols + c];
            assert_eq!(
                e4m3_decode(code),
                nearest_e4m3(v / s, &table),
                "row {r} col {c}: {v}"
            );
        }
        if r < 3 {
            let top = row.iter().map(|v| (v / s).abs()).fold(0f32, f32::max);
            assert!((top - E4M3_MAX).abs() <= E4M3_MAX * 1e-6, "row {r}: {top}");
        }
    }
    assert_eq!(e4m3_decode(codes[cols + 7]), -E4M3_MAX);
}

/// Weights for FP8 products hold one scale per output channel: per-tensor scales are repeated (same codes, same
/// values), per-channel weights are kept, block-64 ones are quantised again per channel from their values (within
/// e4m3's rounding of those values); the mark survives a move between devices.
#[test]
fn weights_for_fp8_products_are_per_channel() {
    let (out_dim, in_dim) = (12, 256);
    let w = uneven_weight(71, out_dim, in_dim);
    for mode in [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64] {
        let (q, deq) = round_trip(&w, out_dim, in_dim, mode);
        assert!(!q.fp8_products());
        let p = q.for_fp8_products().unwrap();
        assert!(p.fp8_products() && p.to_device(&Device::Cpu).unwrap().fp8_products());
        assert_eq!(p.mode(), Fp8Scale::Channel);
        assert_eq!(p.scale().dims(), [out_dim]);
        let got = dense_values(&p);
        if mode == Fp8Scale::Block64 {
            assert_within_e4m3_bound(&deq, &got, &scale_of(&p), in_dim);
            assert_ne!(got, deq);
        } else {
            assert_eq!(got, deq, "{mode}");
        }
    }
}

#[test]
fn checkpoint_codes_from_views_and_the_nan_found_past_the_first_part() {
    // A U8 view that does not start its buffer is copied; the weight holds the view's codes.
    let all = Tensor::from_vec(vec![0x38u8, 0x38, 0xb8, 0x01], (2, 2), &Device::Cpu).unwrap();
    let lower = all.narrow(0, 1, 1).unwrap();
    let w = Fp8Weight::from_checkpoint(&lower, None).unwrap();
    assert_eq!(w.codes().layout().start_offset(), 0);
    assert_eq!(
        w.codes().flatten_all().unwrap().to_vec1::<u8>().unwrap(),
        vec![0xb8, 0x01]
    );
    // F8E4M3 codes become the same bytes.
    let f8 = Tensor::from_vec(
        vec![0x38u8, 0xb8]
            .into_iter()
            .map(F8E4M3::from_bits)
            .collect::<Vec<_>>(),
        (1, 2),
        &Device::Cpu,
    )
    .unwrap();
    let w = Fp8Weight::from_checkpoint(&f8, None).unwrap();
    assert_eq!(
        w.codes().flatten_all().unwrap().to_vec1::<u8>().unwrap(),
        vec![0x38, 0xb8]
    );
    // A NaN (0xff) far into a weight larger than one search part is found at its place.
    let (rows, cols) = (1024, 3000);
    let mut codes = vec![0x30u8; rows * cols];
    let at = 700 * cols + 17;
    codes[at] = 0xff;
    codes[at + 5] = 0x7f;
    let codes = Tensor::from_vec(codes, (rows, cols), &Device::Cpu).unwrap();
    let err = Fp8Weight::from_checkpoint(&codes, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("NaN at [700, 17]"), "{err}");
}
