use candle_core::{DType, Device, Result, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::super::grad::{InputGrad, LinearTape};
use super::*;
use crate::adapter::{AdapterKind, AdapterShape};
use crate::fp8::{quantize, Fp8Scale};
use crate::init::randn;
use crate::linear::BaseWeight;
use crate::testing::rel;

/// A layer `in_dim` → `out_dim` (bias, dense or FP8 base) with an adapter of `kind` at `rank`, every factor
/// random and strength 0.8.
fn layer(kind: AdapterKind, [in_dim, out_dim, rank]: [usize; 3], fp8: bool) -> Result<Linear> {
    let rng = &mut StdRng::seed_from_u64((in_dim * 131 + out_dim * 7 + rank) as u64);
    let dev = Device::Cpu;
    let w = randn(rng, (out_dim, in_dim), 0.0, 0.3, &dev)?;
    let base = if fp8 {
        BaseWeight::Fp8(quantize(&w, Fp8Scale::Tensor)?)
    } else {
        BaseWeight::Dense(w)
    };
    let shape = AdapterShape {
        in_dim,
        out_dim,
        rank,
        alpha: 3.0,
        dtype: DType::F32,
    };
    let mut adapter = Adapter::new(kind, shape, &base, rng)?;
    for (name, v) in adapter.named_vars() {
        let noise = randn(rng, v.shape(), 0.0, 0.3, &dev)?;
        let value = if name == "dora_scale" {
            (v.as_tensor() * (noise + 1.0)?)?
        } else {
            noise
        };
        v.set(&value)?;
    }
    adapter.set_multiplier(0.8);
    let mut lin = Linear::from_base(base, Some(randn(rng, out_dim, 0.0, 0.1, &dev)?));
    lin.set_adapter(Some(adapter));
    Ok(lin)
}

fn lokr(factor: i64, decompose_both: bool, full_matrix: bool) -> AdapterKind {
    AdapterKind::Lokr {
        factor,
        decompose_both,
        full_matrix,
    }
}

/// Each way of applying a LoKr or LoHa update (factored, merged, LoHa's forward on the merged weight) gives the
/// forward, the input gradient (fresh and added to a sum) and every factor's gradient of candle's autograd through
/// `x (W + ΔW)ᵀ`, on non-square layers, a prime width (LoKr's `w1` one column), `w2` a product and full, `w1` a
/// product, dense and FP8 bases.
#[test]
fn both_update_paths_equal_the_merged_reference() -> Result<()> {
    let cases = [
        (AdapterKind::Loha, [24, 16, 2]),
        (AdapterKind::Loha, [12, 30, 3]),
        (lokr(-1, false, false), [24, 16, 2]),
        (lokr(-1, false, false), [7, 20, 1]),
        (lokr(-1, false, true), [12, 30, 2]),
        (lokr(8, true, false), [48, 64, 2]),
        (lokr(4, false, false), [64, 16, 2]),
    ];
    let rng = &mut StdRng::seed_from_u64(11);
    for (kind, dims) in cases {
        for fp8 in [false, true] {
            let lin = layer(kind, dims, fp8)?;
            let adapter = lin
                .adapter()
                .cloned()
                .ok_or_else(|| candle_core::Error::msg("no adapter"))?;
            let names: Vec<_> = adapter.named_vars().iter().map(|(n, _)| *n).collect();
            let x = Var::from_tensor(&randn(rng, (5, dims[0]), 0.0, 1.0, &Device::Cpu)?)?;
            let dy = randn(rng, (5, dims[1]), 0.0, 1.0, &Device::Cpu)?;
            let acc = randn(rng, (5, dims[0]), 0.0, 1.0, &Device::Cpu)?;
            let y_ref = lin.forward(x.as_tensor())?;
            let store = (&y_ref * &dy)?.sum_all()?.backward()?;
            let dx_ref = store
                .get(x.as_tensor())
                .ok_or_else(|| candle_core::Error::msg("no dx"))?;
            for path in [
                UpdatePath::Factored,
                UpdatePath::Merged,
                UpdatePath::MergedForward,
            ] {
                let case = format!("{kind:?} {dims:?} fp8 {fp8} {path:?} ({names:?})");
                let (y, tape) =
                    lin.forward_kind_on(x.as_tensor(), &adapter, vec![5, dims[1]], path)?;
                assert!(
                    rel(&y, &y_ref)? < 1e-5,
                    "{case}: forward {}",
                    rel(&y, &y_ref)?
                );
                for tape in [tape, LinearTape::default()] {
                    let io = (x.as_tensor(), &tape, &dy);
                    let (dx, params) = lin.backward_kind_on(&adapter, io, InputGrad::New, path)?;
                    let dx = dx.ok_or_else(|| candle_core::Error::msg("no input gradient"))?;
                    assert!(rel(&dx, dx_ref)? < 1e-5, "{case}: input gradient");
                    let added = InputGrad::Add(acc.copy()?);
                    let (sum, again) = lin.backward_kind_on(&adapter, io, added, path)?;
                    let sum = sum.ok_or_else(|| candle_core::Error::msg("no sum"))?;
                    assert!(
                        rel(&sum, &(&acc + dx_ref)?)? < 1e-5,
                        "{case}: added input gradient"
                    );
                    assert_eq!(params.len(), names.len(), "{case}");
                    for ((p, q), (name, v)) in params.iter().zip(&again).zip(adapter.named_vars()) {
                        assert_eq!(p.var.as_tensor().id(), v.as_tensor().id(), "{case}: order");
                        let want = store
                            .get(v.as_tensor())
                            .ok_or_else(|| candle_core::Error::msg("no grad"))?;
                        assert!(
                            rel(&p.grad, want)? < 1e-5,
                            "{case}: {name} {}",
                            rel(&p.grad, want)?
                        );
                        assert_eq!(rel(&q.grad, &p.grad)?, 0.0, "{case}: {name} again");
                    }
                }
            }
        }
    }
    Ok(())
}

/// The rows `‖W + s·B·A‖` of DoRA without forming the sum equal the merged weight's, in f32 and f64, on a dense
/// and an FP8 base (the FP8 one dequantised as the layer's product does), and `‖W_o‖²` is computed once per layer.
#[test]
fn dora_norms_equal_the_merged_weights_norms() -> Result<()> {
    for fp8 in [false, true] {
        let lin = layer(AdapterKind::Dora, [24, 40, 4], fp8)?;
        let Some(Adapter::Dora(dora)) = lin.adapter() else {
            candle_core::bail!("no DoRA");
        };
        let (down, up) = (dora.lora.down.as_tensor(), dora.lora.up.as_tensor());
        let w = lin.base().dense(DType::F64)?;
        let delta = (up
            .to_dtype(DType::F64)?
            .matmul(&down.to_dtype(DType::F64)?)?
            * dora.lora.scale())?;
        let want = ((w + delta)?.sqr()?.sum_keepdim(1)?.sqrt()? + f64::from(f32::EPSILON))?;
        assert!(lin.base_squares.0.get().is_none());
        let norms = lin.dora_norms(dora, DType::F32)?;
        assert_eq!(norms.dims(), [40, 1]);
        assert!(
            rel(&norms, &want)? < 1e-6,
            "fp8 {fp8}: {}",
            rel(&norms, &want)?
        );
        let cached = lin.base_squares.0.get().map(Tensor::id);
        assert!(cached.is_some(), "‖W_o‖² kept");
        let copy = lin.clone();
        assert!(rel(&copy.dora_norms(dora, DType::F32)?, &norms)? == 0.0);
        assert_eq!(
            copy.base_squares.0.get().map(Tensor::id),
            cached,
            "a copy shares it"
        );
    }
    Ok(())
}

/// LoKr at many rows runs its forward on the merged weight, except over a base whose products run on FP8 tensor
/// cores (no merged weight for them); at a few rows it runs through its factors.
#[test]
fn lokr_builds_the_merged_weight_only_where_the_base_product_can_use_it() -> Result<()> {
    let dense = layer(lokr(-1, false, false), [768, 768, 4], false)?;
    let fp8 = layer(lokr(-1, false, false), [768, 768, 4], true)?;
    let adapter = dense
        .adapter()
        .cloned()
        .ok_or_else(|| candle_core::Error::msg("no adapter"))?;
    let rows = |m: usize| Tensor::zeros((m, 768), DType::F32, &Device::Cpu);
    assert_eq!(
        dense.update_path(&adapter, &rows(4096)?)?,
        UpdatePath::MergedForward
    );
    assert_eq!(
        dense.update_path(&adapter, &rows(2)?)?,
        UpdatePath::Factored
    );
    assert_eq!(
        fp8.update_path(&adapter, &rows(4096)?)?,
        UpdatePath::MergedForward
    );
    let BaseWeight::Fp8(w) = fp8.base.clone() else {
        candle_core::bail!("not an FP8 base");
    };
    let mut products = Linear::from_base(BaseWeight::Fp8(w.for_fp8_products()?), None);
    products.set_adapter(Some(adapter.clone()));
    assert_eq!(
        products.update_path(&adapter, &rows(4096)?)?,
        UpdatePath::Factored
    );
    Ok(())
}
