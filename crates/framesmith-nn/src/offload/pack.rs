//! One streamed block's frozen tensors packed into a single host buffer: the layout (dtype, shape, aligned byte
//! offset of each tensor) is the same for every block of a model, so one description serves the whole ring.

use candle_core::{DType, Device, Result, Tensor};

use rayon::prelude::*;

use crate::bytes::with_tensor_bytes;

/// Copies larger than this are split between threads, a part of this size each.
const COPY_PART_BYTES: usize = 4 << 20;

/// Copies `from` into `to` (the same length), large copies by several threads.
fn copy_parallel(to: &mut [u8], from: &[u8]) -> Result<()> {
    if to.len() != from.len() {
        candle_core::bail!(
            "a tensor of {} bytes does not fit its {} bytes in the packed block",
            from.len(),
            to.len()
        );
    }
    if from.len() <= COPY_PART_BYTES {
        to.copy_from_slice(from);
    } else {
        to.par_chunks_mut(COPY_PART_BYTES)
            .zip(from.par_chunks(COPY_PART_BYTES))
            .for_each(|(to, from)| to.copy_from_slice(from));
    }
    Ok(())
}

/// Offsets are aligned to this many bytes (the copy engine's and the allocator's preferred granularity).
pub const ALIGN: usize = 256;

/// Where one tensor sits in a packed block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub dims: Vec<usize>,
    pub dtype: DType,
    /// Byte offset in the packed buffer (a multiple of [`ALIGN`]).
    pub offset: usize,
    pub bytes: usize,
}

/// The layout of a packed block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    pub specs: Vec<TensorSpec>,
    /// Total bytes including alignment padding.
    pub total_bytes: usize,
}

impl BlockLayout {
    /// The layout of `tensors`, in order.
    pub fn of(tensors: &[Tensor]) -> Self {
        let mut offset = 0usize;
        let mut specs = Vec::with_capacity(tensors.len());
        for t in tensors {
            let bytes = t.elem_count() * t.dtype().size_in_bytes();
            specs.push(TensorSpec {
                dims: t.dims().to_vec(),
                dtype: t.dtype(),
                offset,
                bytes,
            });
            offset += bytes.div_ceil(ALIGN) * ALIGN;
        }
        Self {
            specs,
            total_bytes: offset,
        }
    }

    /// Bytes of real data (what a copy moves, without padding).
    pub fn data_bytes(&self) -> usize {
        self.specs.iter().map(|s| s.bytes).sum()
    }

    /// Fails unless `tensors` match this layout's shapes and dtypes.
    pub fn check(&self, tensors: &[Tensor]) -> Result<()> {
        let other = Self::of(tensors);
        if other != *self {
            candle_core::bail!(
                "a streamed block's tensors differ in shape or dtype from the first block's"
            );
        }
        Ok(())
    }

    /// Writes `tensors` into `out` (`total_bytes` long) at their offsets.
    pub fn pack_into(&self, tensors: &[Tensor], out: &mut [u8]) -> Result<()> {
        if out.len() < self.total_bytes || tensors.len() != self.specs.len() {
            candle_core::bail!("packed buffer or tensor count does not match the block layout");
        }
        for (spec, t) in self.specs.iter().zip(tensors) {
            let place = &mut out[spec.offset..spec.offset + spec.bytes];
            with_tensor_bytes(t, |bytes| copy_parallel(place, bytes))??;
        }
        Ok(())
    }

    /// Packs a block's frozen tensors (which must match this layout) into `out`.
    pub fn pack_block<B: super::Streamable>(&self, block: &B, out: &mut [u8]) -> Result<()> {
        let tensors = block.frozen_tensors();
        self.check(&tensors)?;
        self.pack_into(&tensors, out)
    }

    /// The tensors of a packed buffer, on `device`.
    pub fn unpack(&self, packed: &[u8], device: &Device) -> Result<Vec<Tensor>> {
        self.specs
            .iter()
            .map(|s| {
                Tensor::from_raw_buffer(
                    &packed[s.offset..s.offset + s.bytes],
                    s.dtype,
                    &s.dims,
                    &Device::Cpu,
                )?
                .to_device(device)
            })
            .collect()
    }

    /// Zero-filled tensors of this layout on `device` (a GPU slot before its first copy).
    pub fn zeros(&self, device: &Device) -> Result<Vec<Tensor>> {
        self.specs
            .iter()
            .map(|s| Tensor::zeros(s.dims.as_slice(), s.dtype, device))
            .collect()
    }
}
