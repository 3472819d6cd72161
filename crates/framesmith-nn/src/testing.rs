//! Test helpers shared by the unit tests of the layers, the models and the training step (in every crate).

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

/// ‖a − b‖ / ‖b‖ computed in f32 (any float dtypes of one shape).
pub fn rel(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    let d = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    let n = b.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    Ok((d / n.max(1e-30)).sqrt())
}

/// f32 zeros on the CPU under each `(name, shape)`: a checkpoint's tensor map for tests of key handling.
pub fn zero_tensors(keys: &[(&str, &[usize])]) -> Result<HashMap<String, Tensor>> {
    keys.iter()
        .map(|(k, s)| {
            Ok((
                (*k).to_string(),
                Tensor::zeros(*s, DType::F32, &Device::Cpu)?,
            ))
        })
        .collect()
}

/// The bit patterns of an f32 tensor's values, flattened (for bit-exact comparisons).
pub fn f32_bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .map(|v| v.to_bits())
        .collect())
}

/// Attaches a fresh adapter of `kind` (rank 4, alpha 8) to every layer of `linears`, gives every factor random
/// values (DoRA's magnitude stays near the row norms) and the strength 0.7, so no gradient is zero and the
/// multiplier is exercised; returns the variables in the layers' order.
pub fn attach_random_adapters<'a>(
    linears: impl IntoIterator<Item = (String, &'a mut crate::linear::Linear)>,
    kind: crate::adapter::AdapterKind,
    seed: u64,
) -> Result<Vec<candle_core::Var>> {
    use rand::SeedableRng;
    let rng = &mut rand::rngs::StdRng::seed_from_u64(seed);
    let mut vars = Vec::new();
    for (_, linear) in linears {
        let shape = crate::adapter::AdapterShape {
            in_dim: linear.in_dim(),
            out_dim: linear.out_dim(),
            rank: 4,
            alpha: 8.0,
            dtype: DType::F32,
        };
        let mut adapter = crate::adapter::Adapter::new(kind, shape, linear.base(), rng)?;
        for (name, v) in adapter.named_vars() {
            let noise = crate::init::randn(rng, v.shape(), 0.0, 0.1, &Device::Cpu)?;
            let value = if name == "dora_scale" {
                (v.as_tensor() * (noise + 1.0)?)?
            } else {
                noise
            };
            v.set(&value.to_device(v.device())?)?;
        }
        adapter.set_multiplier(0.7);
        vars.extend(adapter.vars());
        linear.set_adapter(Some(adapter));
    }
    Ok(vars)
}
