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
