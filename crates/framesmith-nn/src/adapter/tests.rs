use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::fp8::{quantize, Fp8Scale};
use crate::init::randn;
use crate::linear::{Linear, LinearTape};
use crate::testing::rel;

const KINDS: [AdapterKind; 6] = [
    AdapterKind::Lora,
    AdapterKind::Lokr {
        factor: -1,
        decompose_both: false,
        full_matrix: false,
    },
    AdapterKind::Lokr {
        factor: 4,
        decompose_both: true,
        full_matrix: false,
    },
    AdapterKind::Lokr {
        factor: -1,
        decompose_both: false,
        full_matrix: true,
    },
    AdapterKind::Loha,
    AdapterKind::Dora,
];

/// A layer 24 → 16 (bias, dense or FP8 base, `dtype`) with a fresh adapter of `kind`, rank 2.
fn layer(kind: AdapterKind, fp8: bool, dtype: DType, rng: &mut StdRng) -> Result<Linear> {
    let dev = Device::Cpu;
    let w = randn(rng, (16, 24), 0.0, 0.3, &dev)?.to_dtype(dtype)?;
    let base = if fp8 {
        BaseWeight::Fp8(quantize(&w, Fp8Scale::Tensor)?)
    } else {
        BaseWeight::Dense(w)
    };
    let bias = randn(rng, 16, 0.0, 0.1, &dev)?.to_dtype(dtype)?;
    let shape = AdapterShape {
        in_dim: 24,
        out_dim: 16,
        rank: 2,
        alpha: 3.0,
        dtype,
    };
    let adapter = Adapter::new(kind, shape, &base, rng)?;
    let mut lin = Linear::from_base(base, Some(bias));
    lin.set_adapter(Some(adapter));
    Ok(lin)
}

/// Gives every factor random values (the magnitude stays near the row norms) and the strength `multiplier`.
fn randomise(lin: &mut Linear, multiplier: f64, rng: &mut StdRng) -> Result<()> {
    let mut adapter = lin
        .adapter()
        .cloned()
        .ok_or_else(|| candle_core::Error::msg("no adapter"))?;
    for (name, v) in adapter.named_vars() {
        let noise = randn(rng, v.shape(), 0.0, 0.3, &Device::Cpu)?.to_dtype(v.dtype())?;
        let value = if name == "dora_scale" {
            (v.as_tensor() * (noise + 1.0)?)?
        } else {
            noise
        };
        v.set(&value)?;
    }
    adapter.set_multiplier(multiplier);
    lin.set_adapter(Some(adapter));
    Ok(())
}

fn no_adapter(lin: &Linear) -> Linear {
    let mut plain = lin.clone();
    plain.set_adapter(None);
    plain
}

/// A fresh adapter of every kind leaves the layer's output bit for bit as it was.
#[test]
fn a_fresh_adapter_of_every_kind_changes_nothing() -> Result<()> {
    let rng = &mut StdRng::seed_from_u64(1);
    for kind in KINDS {
        for fp8 in [false, true] {
            let lin = layer(kind, fp8, DType::F32, rng)?;
            let x = randn(rng, (5, 24), 0.0, 1.0, &Device::Cpu)?;
            let (y, _) = lin.forward_untracked(&x)?;
            let (want, _) = no_adapter(&lin).forward_untracked(&x)?;
            assert_eq!(rel(&y, &want)?, 0.0, "{kind:?}, fp8 {fp8}");
            assert_eq!(rel(&lin.forward(&x)?, &want)?, 0.0, "{kind:?} (tracked)");
        }
    }
    Ok(())
}

/// The untracked forward equals the autograd forward, and the hand-written backward (input gradient, every
/// factor's gradient) equals candle's autograd through it, on a dense and an FP8 base, at strength 1 and 0.8,
/// from the forward's tape, an empty one, and one holding only the output an earlier pass kept.
#[test]
fn the_backward_of_every_kind_matches_autograd() -> Result<()> {
    let rng = &mut StdRng::seed_from_u64(2);
    for kind in KINDS {
        for (fp8, multiplier) in [(false, 1.0), (true, 1.0), (false, 0.8)] {
            let mut lin = layer(kind, fp8, DType::F32, rng)?;
            randomise(&mut lin, multiplier, rng)?;
            let x = Var::from_tensor(&randn(rng, (2, 3, 24), 0.0, 1.0, &Device::Cpu)?)?;
            let dy = randn(rng, (2, 3, 16), 0.0, 1.0, &Device::Cpu)?;
            let y_ref = lin.forward(x.as_tensor())?;
            let store = (&y_ref * &dy)?.sum_all()?.backward()?;
            let (y, tape) = lin.forward_untracked(x.as_tensor())?;
            let case = format!("{kind:?}, fp8 {fp8}, multiplier {multiplier}");
            assert!(!y.track_op(), "{case}: the untracked forward built a graph");
            assert!(rel(&y, &y_ref)? < 1e-5, "{case}: forward");
            for tape in [tape, Default::default(), LinearTape::kept(&y)] {
                let (dx, params) = lin.backward(x.as_tensor(), &tape, &dy, true)?;
                let dx = dx.ok_or_else(|| candle_core::Error::msg("no input gradient"))?;
                let want = store
                    .get(x.as_tensor())
                    .ok_or_else(|| candle_core::Error::msg("no dx"))?;
                assert!(rel(&dx, want)? < 1e-5, "{case}: input gradient");
                let vars = lin.adapter().map(Adapter::vars).unwrap_or_default();
                assert_eq!(params.len(), vars.len(), "{case}");
                for (p, v) in params.iter().zip(&vars) {
                    assert_eq!(p.var.as_tensor().id(), v.as_tensor().id(), "{case}: order");
                    let want = store
                        .get(v.as_tensor())
                        .ok_or_else(|| candle_core::Error::msg("no grad"))?;
                    assert!(rel(&p.grad, want)? < 1e-5, "{case}: {:?}", p.var.dims());
                    assert!(
                        p.grad.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0,
                        "{case}: zero gradient"
                    );
                }
            }
        }
    }
    Ok(())
}

/// `Σ y ⊙ r` through the untracked forward.
fn loss(lin: &Linear, x: &Tensor, r: &Tensor) -> Result<f64> {
    let (y, _) = lin.forward_untracked(x)?;
    (y * r)?.sum_all()?.to_scalar::<f64>()
}

/// DoRA's loss with its row norms held at `norms` (what the backward differentiates, as PEFT does):
/// `Σ r ⊙ ((x Wᵀ + s x Aᵀ Bᵀ) ⊙ g + b)` with `g = 1 + k (m / norms − 1)`, written out here.
fn dora_surrogate(
    lin: &Linear,
    dora: &Dora,
    norms: &Tensor,
    x: &Tensor,
    r: &Tensor,
) -> Result<f64> {
    let w = lin.base().dense(DType::F64)?;
    let (down, up) = (dora.lora.down.as_tensor(), dora.lora.up.as_tensor());
    let z = (x.matmul(&w.t()?)? + (x.matmul(&down.t()?)?.matmul(&up.t()?)? * dora.lora.scale())?)?;
    let g = ((dora.magnitude.as_tensor() / norms)? - 1.0)?.affine(dora.multiplier, 1.0)?;
    let bias = lin
        .bias()
        .ok_or_else(|| candle_core::Error::msg("no bias"))?;
    let y = z.broadcast_mul(&g.t()?)?.broadcast_add(bias)?;
    (y * r)?.sum_all()?.to_scalar::<f64>()
}

/// Central differences (f64) of the loss equal the hand-written gradients of every factor; for DoRA, of the loss
/// with the norms held constant, which at the point itself is the layer's own loss.
#[test]
fn the_gradients_of_every_kind_match_finite_differences() -> Result<()> {
    let rng = &mut StdRng::seed_from_u64(3);
    let h = 1e-5;
    for kind in KINDS {
        let mut lin = layer(kind, false, DType::F64, rng)?;
        randomise(&mut lin, 0.9, rng)?;
        let x = randn(rng, (4, 24), 0.0, 1.0, &Device::Cpu)?.to_dtype(DType::F64)?;
        let r = randn(rng, (4, 16), 0.0, 1.0, &Device::Cpu)?.to_dtype(DType::F64)?;
        let adapter = lin
            .adapter()
            .cloned()
            .ok_or_else(|| candle_core::Error::msg("no adapter"))?;
        let dora_norms = match &adapter {
            Adapter::Dora(d) => Some(d.norms(
                lin.base(),
                &base_row_squares(lin.base(), DType::F64)?,
                DType::F64,
            )?),
            _ => None,
        };
        let eval = |lin: &Linear| match (&adapter, &dora_norms) {
            (Adapter::Dora(d), Some(n)) => dora_surrogate(lin, d, n, &x, &r),
            _ => loss(lin, &x, &r),
        };
        if dora_norms.is_some() {
            assert!(
                (eval(&lin)? - loss(&lin, &x, &r)?).abs() < 1e-10,
                "the surrogate is the layer"
            );
        }
        let (_, params) = lin.backward(&x, &Default::default(), &r, false)?;
        for (p, (name, v)) in params.iter().zip(adapter.named_vars()) {
            let grad = p.grad.flatten_all()?.to_vec1::<f64>()?;
            let values = v.as_tensor().flatten_all()?.to_vec1::<f64>()?;
            for i in [0, values.len() / 2, values.len() - 1] {
                let at = |delta: f64| -> Result<f64> {
                    let mut moved = values.clone();
                    moved[i] += delta;
                    v.set(&Tensor::from_vec(moved, v.shape(), &Device::Cpu)?)?;
                    eval(&lin)
                };
                let fd = (at(h)? - at(-h)?) / (2.0 * h);
                v.set(&Tensor::from_vec(values.clone(), v.shape(), &Device::Cpu)?)?;
                let tol = 1e-6 * fd.abs().max(grad[i].abs()).max(1e-2);
                assert!(
                    (fd - grad[i]).abs() < tol,
                    "{kind:?} {name}[{i}]: {fd} vs {}",
                    grad[i]
                );
            }
        }
    }
    Ok(())
}

/// The planner's count is what a fresh adapter holds, for every kind on square, wide and narrow layers.
#[test]
fn parameter_counts_match_fresh_adapters() -> Result<()> {
    let rng = &mut StdRng::seed_from_u64(5);
    for [in_dim, out_dim] in [[64, 64], [96, 384], [384, 96], [20, 36]] {
        let base = BaseWeight::Dense(Tensor::zeros((out_dim, in_dim), DType::F32, &Device::Cpu)?);
        for rank in [1, 4, 16] {
            for kind in KINDS {
                let shape = AdapterShape {
                    in_dim,
                    out_dim,
                    rank,
                    alpha: 1.0,
                    dtype: DType::F32,
                };
                let adapter = Adapter::new(kind, shape, &base, rng)?;
                assert_eq!(
                    kind.parameter_count([in_dim, out_dim], rank),
                    adapter.parameter_count() as u64,
                    "{kind:?} rank {rank} on [{in_dim}, {out_dim}]"
                );
            }
        }
    }
    Ok(())
}

/// LyCORIS' `factorization` examples.
#[test]
fn factorization_splits_widths_as_lycoris_does() {
    let cases = [
        (127, -1, (1, 127)),
        (128, -1, (8, 16)),
        (128, 2, (2, 64)),
        (128, 4, (4, 32)),
        (250, -1, (10, 25)),
        (250, 4, (2, 125)),
        (250, 8, (5, 50)),
        (360, -1, (18, 20)),
        (360, 8, (8, 45)),
        (360, 16, (15, 24)),
        (512, -1, (16, 32)),
        (1024, -1, (32, 32)),
        (1024, 16, (16, 64)),
        (5120, -1, (64, 80)),
    ];
    for (dim, factor, want) in cases {
        assert_eq!(factorization(dim, factor), want, "{dim}, factor {factor}");
    }
}

/// LoKr's factors: `w2` a product only when the rank is under half its larger side, `w1` a product only with
/// `decompose_both`, both full under `full_matrix` (and then scale 1).
#[test]
fn lokr_picks_full_or_product_factors_as_lycoris_does() -> Result<()> {
    let rng = &mut StdRng::seed_from_u64(4);
    let base = BaseWeight::Dense(Tensor::zeros((1024, 512), DType::F32, &Device::Cpu)?);
    let lokr = |rank: usize, decompose_both: bool, full_matrix: bool, rng: &mut StdRng| {
        let shape = AdapterShape {
            in_dim: 512,
            out_dim: 1024,
            rank,
            alpha: 1.0,
            dtype: DType::F32,
        };
        let kind = AdapterKind::Lokr {
            factor: -1,
            decompose_both,
            full_matrix,
        };
        Adapter::new(kind, shape, &base, rng)
    };
    let names = |a: &Adapter| a.named_vars().iter().map(|(n, _)| *n).collect::<Vec<_>>();
    // 1024 = 32 × 32, 512 = 16 × 32: w1 [32, 16], w2 [32, 32].
    let a = lokr(4, false, false, rng)?;
    assert_eq!(names(&a), ["lokr_w1", "lokr_w2_a", "lokr_w2_b"]);
    assert_eq!(a.named_vars()[1].1.dims(), [32, 4]);
    assert_eq!(a.rank(), 4);
    let b = lokr(4, true, false, rng)?;
    assert_eq!(
        names(&b),
        ["lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b"]
    );
    // Rank 16 is half of 32: w2 full; w1 full; scale 1.
    let c = lokr(16, false, false, rng)?;
    assert_eq!(names(&c), ["lokr_w1", "lokr_w2"]);
    assert_eq!(c.alpha(), c.rank() as f64);
    let d = lokr(4, true, true, rng)?;
    assert_eq!(names(&d), ["lokr_w1", "lokr_w2"]);
    assert_eq!((a.in_dim(), a.out_dim()), (512, 1024));
    Ok(())
}

/// The merged weight of every kind (dense and FP8 base, strength 1 and 0.8) computes what the adapted layer does:
/// `x W'ᵀ + b` equals the layer's forward with its adapter.
#[test]
fn the_merged_weight_of_every_kind_computes_the_adapted_output() -> Result<()> {
    let rng = &mut StdRng::seed_from_u64(7);
    for kind in KINDS {
        for (fp8, multiplier) in [(false, 1.0), (true, 1.0), (false, 0.8)] {
            let mut lin = layer(kind, fp8, DType::F32, rng)?;
            randomise(&mut lin, multiplier, rng)?;
            let adapter = lin
                .adapter()
                .cloned()
                .ok_or_else(|| candle_core::Error::msg("no adapter"))?;
            let merged = adapter.merged_weight(&lin.base().dense(DType::F32)?)?;
            let bias = lin.bias().cloned();
            let plain = Linear::from_weights(merged, bias);
            let x = randn(rng, (5, 24), 0.0, 1.0, &Device::Cpu)?;
            let (want, _) = lin.forward_untracked(&x)?;
            let (got, _) = plain.forward_untracked(&x)?;
            let (unadapted, _) = no_adapter(&lin).forward_untracked(&x)?;
            let case = format!("{kind:?}, fp8 {fp8}, multiplier {multiplier}");
            assert!(rel(&got, &want)? < 1e-5, "{case}: {}", rel(&got, &want)?);
            assert!(
                rel(&unadapted, &want)? > 1e-2,
                "{case}: the adapter changes nothing"
            );
        }
    }
    Ok(())
}
