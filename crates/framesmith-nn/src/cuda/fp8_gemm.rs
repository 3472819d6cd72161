//! FP8 tensor-core products for a frozen FP8 base (`model.fp8_matmul`): `y = x Wᵀ` with the bf16 activations `x`
//! quantised to e4m3fn per row (`fs_fp8_quantize_rows_bf16` in kernels/fp8.cu) and the weight's e4m3fn codes with
//! one scale per output channel, multiplied by cuBLASLt with outer-vector scales (f32 accumulation, bf16 output).
//! Both scale vectors are applied inside the product, so nothing is dequantised. Needs FP8 tensor cores and a
//! cuBLASLt with outer-vector scaling for them (Hopper with cuBLAS 12.9 or later); [`probe`] says whether this
//! GPU and library can.
//!
//! The input gradient `dY · W` of such a layer ([`fp8_input_grad`]) runs on FP8 tensor cores as well: `W`'s scale
//! is per output channel, which is the reduced dimension there, so it multiplies `dY`'s columns before `dY` is
//! quantised per row, and the codes are transposed to `[in, out]` for the product (Hopper's FP8 kernels take only
//! operands whose reduced dimension is contiguous).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublaslt::sys;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Layout, Result, Tensor};

use super::lt::{lt_context, matrix, set_attr, tn_desc, Layouts, LtContext, LtContexts, Plan};
use super::ptx::{self, long};

mod input_grad;
pub use input_grad::{fp8_input_grad, input_grad_supported, takes_sum, transpose_bytes};

/// cuBLASLt workspace: NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// Whether a CUDA `x [m, k] · codesᵀ` (`codes` `[n, k]`) takes the FP8 path: bf16 activations, `k` and `n`
/// multiples of 16 (the FP8 kernels' operand alignment), at least 16 rows. Other products with a weight marked
/// for FP8 products (a modulation's one row per sample) dequantise it as usual.
pub fn supported(x_dtype: DType, m: usize, n: usize, k: usize) -> bool {
    x_dtype == DType::BF16 && m >= 16 && n % 16 == 0 && k % 16 == 0 && n > 0 && k > 0
}

/// e4m3fn codes `[m, k]` (`U8`) and f32 scales `[m]` of a bf16 CUDA tensor `[m, k]`, one scale per row
/// (`amax / 448`); see `fs_fp8_quantize_rows_bf16`. [`crate::fp8::quantize_rows_reference`] is the CPU version.
pub fn quantize_rows(x: &Tensor) -> Result<(Tensor, Tensor)> {
    quantize_rows_scaled(x, None)
}

/// [`quantize_rows`] of `x · diag(col_scale)` for f32 column factors `[k]` (the input gradient's quantisation,
/// [`fp8_input_grad`]): each value multiplied by its factor in f32, then quantised.
pub fn quantize_rows_scaled(x: &Tensor, col_scale: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    let (m, k) = x.dims2()?;
    if x.dtype() != DType::BF16 {
        candle_core::bail!("quantize_rows takes bf16 activations, not {:?}", x.dtype());
    }
    let x = x.contiguous()?;
    let (storage, layout) = x.storage_and_layout();
    let storage = ptx::cuda_storage(&storage, "quantize_rows")?;
    let view = ptx::view::<half::bf16>(storage, layout)?;
    let dev = storage.device().clone();
    let factors = col_scale.map(|f| f.contiguous()).transpose()?;
    if let Some(f) = &factors {
        if f.dims() != [k] || f.dtype() != DType::F32 {
            candle_core::bail!(
                "quantize_rows: column factors must be f32 [{k}], got {:?} {:?}",
                f.dims(),
                f.dtype()
            );
        }
    }
    let guard = factors.as_ref().map(|f| f.storage_and_layout());
    let col = match &guard {
        Some((fs, fl)) => Some(ColScale {
            values: ptx::view::<f32>(ptx::cuda_storage(fs, "quantize_rows")?, fl)?,
            start_offset: fl.start_offset(),
        }),
        None => None,
    };
    let (codes, scale) =
        quantize_rows_view(&dev, &view, col.as_ref(), m, k, layout.start_offset())?;
    Ok((
        ptx::untracked(CudaStorage::wrap_cuda_slice(codes, dev.clone()), (m, k)),
        ptx::untracked(CudaStorage::wrap_cuda_slice(scale, dev), m),
    ))
}

/// A column factor vector for [`quantize_rows_view`]: the values and their offset in elements within their
/// allocation (the kernel's 16-byte loads of it need the offset a multiple of 4).
struct ColScale<'a> {
    values: CudaView<'a, f32>,
    start_offset: usize,
}

/// Row-wise quantisation of `x` `[m, k]` (starting `start_offset` elements into its allocation), each column first
/// multiplied by its `col_scale` factor when given.
fn quantize_rows_view(
    dev: &CudaDevice,
    x: &CudaView<'_, half::bf16>,
    col_scale: Option<&ColScale<'_>>,
    m: usize,
    k: usize,
    start_offset: usize,
) -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
    let func = ptx::load(dev, &ptx::FP8, "fs_fp8_quantize_rows_bf16")?;
    // SAFETY: the kernel writes every code and every row's scale before either is read.
    let codes = unsafe { dev.alloc::<u8>(m * k)? };
    // SAFETY: as above.
    let scale = unsafe { dev.alloc::<f32>(m)? };
    let factors_aligned = col_scale.is_none_or(|c| c.start_offset % 4 == 0);
    let vec = i32::from(k % 8 == 0 && start_offset % 8 == 0 && factors_aligned);
    let (rows, cols) = (long(m)?, long(k)?);
    let no_factors = 0u64;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(x);
    match col_scale {
        Some(c) => b.arg(&c.values),
        None => b.arg(&no_factors),
    };
    b.arg(&codes).arg(&scale).arg(&rows).arg(&cols).arg(&vec);
    // SAFETY: argument types and order match the kernel's signature (a null pointer for no column factors);
    // `x` holds m * k values, the factors k, and the outputs m * k codes and m scales; with `vec` every row
    // starts 16-byte aligned (k and the offset multiples of 8) and so does every 8 factors' group.
    unsafe { b.launch(ptx::row_config(m)?) }.w()?;
    Ok((codes, scale))
}

/// `x · Wᵀ` in bf16 for a bf16 CUDA `x` `[m, k]` and an FP8 weight given by its e4m3fn `codes` `[n, k]` (`U8`,
/// contiguous) and f32 per-channel `scale` `[n]`, through FP8 tensor cores (see the module docs).
pub fn fp8_linear(x: &Tensor, codes: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let (m, _) = x.dims2()?;
    let n = codes.dim(0)?;
    let x = x.contiguous()?;
    let (storage, layout) = x.storage_and_layout();
    let storage = ptx::cuda_storage(&storage, "fp8_linear")?;
    let out = fp8_linear_storage(storage, layout, codes, scale)?;
    Ok(ptx::untracked(out, (m, n)))
}

/// [`fp8_linear`] on a contiguous storage `x` `[m, k]` (the frozen matmul's forward).
pub fn fp8_linear_storage(
    x: &CudaStorage,
    x_layout: &Layout,
    codes: &Tensor,
    scale: &Tensor,
) -> Result<CudaStorage> {
    let (m, k) = x_layout.shape().dims2()?;
    let (n, wk) = codes.dims2()?;
    if wk != k || scale.elem_count() != n {
        candle_core::bail!(
            "fp8_linear: input [{m}, {k}] against FP8 codes {:?} with {} scales (one per output channel)",
            codes.dims(),
            scale.elem_count()
        );
    }
    if x.dtype() != DType::BF16 || codes.dtype() != DType::U8 || scale.dtype() != DType::F32 {
        candle_core::bail!(
            "fp8_linear takes bf16 activations, U8 codes and f32 scales, got {:?} {:?} {:?}",
            x.dtype(),
            codes.dtype(),
            scale.dtype()
        );
    }
    if n % 16 != 0 || k % 16 != 0 {
        candle_core::bail!("fp8_linear needs the weight's dims [{n}, {k}] in multiples of 16");
    }
    let dev = x.device().clone();
    let x_view = ptx::view::<half::bf16>(x, x_layout)?;
    let (xq, xs) = quantize_rows_view(&dev, &x_view, None, m, k, x_layout.start_offset())?;
    let codes = codes.contiguous()?;
    let scale = scale.contiguous()?;
    let (cs, cl) = codes.storage_and_layout();
    let (ss, sl) = scale.storage_and_layout();
    let w = ptx::view::<u8>(ptx::cuda_storage(&cs, "fp8_linear")?, cl)?;
    let ws = ptx::view::<f32>(ptx::cuda_storage(&ss, "fp8_linear")?, sl)?;
    // SAFETY: cuBLASLt writes all m * n outputs (beta = 0) before anything reads them.
    let mut out = unsafe { dev.alloc::<half::bf16>(m * n)? };
    let operands = Operands {
        w: &w,
        w_scale: &ws,
        x: &xq,
        x_scale: &xs,
    };
    let context = fp8_context(&dev)?;
    let mut context = context.lock().unwrap_or_else(PoisonError::into_inner);
    context.matmul(
        &dev,
        Dims { m, n, k },
        operands,
        &mut out.slice_mut(..),
        0.0,
    )?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// This device's cuBLASLt context of the FP8 products.
fn fp8_context(dev: &CudaDevice) -> Result<Arc<Mutex<LtContext<Fp8Cache>>>> {
    static CONTEXTS: OnceLock<LtContexts<Fp8Cache>> = OnceLock::new();
    lt_context(&CONTEXTS, dev, WORKSPACE_BYTES)
}

/// Whether this GPU and cuBLASLt run the FP8 product (a small one, checked against nothing: an error or no
/// algorithm means no). For a run's setup, before anything is trained with `model.fp8_matmul`.
pub fn probe(device: &Device) -> Result<()> {
    let x = Tensor::ones((16, 32), DType::BF16, device)?;
    let codes = Tensor::zeros((16, 32), DType::U8, device)?;
    let scale = Tensor::ones(16, DType::F32, device)?;
    fp8_linear(&x, &codes, &scale)?
        .to_device(&Device::Cpu)
        .map(|_| ())
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Dims {
    m: usize,
    n: usize,
    k: usize,
}

struct Operands<'a> {
    w: &'a CudaView<'a, u8>,
    w_scale: &'a CudaView<'a, f32>,
    x: &'a CudaSlice<u8>,
    x_scale: &'a CudaSlice<f32>,
}

/// What the FP8 products keep per device: each product shape's plan, and a vector of ones (the unit scales of
/// the input gradient's transposed codes), grown to the widest use.
#[derive(Default)]
pub(super) struct Fp8Cache {
    plans: HashMap<Dims, Plan>,
    ones: Option<CudaSlice<f32>>,
}

impl Fp8Cache {
    /// At least `len` ones on `dev`, taken out of the cache (the caller puts them back).
    fn take_ones(&mut self, dev: &CudaDevice, len: usize) -> Result<CudaSlice<f32>> {
        match self.ones.take() {
            Some(ones) if ones.len() >= len => Ok(ones),
            _ => dev.clone_htod(&vec![1f32; len]),
        }
    }
}

impl LtContext<Fp8Cache> {
    /// The row-major `y [m, n] = x [m, k] · Wᵀ` as cuBLASLt's column-major `yᵀ [n, m] = op(W) · xᵀ`: `W` stored
    /// `[n, k]` row-major is a `k × n` column-major matrix taken transposed, `x` a `k × m` one taken as is (the
    /// "TN" layout FP8 tensor cores need), scales per row of `op(W)` (output channel) and per column of `xᵀ`
    /// (token). With `beta` 1 the product is added to `out`, with 0 `out` is written fresh.
    fn matmul(
        &mut self,
        dev: &CudaDevice,
        dims: Dims,
        ops: Operands<'_>,
        out: &mut CudaViewMut<'_, half::bf16>,
        beta: f32,
    ) -> Result<()> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        dev.cuda_stream().context().bind_to_thread().w()?;
        let stream = dev.cuda_stream();
        let (w_ptr, _w) = ops.w.device_ptr(&stream);
        let (ws_ptr, _ws) = ops.w_scale.device_ptr(&stream);
        let (x_ptr, _x) = ops.x.device_ptr(&stream);
        let (xs_ptr, _xs) = ops.x_scale.device_ptr(&stream);
        let plan = match self.cache.plans.entry(dims) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(fp8_plan(self.handle, dims)?),
        };
        set_attr(
            plan.desc.raw,
            A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            &(ws_ptr as *const c_void),
        )?;
        set_attr(
            plan.desc.raw,
            A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            &(xs_ptr as *const c_void),
        )?;
        let (d_ptr, _d) = out.device_ptr_mut(&stream);
        // SAFETY: the descriptors describe the buffers exactly (W n·k codes, x m·k codes, D n·m bf16, one scale
        // per output channel and per token, both pointers set above), all on `stream`, whose context is bound; the
        // algorithm was chosen for these descriptors with this context's workspace.
        unsafe {
            plan.run(
                self.handle,
                &mut self.workspace,
                [w_ptr, x_ptr, d_ptr],
                beta,
                &stream,
            )
        }
    }
}

/// The plan of a `dims` FP8 product: the TN descriptor with outer-vector scale modes (a call sets the two scale
/// pointers), e4m3fn operands and a bf16 output, and the algorithm cuBLASLt's heuristic gives for them.
fn fp8_plan(handle: sys::cublasLtHandle_t, dims: Dims) -> Result<Plan> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let Dims { m, n, k } = dims;
    let desc = tn_desc()?;
    let outer = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i32;
    set_attr(desc.raw, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer)?;
    set_attr(desc.raw, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer)?;
    let e4m3 = sys::cudaDataType_t::CUDA_R_8F_E4M3;
    let layouts = Layouts {
        a: matrix(e4m3, k, n)?,
        b: matrix(e4m3, k, m)?,
        d: matrix(sys::cudaDataType_t::CUDA_R_16BF, n, m)?,
    };
    Plan::choose(handle, desc, layouts, WORKSPACE_BYTES, None)?.ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "this GPU or its cuBLASLt has no FP8 product with per-channel scales for [{m}, {k}] × [{k}, {n}]; \
             FP8 matrix products need FP8 tensor cores (Hopper or newer) and cuBLAS 12.9 or later — set \
             `fp8_matmul = false` under [model]"
        ))
    })
}
