//! `c += a · bᵀ + bias` in place ([`add_matmul_bias_`]) or `a · bᵀ + bias` ([`matmul_bias`]) through cuBLASLt's
//! bias epilogue: a linear's base product accumulated onto an update its caller wrote first (LoKr's Kronecker
//! product), or on a merged weight, the bias added by the product rather than by a pass of its own over the
//! `[m, n]` output (a read and a write of it). The sum is rounded once. Both say when cuBLASLt has no algorithm
//! for a shape, and the caller then adds the bias apart.

use std::cell::Cell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{OnceLock, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublaslt::sys;
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Result, Tensor};

use super::lt::{lt_context, matrix, set_attr, tn_desc, Desc, Layouts, LtContexts, Plan};
use super::ptx;

/// cuBLASLt workspace of these products (large bf16 products need no split-K reduction space).
const WORKSPACE_BYTES: usize = 8 << 20;

/// Whether [`matmul_bias`] may run for these tensors: CUDA, all bf16 or all f16, `a` `[m, k]`, `b` `[n, k]`,
/// `bias` `[n]`, contiguous.
pub fn product_supported(a: &Tensor, b: &Tensor, bias: &Tensor) -> bool {
    let dtype_ok = matches!(a.dtype(), DType::BF16 | DType::F16)
        && [b, bias].iter().all(|t| t.dtype() == a.dtype());
    let dims_ok = match (a.dims2(), b.dims2()) {
        (Ok((_, k)), Ok((n, bk))) => bk == k && bias.dims() == [n],
        _ => false,
    };
    a.device().is_cuda() && dtype_ok && dims_ok && [a, b, bias].iter().all(|t| t.is_contiguous())
}

/// Whether [`add_matmul_bias_`] may run for these tensors: [`product_supported`] and `c` `[m, n]` contiguous in
/// their dtype.
pub fn supported(c: &Tensor, a: &Tensor, b: &Tensor, bias: &Tensor) -> bool {
    let fits = match (c.dims2(), a.dims2(), b.dims2()) {
        (Ok((m, n)), Ok((am, _)), Ok((bn, _))) => am == m && bn == n,
        _ => false,
    };
    fits && c.dtype() == a.dtype()
        && c.is_contiguous()
        && c.device().is_cuda()
        && product_supported(a, b, bias)
}

/// `c += a · bᵀ + bias` in place (see [`supported`]); `Ok(false)`, `c` untouched, when cuBLASLt has no algorithm
/// for the shape and the operands' alignment. `c` must not share storage with another live tensor that expects its
/// old values (callers pass results they just computed), nor with `bias`.
pub fn add_matmul_bias_(c: &Tensor, a: &Tensor, b: &Tensor, bias: &Tensor) -> Result<bool> {
    if !supported(c, a, b, bias) {
        candle_core::bail!(
            "add_matmul_bias_: needs contiguous CUDA tensors in bf16 or f16, c [m, n] a [m, k] b [n, k] bias [n], \
             got {:?} {:?} {:?} {:?} ({:?})",
            c.dims(),
            a.dims(),
            b.dims(),
            bias.dims(),
            c.dtype()
        );
    }
    product(c, a, b, bias, 1.0)
}

/// `a · bᵀ + bias` [m, n] (`a` [m, k], `b` [n, k], `bias` [n], contiguous CUDA tensors in bf16 or f16), the bias
/// added by the product; `None` when cuBLASLt has no algorithm for the shape and the operands' alignment.
pub fn matmul_bias(a: &Tensor, b: &Tensor, bias: &Tensor) -> Result<Option<Tensor>> {
    if !product_supported(a, b, bias) {
        candle_core::bail!(
            "matmul_bias: needs contiguous CUDA tensors in bf16 or f16, a [m, k] b [n, k] bias [n], got {:?} {:?} \
             {:?} ({:?})",
            a.dims(),
            b.dims(),
            bias.dims(),
            a.dtype()
        );
    }
    let (m, n) = (a.dim(0)?, b.dim(0)?);
    let candle_core::Device::Cuda(dev) = a.device() else {
        candle_core::bail!("matmul_bias: a tensor that is not on CUDA");
    };
    // SAFETY (both arms): the product writes all m · n values (beta = 0: C is not read) before anything reads
    // them; when it does not run, the buffer is dropped unread.
    let out = match a.dtype() {
        DType::BF16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(m * n)? }, dev.clone())
        }
        DType::F16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(m * n)? }, dev.clone())
        }
        other => candle_core::bail!("matmul_bias: {other:?} is not supported"),
    };
    let out = ptx::untracked(out, (m, n));
    Ok(product(&out, a, b, bias, 0.0)?.then_some(out))
}

/// `c = a · bᵀ + beta · c + bias` in place, whether it ran.
fn product(c: &Tensor, a: &Tensor, b: &Tensor, bias: &Tensor, beta: f32) -> Result<bool> {
    let op = AddMatmulBias {
        bias: bias.clone(),
        beta,
        ran: Cell::new(false),
    };
    c.inplace_op3(a, b, &op)?;
    Ok(op.ran.get())
}

struct AddMatmulBias {
    bias: Tensor,
    /// 1: accumulate onto `c`; 0: `c` is written fresh (not read).
    beta: f32,
    /// Set when the product ran (cuBLASLt had an algorithm).
    ran: Cell<bool>,
}

/// What picks a plan: the product's sizes, the dtype and each operand's alignment (the heuristic's algorithms may
/// assume it).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    m: usize,
    n: usize,
    k: usize,
    bf16: bool,
    /// Bytes of alignment of `b` (cuBLASLt's A), `a` (B), `c` (C and D) and the bias, each at most 256.
    align: [u32; 4],
}

/// The TN product's descriptor ([`tn_desc`]) with the bias epilogue (a `dtype` vector at
/// `bias_ptr`, set again by each call).
fn matmul_desc(
    dtype: sys::cudaDataType_t,
    bias_ptr: u64,
) -> Result<Desc<sys::cublasLtMatmulDesc_t>> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let desc = tn_desc()?;
    set_attr(
        desc.raw,
        A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
        &(dtype as i32),
    )?;
    set_attr(
        desc.raw,
        A::CUBLASLT_MATMUL_DESC_EPILOGUE,
        &(sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32),
    )?;
    set_attr(
        desc.raw,
        A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        &(bias_ptr as *const c_void),
    )?;
    Ok(desc)
}

/// The alignment in bytes of a device address, at most 256.
fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        1u32 << ptr.trailing_zeros().min(8)
    }
}

/// The plan of a bias-epilogue product: the row-major `c [m, n] += a [m, k] · bᵀ + bias` as cuBLASLt's
/// column-major `cᵀ [n, m] += op(B) · aᵀ + bias`: `b` stored `[n, k]` row-major is a `k × n` column-major matrix
/// taken transposed, `a` a `k × m` one taken as is, the bias one value per row of `cᵀ` (output feature), broadcast
/// over its columns (rows of `c`). `None` when the heuristic has no algorithm.
fn bias_plan(handle: sys::cublasLtHandle_t, key: Key, bias_ptr: u64) -> Result<Option<Plan>> {
    let Key {
        m,
        n,
        k,
        bf16,
        align,
    } = key;
    let dtype = if bf16 {
        sys::cudaDataType_t::CUDA_R_16BF
    } else {
        sys::cudaDataType_t::CUDA_R_16F
    };
    let layouts = Layouts {
        a: matrix(dtype, k, n)?,
        b: matrix(dtype, k, m)?,
        d: matrix(dtype, n, m)?,
    };
    let [align_a, align_b, align_c, _] = align;
    Plan::choose(
        handle,
        matmul_desc(dtype, bias_ptr)?,
        layouts,
        WORKSPACE_BYTES,
        Some([align_a, align_b, align_c]),
    )
}

impl AddMatmulBias {
    // A cuBLASLt call: each of the three matrices comes as candle hands it to a custom op, a (storage, layout)
    // pair; the bias is read from the tensor the op holds.
    #[allow(clippy::too_many_arguments)]
    fn run<T: CudaDType>(
        &self,
        bf16: bool,
        c: &mut CudaStorage,
        cl: &Layout,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<()> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let (m, n) = cl.shape().dims2()?;
        let k = al.shape().dims2()?.1;
        let dev = c.device().clone();
        dev.cuda_stream().context().bind_to_thread().w()?;
        let stream = dev.cuda_stream();
        let (bias_storage, bias_layout) = self.bias.storage_and_layout();
        let bias = ptx::view::<T>(
            ptx::cuda_storage(&bias_storage, "add_matmul_bias_")?,
            bias_layout,
        )?;
        let a = ptx::view::<T>(a, al)?;
        let b = ptx::view::<T>(b, bl)?;
        let Some((cs, ce)) = cl.contiguous_offsets() else {
            candle_core::bail!("add_matmul_bias_: non-contiguous output");
        };
        let mut c = c.as_cuda_slice_mut::<T>()?.slice_mut(cs..ce);
        let (bias_ptr, _bias_guard) = bias.device_ptr(&stream);
        let (a_ptr, _a_guard) = a.device_ptr(&stream);
        let (b_ptr, _b_guard) = b.device_ptr(&stream);
        let (c_ptr, _c_guard) = c.device_ptr_mut(&stream);
        if alignment(bias_ptr) < 16 {
            // No preference says how the bias is aligned: a bias whose loads may not be vectorised is added apart.
            return Ok(());
        }
        let key = Key {
            m,
            n,
            k,
            bf16,
            align: [b_ptr, a_ptr, c_ptr, bias_ptr].map(alignment),
        };
        static CONTEXTS: OnceLock<LtContexts<HashMap<Key, Option<Plan>>>> = OnceLock::new();
        let context = lt_context(&CONTEXTS, &dev, WORKSPACE_BYTES)?;
        let mut guard = context.lock().unwrap_or_else(PoisonError::into_inner);
        let context = &mut *guard;
        let handle = context.handle;
        let plan = match context.cache.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(bias_plan(handle, key, bias_ptr)?),
        };
        let Some(plan) = plan.as_ref() else {
            return Ok(());
        };
        set_attr(
            plan.desc.raw,
            A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            &(bias_ptr as *const c_void),
        )?;
        // SAFETY: the descriptors describe the buffers exactly (b n·k, a m·k, c m·n values and n bias values, all
        // contiguous, of the dtype the plan was made for, with the alignments it was chosen for, the bias pointer
        // set above), all on `stream`, whose context is bound; C and D are the same buffer and layout (in place);
        // the algorithm was chosen for these descriptors with this context's workspace.
        unsafe {
            plan.run(
                handle,
                &mut context.workspace,
                [b_ptr, a_ptr, c_ptr],
                self.beta,
                &stream,
            )
        }?;
        self.ran.set(true);
        Ok(())
    }
}

impl InplaceOp3 for AddMatmulBias {
    fn name(&self) -> &'static str {
        "framesmith-add-matmul-bias"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        Err(super::cuda_only(self.name(), "nn::linear::add_matmul_bias"))
    }

    fn cuda_fwd(
        &self,
        c: &mut CudaStorage,
        cl: &Layout,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<()> {
        match c.dtype() {
            DType::BF16 => self.run::<half::bf16>(true, c, cl, a, al, b, bl),
            DType::F16 => self.run::<half::f16>(false, c, cl, a, al, b, bl),
            other => candle_core::bail!("add_matmul_bias_: {other:?} is not supported"),
        }
    }
}
