use std::sync::Arc;

use candle_core::{bail, DType, Device, IndexOp, Result, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::tiled::{PeakElems, Tiles};
use super::{attention, naive_attention, tiled_attention};

type Attn<'a> = &'a dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

fn uniform(shape: (usize, usize, usize, usize), seed: u64) -> Result<Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let data: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    Tensor::from_vec(data, shape, &Device::Cpu)
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    assert_eq!(a.dims(), b.dims());
    let diff = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?;
    diff.flatten_all()?.max(0)?.to_scalar()
}

fn max_abs(a: &Tensor) -> Result<f32> {
    max_diff(a, &a.zeros_like()?)
}

/// Output and gradients of `q`, `k`, `v` for the loss `sum(out · w)`.
fn run(f: Attn, q: &Tensor, k: &Tensor, v: &Tensor, w: &Tensor) -> Result<[Tensor; 4]> {
    let (q, k, v) = (
        Var::from_tensor(q)?,
        Var::from_tensor(k)?,
        Var::from_tensor(v)?,
    );
    let out = f(q.as_tensor(), k.as_tensor(), v.as_tensor())?;
    let loss = (out.to_dtype(DType::F32)? * w)?.sum_all()?;
    let grads = loss.backward()?;
    let grad = |x: &Var| match grads.get(x.as_tensor()) {
        Some(g) => Ok(g.clone()),
        None => bail!("no gradient"),
    };
    Ok([out.clone(), grad(&q)?, grad(&k)?, grad(&v)?])
}

struct Case {
    b: usize,
    lq: usize,
    lk: usize,
    h: usize,
    d: usize,
    lens: Option<Vec<usize>>,
    tiles: Tiles,
}

impl Case {
    /// q, k, v and the loss weights.
    fn inputs(&self, seed: u64) -> Result<[Tensor; 4]> {
        let (b, lq, lk, h, d) = (self.b, self.lq, self.lk, self.h, self.d);
        Ok([
            uniform((b, lq, h, d), seed)?,
            uniform((b, lk, h, d), seed + 1)?,
            uniform((b, lk, h, d), seed + 2)?,
            uniform((b, lq, h, d), seed + 3)?,
        ])
    }

    fn tiled(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        tiled_attention(
            q,
            k,
            v,
            self.lens.as_deref(),
            Some(self.tiles),
            Arc::default(),
        )
    }

    /// Compares output and gradients with the naive reference, all in `dtype`.
    fn check(&self, dtype: DType, value_tol: f32, grad_tol: f32) -> Result<()> {
        let [q, k, v, w] = self.inputs(7)?;
        let (q, k, v) = (q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?);
        let naive =
            |q: &Tensor, k: &Tensor, v: &Tensor| naive_attention(q, k, v, self.lens.as_deref());
        let got = run(&|q, k, v| self.tiled(q, k, v), &q, &k, &v, &w)?;
        let want = run(&naive, &q, &k, &v, &w)?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = if i == 0 { value_tol } else { grad_tol };
            assert_eq!(g.dtype(), dtype, "tensor {i}");
            let diff = max_diff(g, w)?;
            assert!(
                diff <= tol,
                "tensor {i} (0 out, 1 dq, 2 dk, 3 dv): diff {diff} > {tol}"
            );
        }
        Ok(())
    }
}

#[test]
fn values_and_gradients_match_naive() -> Result<()> {
    let cases = [
        // Self-attention, padded sample, lengths not multiples of the tiles.
        Case {
            b: 2,
            lq: 37,
            lk: 37,
            h: 3,
            d: 8,
            lens: Some(vec![37, 20]),
            tiles: Tiles::new(8, 16),
        },
        // Cross-attention (lq != lk), a short text in a key tile of its own.
        Case {
            b: 2,
            lq: 13,
            lk: 29,
            h: 2,
            d: 4,
            lens: Some(vec![29, 5]),
            tiles: Tiles::new(4, 8),
        },
        // Lengths beyond lk are clamped.
        Case {
            b: 2,
            lq: 10,
            lk: 7,
            h: 1,
            d: 4,
            lens: Some(vec![100, 3]),
            tiles: Tiles::new(3, 2),
        },
        // No mask; one tile covering everything.
        Case {
            b: 1,
            lq: 19,
            lk: 23,
            h: 2,
            d: 8,
            lens: None,
            tiles: Tiles::new(64, 64),
        },
    ];
    for case in &cases {
        case.check(DType::F32, 1e-5, 1e-4)?;
    }
    Ok(())
}

#[test]
fn half_precision_matches_naive() -> Result<()> {
    let case = Case {
        b: 2,
        lq: 21,
        lk: 17,
        h: 2,
        d: 8,
        lens: Some(vec![17, 9]),
        tiles: Tiles::new(8, 8),
    };
    // Both compute in f32 and round once to the input dtype at the end.
    case.check(DType::BF16, 3e-2, 6e-2)?;
    case.check(DType::F16, 4e-3, 1e-2)
}

#[test]
fn default_tiles_match_naive_over_several_tiles() -> Result<()> {
    // 300 tokens: 3 query tiles and 2 key tiles with the CPU tiles.
    let (b, l, h, d) = (2, 300, 2, 8);
    let [q, k, v, w] = [1, 2, 3, 4].map(|seed| uniform((b, l, h, d), seed));
    let (q, k, v, w) = (q?, k?, v?, w?);
    let lens = [300, 170];
    let got = run(&|q, k, v| attention(q, k, v, Some(&lens)), &q, &k, &v, &w)?;
    let want = run(
        &|q, k, v| naive_attention(q, k, v, Some(&lens)),
        &q,
        &k,
        &v,
        &w,
    )?;
    for (g, w) in got.iter().zip(&want) {
        let diff = max_diff(g, w)?;
        assert!(diff < 1e-4, "diff {diff}");
    }
    Ok(())
}

#[test]
fn strided_inputs_are_read_by_layout() -> Result<()> {
    // q, k, v as transposed views of [b, h, l, d] tensors, k narrowed so it starts at an offset.
    let q = uniform((2, 3, 11, 4), 1)?.transpose(1, 2)?;
    let kv = uniform((2, 3, 20, 4), 2)?.transpose(1, 2)?;
    let (k, v) = (kv.narrow(1, 3, 9)?, kv.narrow(1, 0, 9)?);
    assert!(!q.is_contiguous() && !k.is_contiguous());
    let lens = [9, 4];
    let got = tiled_attention(
        &q,
        &k,
        &v,
        Some(&lens),
        Some(Tiles::new(4, 4)),
        Arc::default(),
    )?;
    let want = naive_attention(&q, &k, &v, Some(&lens))?;
    assert!(max_diff(&got, &want)? < 1e-5);
    Ok(())
}

#[test]
fn samples_without_keys_get_zero_output_and_gradients() -> Result<()> {
    let case = Case {
        b: 2,
        lq: 6,
        lk: 9,
        h: 2,
        d: 4,
        lens: Some(vec![0, 5]),
        tiles: Tiles::new(4, 4),
    };
    let [q, k, v, w] = case.inputs(3)?;
    let got = run(&|q, k, v| case.tiled(q, k, v), &q, &k, &v, &w)?;
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            max_abs(&g.i(0)?)?,
            0.0,
            "tensor {i} of the sample without keys"
        );
    }
    // Sample 1 is unaffected by its empty neighbour.
    let one = |x: &Tensor| x.narrow(0, 1, 1);
    let naive = |q: &Tensor, k: &Tensor, v: &Tensor| naive_attention(q, k, v, Some(&[5]));
    let want = run(&naive, &one(&q)?, &one(&k)?, &one(&v)?, &one(&w)?)?;
    for (g, w) in got.iter().zip(&want) {
        assert!(max_diff(&one(g)?, w)? < 1e-4);
    }
    // No keys in any sample: zeros, not NaN.
    let all_empty = |q: &Tensor, k: &Tensor, v: &Tensor| attention(q, k, v, Some(&[0, 0]));
    for g in run(&all_empty, &q, &k, &v, &w)? {
        assert_eq!(max_abs(&g)?, 0.0);
    }
    Ok(())
}

#[test]
fn no_keys_at_all_gives_zeros() -> Result<()> {
    let (q, w) = (uniform((2, 5, 2, 4), 1)?, uniform((2, 5, 2, 4), 2)?);
    let kv = Tensor::zeros((2, 0, 2, 4), DType::F32, &Device::Cpu)?;
    let [out, dq, dk, dv] = run(&|q, k, v| attention(q, k, v, None), &q, &kv, &kv, &w)?;
    assert_eq!((max_abs(&out)?, max_abs(&dq)?), (0.0, 0.0));
    assert_eq!((dk.dims(), dv.dims()), (kv.dims(), kv.dims()));
    Ok(())
}

#[test]
fn mismatched_inputs_are_errors() -> Result<()> {
    let q = uniform((2, 5, 2, 4), 1)?;
    let k = uniform((2, 7, 2, 4), 2)?;
    assert!(
        attention(&q, &k, &k, Some(&[7])).is_err(),
        "one length for two samples"
    );
    assert!(
        attention(&q, &k, &k.narrow(1, 0, 6)?, None).is_err(),
        "k and v lengths differ"
    );
    assert!(
        attention(&q, &k.narrow(3, 0, 2)?, &k.narrow(3, 0, 2)?, None).is_err(),
        "head dims differ"
    );
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let case = Case {
        b: 2,
        lq: 3,
        lk: 4,
        h: 1,
        d: 2,
        lens: Some(vec![4, 2]),
        tiles: Tiles::new(2, 3),
    };
    let [q, k, v, w] = case.inputs(11)?;
    let loss = |args: &[Tensor; 3]| -> Result<f32> {
        let out = case.tiled(&args[0], &args[1], &args[2])?;
        (out * &w)?.sum_all()?.to_scalar()
    };
    let [_, dq, dk, dv] = run(&|q, k, v| case.tiled(q, k, v), &q, &k, &v, &w)?;
    // Central differences: error ~eps² from truncation plus ~1e-7/eps from f32 rounding, both well under 2e-3.
    let eps = 1e-2f32;
    let nudged = |which: usize, i: usize, by: f32| -> Result<[Tensor; 3]> {
        let mut args = [q.clone(), k.clone(), v.clone()];
        let mut data = args[which].flatten_all()?.to_vec1::<f32>()?;
        data[i] += by;
        args[which] = Tensor::from_vec(data, args[which].dims(), &Device::Cpu)?;
        Ok(args)
    };
    for (which, grad) in [dq, dk, dv].iter().enumerate() {
        for (i, g) in grad
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .enumerate()
        {
            let fd =
                (loss(&nudged(which, i, eps)?)? - loss(&nudged(which, i, -eps)?)?) / (2.0 * eps);
            assert!(
                (fd - g).abs() < 2e-3,
                "input {which} element {i}: analytic {g}, finite difference {fd}"
            );
        }
    }
    Ok(())
}

/// Largest tile-loop tensor of a forward plus backward of `case`.
fn peak_elems(case: &Case) -> Result<usize> {
    let [q, k, v, w] = case.inputs(5)?;
    let peak = Arc::new(PeakElems::default());
    let tiled = |q: &Tensor, k: &Tensor, v: &Tensor| {
        tiled_attention(
            q,
            k,
            v,
            case.lens.as_deref(),
            Some(case.tiles),
            peak.clone(),
        )
    };
    run(&tiled, &q, &k, &v, &w)?;
    Ok(peak.get())
}

#[test]
fn memory_is_bounded_by_the_tiles() -> Result<()> {
    let (b, h, l) = (2, 2, 96);
    let tiled = Case {
        b,
        lq: l,
        lk: l,
        h,
        d: 8,
        lens: Some(vec![96, 50]),
        tiles: Tiles::new(16, 32),
    };
    // The score tile is the largest tensor: b·h·16·32, not the b·h·96·96 a full score matrix takes.
    assert_eq!(peak_elems(&tiled)?, b * h * 16 * 32);
    // The tracker does see a full matrix when the tiles cover the sequence.
    let whole = Case {
        tiles: Tiles::new(l, l),
        ..tiled
    };
    assert_eq!(peak_elems(&whole)?, b * h * l * l);
    Ok(())
}

#[test]
#[ignore = "timing, prints only: cargo test --lib nn::attention::tests::timing -- --ignored --nocapture"]
fn timing() -> Result<()> {
    let (b, l, h, d) = (1, 600, 2, 32);
    let [q, k, v, w] = [1, 2, 3, 4].map(|seed| uniform((b, l, h, d), seed));
    let (q, k, v, w) = (q?, k?, v?, w?);
    // Minimum over repetitions: the build machine is shared, so a mean mostly measures other people's jobs.
    let best_ms = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        f()?;
        let mut best = f64::MAX;
        for _ in 0..15 {
            let start = std::time::Instant::now();
            f()?;
            best = best.min(start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(best)
    };
    let tiled = |q: &Tensor, k: &Tensor, v: &Tensor| attention(q, k, v, None);
    let naive = |q: &Tensor, k: &Tensor, v: &Tensor| naive_attention(q, k, v, None);
    for (name, f) in [("tiled", &tiled as Attn), ("naive", &naive as Attn)] {
        let fwd = best_ms(&|| f(&q, &k, &v).map(drop))?;
        let fwd_bwd = best_ms(&|| run(f, &q, &k, &v, &w).map(drop))?;
        println!("{name}: forward {fwd:.2} ms, forward+backward {fwd_bwd:.2} ms (b={b} l={l} h={h} d={d})");
    }
    Ok(())
}

/// The line about FP8 attention's calls: none before it is asked for, the bf16 ones named when there are some.
#[test]
fn the_fp8_calls_line_names_the_passes_kept_in_bf16() {
    assert_eq!(super::fp8_calls_text((0, 0)), None);
    assert_eq!(
        super::fp8_calls_text((120, 0)).as_deref(),
        Some("FP8 attention: 120 passes in FP8")
    );
    assert_eq!(
        super::fp8_calls_text((120, 4)).as_deref(),
        Some("FP8 attention: 120 passes in FP8, 4 in bf16 (shapes cuDNN's FP8 kernels refuse)")
    );
}
