//! The input gradient `dY · W` of a layer whose FP8 weight is marked for FP8 products, on FP8 tensor cores (see the
//! parent module's docs): `dY · diag(scale)` quantised per row, the codes transposed, one cuBLASLt product.

use std::sync::PoisonError;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, DType, InplaceOp2, Layout, Result, Tensor};

use super::{fp8_context, quantize_rows_view, supported, ColScale, Dims, Operands};
use crate::cuda::ptx::{self, long};

/// A CUDA `U8` tensor `[rows, cols]` transposed to `[cols, rows]` (the kernel [`fp8_input_grad`] uses on the
/// weight's codes).
pub fn transpose_bytes(codes: &Tensor) -> Result<Tensor> {
    let (rows, cols) = codes.dims2()?;
    if codes.dtype() != DType::U8 {
        candle_core::bail!("transpose_bytes takes U8, not {:?}", codes.dtype());
    }
    let codes = codes.contiguous()?;
    let (storage, layout) = codes.storage_and_layout();
    let storage = ptx::cuda_storage(&storage, "transpose_bytes")?;
    let dev = storage.device().clone();
    let out = transpose_codes(&dev, &ptx::view::<u8>(storage, layout)?, rows, cols)?;
    Ok(ptx::untracked(
        CudaStorage::wrap_cuda_slice(out, dev),
        (cols, rows),
    ))
}

/// `codes` `[rows, cols]` (bytes) transposed to `[cols, rows]` (`fs_transpose_u8`).
fn transpose_codes(
    dev: &CudaDevice,
    codes: &CudaView<'_, u8>,
    rows: usize,
    cols: usize,
) -> Result<CudaSlice<u8>> {
    let func = ptx::load(dev, &ptx::FP8, "fs_transpose_u8")?;
    // SAFETY: the kernel writes every element (each of the rows · cols inputs lands once).
    let out = unsafe { dev.alloc::<u8>(rows * cols)? };
    let tiles = |n: usize| {
        u32::try_from(n.div_ceil(64))
            .map_err(|_| candle_core::Error::Msg(format!("transpose: {n} rows or columns")))
    };
    let config = LaunchConfig {
        grid_dim: (tiles(cols)?, tiles(rows)?, 1),
        block_dim: (16, 16, 1),
        shared_mem_bytes: 0,
    };
    let (r, c) = (long(rows)?, long(cols)?);
    let stream = dev.cuda_stream();
    let (in_ptr, _guard) = codes.device_ptr(&stream);
    let words = i32::from(rows % 4 == 0 && cols % 4 == 0 && in_ptr % 4 == 0);
    let mut b = stream.launch_builder(&func);
    b.arg(codes).arg(&out).arg(&r).arg(&c).arg(&words);
    // SAFETY: argument types and order match the kernel's signature; `codes` holds rows · cols bytes and `out`
    // as many (a fresh allocation, aligned); with `words` every 4-byte access is aligned (the input pointer and
    // both dims multiples of 4); the grid covers every 64 × 64 tile.
    unsafe { b.launch(config) }.w()?;
    Ok(out)
}

/// Whether a CUDA input gradient `dy [m, n] · W` for an FP8 weight `W` `[n, k]` takes the FP8 path
/// ([`fp8_input_grad`]): what [`supported`] asks of the forward `x [m, k] · Wᵀ`.
pub fn input_grad_supported(dy_dtype: DType, m: usize, n: usize, k: usize) -> bool {
    supported(dy_dtype, m, n, k)
}

/// Whether [`fp8_input_grad`] can add its product to `acc`: contiguous bf16 at the start of its storage (whose
/// allocation is 256-byte aligned, the alignment cuBLASLt's algorithms assume without a preference saying less).
pub fn takes_sum(acc: &Tensor) -> bool {
    acc.is_contiguous() && acc.dtype() == DType::BF16 && acc.layout().start_offset() == 0
}

/// The input gradient `dy · W` `[m, k]` of a layer with an FP8 weight `W` `[n, k]` (e4m3fn `codes` `[n, k]`,
/// f32 `scale` `[n]` per output channel), for a bf16 CUDA `dy` `[m, n]`, through FP8 tensor cores: `dy ·
/// diag(scale)` quantised to e4m3fn per row, times the codes transposed, with one scale per row of `dy` (see
/// the module docs). With `acc` (bf16 `[m, k]`, contiguous, a tensor the caller owns) the product is added to it
/// in place and `acc` returned; otherwise a new tensor.
pub fn fp8_input_grad(
    dy: &Tensor,
    codes: &Tensor,
    scale: &Tensor,
    acc: Option<Tensor>,
) -> Result<Tensor> {
    let (m, n) = dy.dims2()?;
    let (cn, k) = codes.dims2()?;
    if cn != n || scale.elem_count() != n {
        candle_core::bail!(
            "fp8_input_grad: gradient [{m}, {n}] against FP8 codes {:?} with {} scales",
            codes.dims(),
            scale.elem_count()
        );
    }
    if dy.dtype() != DType::BF16 || codes.dtype() != DType::U8 || scale.dtype() != DType::F32 {
        candle_core::bail!(
            "fp8_input_grad takes a bf16 gradient, U8 codes and f32 scales, got {:?} {:?} {:?}",
            dy.dtype(),
            codes.dtype(),
            scale.dtype()
        );
    }
    if !supported(dy.dtype(), m, n, k) {
        candle_core::bail!("fp8_input_grad: [{m}, {n}] · [{n}, {k}] is not an FP8 product shape");
    }
    let (out, beta) = match acc {
        Some(acc) => {
            if acc.dims() != [m, k] || !takes_sum(&acc) {
                candle_core::bail!(
                    "fp8_input_grad: the sum must be a contiguous bf16 [{m}, {k}] at the start of its storage, got \
                     {:?} {:?}",
                    acc.dims(),
                    acc.dtype()
                );
            }
            (acc, 1.0)
        }
        None => {
            let candle_core::Device::Cuda(dev) = dy.device() else {
                candle_core::bail!("fp8_input_grad: a gradient that is not on CUDA");
            };
            // SAFETY: with beta = 0 cuBLASLt writes all m · k values without reading them.
            let out = unsafe { dev.alloc::<half::bf16>(m * k)? };
            (
                ptx::untracked(CudaStorage::wrap_cuda_slice(out, dev.clone()), (m, k)),
                0.0,
            )
        }
    };
    out.inplace_op2(
        &dy.contiguous()?,
        &InputGrad {
            codes: codes.contiguous()?,
            scale: scale.contiguous()?,
            dims: Dims { m, n: k, k: n },
            beta,
        },
    )?;
    Ok(out)
}

/// [`fp8_input_grad`]'s product on the output's storage: `dims` as the forward names them for the product run
/// (`n` the input gradient's width, `k` the reduced output width).
struct InputGrad {
    codes: Tensor,
    scale: Tensor,
    dims: Dims,
    /// 1: added to the output; 0: the output written fresh.
    beta: f32,
}

impl InplaceOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "framesmith-fp8-input-grad"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        Err(crate::cuda::cuda_only(
            self.name(),
            "nn::cuda::fp8_gemm::fp8_input_grad",
        ))
    }

    fn cuda_fwd(
        &self,
        out: &mut CudaStorage,
        out_layout: &Layout,
        dy: &CudaStorage,
        dy_layout: &Layout,
    ) -> Result<()> {
        let Dims { m, n: k, k: n } = self.dims;
        let dev = dy.device().clone();
        let (cs, cl) = self.codes.storage_and_layout();
        let (ss, sl) = self.scale.storage_and_layout();
        let codes = ptx::view::<u8>(ptx::cuda_storage(&cs, self.name())?, cl)?;
        let factors = ColScale {
            values: ptx::view::<f32>(ptx::cuda_storage(&ss, self.name())?, sl)?,
            start_offset: sl.start_offset(),
        };
        let dy_view = ptx::view::<half::bf16>(dy, dy_layout)?;
        let (dq, dq_scale) = quantize_rows_view(
            &dev,
            &dy_view,
            Some(&factors),
            m,
            n,
            dy_layout.start_offset(),
        )?;
        let transposed = transpose_codes(&dev, &codes, n, k)?;
        let context = fp8_context(&dev)?;
        let mut context = context.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((start, end)) = out_layout.contiguous_offsets() else {
            candle_core::bail!("fp8_input_grad: a strided output");
        };
        let mut target = out.as_cuda_slice_mut::<half::bf16>()?.slice_mut(start..end);
        // Lent out of the cache for the product, which borrows the context.
        let ones = context.cache.take_ones(&dev, k)?;
        let operands = Operands {
            w: &transposed.slice(..),
            w_scale: &ones.slice(..k),
            x: &dq,
            x_scale: &dq_scale,
        };
        let ran = context.matmul(&dev, self.dims, operands, &mut target, self.beta);
        context.cache.ones = Some(ones);
        ran
    }
}
