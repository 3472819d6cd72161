//! What the cuBLASLt products share (`fp8_gemm`'s FP8 products, `gemm_bias`'s bias epilogue): one handle and
//! workspace per device with each user's plan cache, descriptors freed on drop, the "TN" product descriptor, and a
//! plan — descriptors and the heuristic's algorithm — that runs `D = op(A) · B + beta · D` in place.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use candle_core::cuda_backend::cudarc::cublas::sys::cublasOperation_t;
use candle_core::cuda_backend::cudarc::cublaslt::result as lt;
use candle_core::cuda_backend::cudarc::cublaslt::sys;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use candle_core::cuda_backend::{DeviceId, WrapErr};
use candle_core::{CudaDevice, Result};

/// One cuBLASLt handle and workspace per device, and what its user keeps per product shape (`cache`): the FP8
/// products' descriptors here, the bias-epilogue products' in `gemm_bias`.
pub(crate) struct LtContext<C> {
    pub(crate) handle: sys::cublasLtHandle_t,
    pub(crate) workspace: CudaSlice<u8>,
    pub(crate) cache: C,
}

// SAFETY: the handle and the descriptors cached with it are only used under the context's mutex, on the device
// whose context is bound first.
unsafe impl<C> Send for LtContext<C> {}

/// Every device's context of one user of cuBLASLt (each keeps its own static).
pub(crate) type LtContexts<C> = Mutex<HashMap<DeviceId, Arc<Mutex<LtContext<C>>>>>;

/// `dev`'s context in `all`, made on first use with a workspace of `workspace_bytes`.
pub(crate) fn lt_context<C: Default>(
    all: &'static OnceLock<LtContexts<C>>,
    dev: &CudaDevice,
    workspace_bytes: usize,
) -> Result<Arc<Mutex<LtContext<C>>>> {
    let mut all = all
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = all.get(&dev.id()) {
        return Ok(c.clone());
    }
    dev.cuda_stream().context().bind_to_thread().w()?;
    let handle = lt::create_handle().map_err(blas_error("cublasLtCreate"))?;
    // SAFETY: a scratch buffer cuBLASLt may overwrite; never read by us.
    let workspace = unsafe { dev.alloc::<u8>(workspace_bytes)? };
    let c = Arc::new(Mutex::new(LtContext {
        handle,
        workspace,
        cache: C::default(),
    }));
    all.insert(dev.id(), c.clone());
    Ok(c)
}

pub(crate) fn blas_error(what: &'static str) -> impl Fn(lt::CublasError) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("{what} failed: {e:?}"))
}

/// A cuBLASLt descriptor freed on drop.
pub(crate) struct Desc<T: Copy> {
    pub(crate) raw: T,
    pub(crate) destroy: unsafe fn(T) -> std::result::Result<(), lt::CublasError>,
}

impl<T: Copy> Drop for Desc<T> {
    fn drop(&mut self) {
        // SAFETY: created by cuBLASLt and destroyed once, here. A failure to free leaks a few bytes.
        let _ = unsafe { (self.destroy)(self.raw) };
    }
}

pub(crate) fn matrix(
    dtype: sys::cudaDataType,
    rows: usize,
    cols: usize,
) -> Result<Desc<sys::cublasLtMatrixLayout_t>> {
    let raw = lt::create_matrix_layout(dtype, rows as u64, cols as u64, rows as i64)
        .map_err(blas_error("cublasLtMatrixLayoutCreate"))?;
    Ok(Desc {
        raw,
        destroy: lt::destroy_matrix_layout,
    })
}

pub(crate) fn set_attr<V>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &V,
) -> Result<()> {
    // SAFETY: `desc` is live and `v` is the attribute's documented type and size.
    unsafe {
        lt::set_matmul_desc_attribute(desc, attr, (v as *const V).cast(), std::mem::size_of::<V>())
    }
    .map_err(blas_error("cublasLtMatmulDescSetAttribute"))
}

/// A product descriptor `D = op(A) · B` with `op(A)` transposed and `B` as is (the "TN" layout: a row-major `y =
/// x · Wᵀ` in cuBLASLt's column-major terms), f32 accumulation and scale; its users add their scale modes or
/// epilogue.
pub(crate) fn tn_desc() -> Result<Desc<sys::cublasLtMatmulDesc_t>> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let desc = Desc {
        raw: lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(blas_error("cublasLtMatmulDescCreate"))?,
        destroy: lt::destroy_matmul_desc,
    };
    set_attr(
        desc.raw,
        A::CUBLASLT_MATMUL_DESC_TRANSA,
        &(cublasOperation_t::CUBLAS_OP_T as i32),
    )?;
    set_attr(
        desc.raw,
        A::CUBLASLT_MATMUL_DESC_TRANSB,
        &(cublasOperation_t::CUBLAS_OP_N as i32),
    )?;
    Ok(desc)
}

/// A product's descriptors — the matmul's, A's, B's and D's (which stands for C: products run in place) — and the
/// algorithm cuBLASLt's heuristic chose for them.
pub(crate) struct Plan {
    pub(crate) desc: Desc<sys::cublasLtMatmulDesc_t>,
    a: Desc<sys::cublasLtMatrixLayout_t>,
    b: Desc<sys::cublasLtMatrixLayout_t>,
    d: Desc<sys::cublasLtMatrixLayout_t>,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// A plan's three operand layouts.
pub(crate) struct Layouts {
    pub a: Desc<sys::cublasLtMatrixLayout_t>,
    pub b: Desc<sys::cublasLtMatrixLayout_t>,
    pub d: Desc<sys::cublasLtMatrixLayout_t>,
}

impl Plan {
    /// The heuristic's first algorithm for `desc` and `layouts` within `workspace_bytes` and, when given, for
    /// operands aligned to at least `align` bytes (A, B, C and D); `None` when it has none.
    pub(crate) fn choose(
        handle: sys::cublasLtHandle_t,
        desc: Desc<sys::cublasLtMatmulDesc_t>,
        layouts: Layouts,
        workspace_bytes: usize,
        align: Option<[u32; 3]>,
    ) -> Result<Option<Self>> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = Desc {
            raw: lt::create_matmul_pref().map_err(blas_error("cublasLtMatmulPreferenceCreate"))?,
            destroy: lt::destroy_matmul_pref,
        };
        set_pref(
            &pref,
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &(workspace_bytes as u64),
        )?;
        if let Some([align_a, align_b, align_c]) = align {
            for (attr, value) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c),
            ] {
                set_pref(&pref, attr, &value)?;
            }
        }
        let Layouts { a, b, d } = layouts;
        // SAFETY: every descriptor is live; D's layout stands for C's (the product runs in place, or with beta 0
        // does not read C).
        let found = unsafe {
            lt::get_matmul_algo_heuristic(handle, desc.raw, a.raw, b.raw, d.raw, d.raw, pref.raw)
        };
        Ok(found.ok().map(|found| Self {
            desc,
            a,
            b,
            d,
            algo: found.algo,
        }))
    }

    /// `D = op(A) · B + beta · D` on `stream` for the operands at device addresses `[a, b, d]`, with `context`'s
    /// handle and workspace (the one the plan was chosen with).
    ///
    /// # Safety
    /// The addresses must hold buffers of the types, sizes and alignments the plan's descriptors say, on `stream`
    /// (whose context is bound), with every pointer the descriptor carries (scales, bias) set for this call.
    pub(crate) unsafe fn run(
        &self,
        handle: sys::cublasLtHandle_t,
        workspace: &mut CudaSlice<u8>,
        [a, b, d]: [u64; 3],
        beta: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let alpha = 1f32;
        let bytes = workspace.len();
        let (work, _work) = workspace.device_ptr_mut(stream);
        // SAFETY: the caller's contract; the workspace is the plan's size and `stream`'s.
        unsafe {
            lt::matmul(
                handle,
                self.desc.raw,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                a as *const c_void,
                self.a.raw,
                b as *const c_void,
                self.b.raw,
                d as *const c_void,
                self.d.raw,
                d as *mut c_void,
                self.d.raw,
                &self.algo,
                work as *mut c_void,
                bytes,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(blas_error("cublasLtMatmul"))
    }
}

/// Sets a preference attribute; `V` must be its documented type (the workspace a u64, the alignments u32).
fn set_pref<V>(
    pref: &Desc<sys::cublasLtMatmulPreference_t>,
    attr: sys::cublasLtMatmulPreferenceAttributes_t,
    v: &V,
) -> Result<()> {
    // SAFETY: `pref` is live and `v` is the attribute's documented type and size.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.raw,
            attr,
            (v as *const V).cast(),
            std::mem::size_of::<V>(),
        )
    }
    .map_err(blas_error("cublasLtMatmulPreferenceSetAttribute"))
}
