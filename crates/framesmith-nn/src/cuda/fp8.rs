//! FP8 e4m3fn weight dequantisation on CUDA (`kernels/fp8.cu`), with f32 scales per tensor, per output channel
//! or per block of 64 input values, into bf16 or f32. candle 0.11.1's CUDA cast from `F8E4M3` is missing, so this
//! is the path for FP8 base weights on the GPU.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::ptx::{self, long};
use crate::fp8::{Fp8Scale, BLOCK_SIZE};

/// How `scale_elems` scales are grouped over a weight `[rows, cols]`: one, one per row, or one per
/// [`BLOCK_SIZE`] consecutive values of a row (the last block of a row may be short). When the counts coincide (a
/// single row, or `cols <= 64`) the groupings give the same values.
fn scale_mode(scale_elems: usize, rows: usize, cols: usize) -> Result<Fp8Scale> {
    if scale_elems == 1 {
        Ok(Fp8Scale::Tensor)
    } else if scale_elems == rows {
        Ok(Fp8Scale::Channel)
    } else if scale_elems == rows * cols.div_ceil(BLOCK_SIZE) {
        Ok(Fp8Scale::Block64)
    } else {
        candle_core::bail!(
            "FP8 scale with {scale_elems} values fits none of per-tensor, per-channel ({rows}) or \
             block-{BLOCK_SIZE} ({}) for a [{rows}, {cols}] weight",
            rows * cols.div_ceil(BLOCK_SIZE)
        )
    }
}

/// The kernel's `mode` argument for `scale` (`kernels/fp8.cu`).
fn kernel_mode(scale: Fp8Scale) -> i32 {
    match scale {
        Fp8Scale::Tensor => 0,
        Fp8Scale::Channel => 1,
        Fp8Scale::Block64 => 2,
    }
}

/// Dequantises FP8 e4m3fn `codes` `[out, in]` (dtype `U8` holding the raw codes, or `F8E4M3`) with f32 `scale`
/// (1, `out` or `out * ceil(in / 64)` values: per tensor, per channel, block-64) into `dtype` (`BF16` or `F32`).
/// CUDA tensors run the kernel; others use [`dequantize_fp8_reference`].
pub fn dequantize_fp8_cuda(codes: &Tensor, scale: &Tensor, dtype: DType) -> Result<Tensor> {
    let (rows, cols) = codes.dims2()?;
    scale_mode(scale.elem_count(), rows, cols)?;
    if !codes.device().is_cuda() {
        return dequantize_fp8_reference(codes, scale, dtype);
    }
    let scale = scale.to_dtype(DType::F32)?.flatten_all()?.contiguous()?;
    codes
        .contiguous()?
        .apply_op2_no_bwd(&scale, &Dequant { dtype })
}

/// CPU-friendly reference: candle's own e4m3 decoding (through `F8E4M3`), the scale broadcast per layout, then
/// a cast to `dtype`. Independent of the kernel's bit decoding, so the device test compares two implementations.
pub fn dequantize_fp8_reference(codes: &Tensor, scale: &Tensor, dtype: DType) -> Result<Tensor> {
    let (rows, cols) = codes.dims2()?;
    let grouping = scale_mode(scale.elem_count(), rows, cols)?;
    let device = codes.device();
    let cpu = codes.to_device(&candle_core::Device::Cpu)?;
    let values = match cpu.dtype() {
        DType::U8 => {
            let bytes = cpu.flatten_all()?.to_vec1::<u8>()?;
            let f8: Vec<float8::F8E4M3> =
                bytes.into_iter().map(float8::F8E4M3::from_bits).collect();
            Tensor::from_vec(f8, (rows, cols), &candle_core::Device::Cpu)?.to_dtype(DType::F32)?
        }
        _ => cpu.to_dtype(DType::F32)?,
    };
    let scale = scale
        .to_device(&candle_core::Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?;
    let out = match grouping {
        Fp8Scale::Tensor => values.broadcast_mul(&scale.reshape((1, 1))?)?,
        Fp8Scale::Channel => values.broadcast_mul(&scale.reshape((rows, 1))?)?,
        Fp8Scale::Block64 => {
            let nblocks = cols.div_ceil(BLOCK_SIZE);
            let padded = nblocks * BLOCK_SIZE;
            let values = if padded > cols {
                values.pad_with_zeros(1, 0, padded - cols)?
            } else {
                values
            };
            values
                .reshape((rows, nblocks, BLOCK_SIZE))?
                .broadcast_mul(&scale.reshape((rows, nblocks, 1))?)?
                .reshape((rows, padded))?
                .narrow(1, 0, cols)?
        }
    };
    out.to_dtype(dtype)?.to_device(device)
}

struct Dequant {
    dtype: DType,
}

impl CustomOp2 for Dequant {
    fn name(&self) -> &'static str {
        "framesmith-fp8-dequant"
    }

    cuda_only_cpu_fwd!("dequantize_fp8_reference"; codes, scale);

    fn cuda_fwd(
        &self,
        codes: &CudaStorage,
        codes_l: &Layout,
        scale: &CudaStorage,
        scale_l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = codes.device().clone();
        let (rows, cols) = codes_l.shape().dims2()?;
        let grouping = scale_mode(scale_l.shape().elem_count(), rows, cols)?;
        let n = rows * cols;
        let scale = ptx::view::<f32>(scale, scale_l)?;
        let (func_name, out_elems_per_thread, vec8) = match self.dtype {
            DType::BF16 => {
                let vec8 = cols % 8 == 0 && codes_l.start_offset() % 8 == 0;
                ("fs_fp8_dequant_bf16", if vec8 { 8 } else { 1 }, vec8)
            }
            DType::F32 => ("fs_fp8_dequant_f32", 1, false),
            other => candle_core::bail!("FP8 dequantisation produces bf16 or f32, not {other:?}"),
        };
        let func = ptx::load(&dev, &ptx::FP8, func_name)?;
        let cfg = ptx::elementwise_config(n / out_elems_per_thread);
        let (rows_l, cols_l, mode, block) = (
            long(rows)?,
            long(cols)?,
            kernel_mode(grouping),
            BLOCK_SIZE as i32,
        );
        let vec8 = i32::from(vec8);
        macro_rules! launch {
            ($codes:expr, $out_ty:ty) => {{
                // SAFETY: every element is written by the kernel before the tensor is read.
                let out = unsafe { dev.alloc::<$out_ty>(n)? };
                let codes_view = $codes;
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&func);
                b.arg(&codes_view).arg(&scale).arg(&out).arg(&rows_l).arg(&cols_l).arg(&mode).arg(&block);
                if self.dtype == DType::BF16 {
                    b.arg(&vec8);
                }
                // SAFETY: argument types and order match the kernel's signature in kernels/fp8.cu; the views
                // hold rows * cols codes and the scale count was checked against the layout.
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match (codes.dtype(), self.dtype) {
            (DType::U8, DType::BF16) => launch!(ptx::view::<u8>(codes, codes_l)?, half::bf16),
            (DType::U8, _) => launch!(ptx::view::<u8>(codes, codes_l)?, f32),
            (DType::F8E4M3, DType::BF16) => {
                launch!(ptx::view::<float8::F8E4M3>(codes, codes_l)?, half::bf16)
            }
            (DType::F8E4M3, _) => launch!(ptx::view::<float8::F8E4M3>(codes, codes_l)?, f32),
            (other, _) => candle_core::bail!("FP8 codes must be U8 or F8E4M3, not {other:?}"),
        };
        Ok((out, codes_l.shape().clone()))
    }
}
