//! Tensors as the little-endian bytes safetensors files and packed streaming buffers hold.

use candle_core::{DType, Device, Result, Tensor};

/// The little-endian bytes of a tensor's elements, in row-major order.
pub fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let flat = t.to_device(&Device::Cpu)?.flatten_all()?;
    Ok(match t.dtype() {
        DType::U8 => flat.to_vec1::<u8>()?,
        DType::F32 => flat
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::BF16 => flat
            .to_vec1::<half::bf16>()?
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
        DType::F16 => flat
            .to_vec1::<half::f16>()?
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
        other => candle_core::bail!("block streaming cannot pack {other:?} tensors"),
    })
}
