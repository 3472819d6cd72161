//! Tensors as the little-endian bytes safetensors files and packed streaming buffers hold.

use candle_core::{CpuStorage, DType, Device, Result, Storage, Tensor};

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

/// Calls `f` with the little-endian bytes of `t`'s elements in row-major order: borrowed from the buffer of a
/// contiguous host tensor where they can be (its own memory, no copy), else a copy ([`tensor_bytes`]).
pub fn with_tensor_bytes<R>(t: &Tensor, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
            if let Some(bytes) = host_bytes(cpu, start, end) {
                return Ok(f(bytes));
            }
        }
    }
    Ok(f(&tensor_bytes(t)?))
}

/// Elements `start..end` of `cpu` as their bytes, where their in-memory form is the little-endian one.
fn host_bytes(cpu: &CpuStorage, start: usize, end: usize) -> Option<&[u8]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    match cpu {
        CpuStorage::U8(v) => v.get(start..end),
        CpuStorage::BF16(v) => v.get(start..end).map(bytemuck::cast_slice),
        CpuStorage::F16(v) => v.get(start..end).map(bytemuck::cast_slice),
        CpuStorage::F32(v) => v.get(start..end).map(bytemuck::cast_slice),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn borrowed_bytes_are_the_copied_ones() {
        let x = Tensor::arange(0f32, 24., &Device::Cpu)
            .unwrap()
            .reshape((4, 6))
            .unwrap();
        for t in [
            x.clone(),
            x.to_dtype(DType::BF16).unwrap(),
            x.to_dtype(DType::F16).unwrap(),
            x.to_dtype(DType::U8).unwrap(),
            // A view that does not start at its buffer's start, and a transposed (strided) one.
            x.narrow(0, 1, 2).unwrap(),
            x.t().unwrap(),
        ] {
            let copied = tensor_bytes(&t).unwrap();
            assert_eq!(with_tensor_bytes(&t, <[u8]>::to_vec).unwrap(), copied);
            assert_eq!(copied.len(), t.elem_count() * t.dtype().size_in_bytes());
        }
    }
}
