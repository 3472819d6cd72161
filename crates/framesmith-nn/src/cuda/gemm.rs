//! `c += a · op(b)` in place through cuBLAS (`beta = 1`): the LoRA update and the bias added to a linear's output,
//! and gradients summed over several linears, without a separate full-size add. On the H200 the add it replaces
//! (candle's broadcast add over a `[32760, 1536]` bf16 output) took 213 µs against 30 µs for the rank-32 product
//! itself, and rounding once (f32 accumulate of `c + a·b`) is also closer than rounding the product first.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Result, Tensor};

/// Whether [`add_matmul_`] runs for these tensors: CUDA, one float dtype cuBLAS takes, 2-D and contiguous.
pub fn supported(c: &Tensor, a: &Tensor, b: &Tensor) -> bool {
    let dtype_ok = matches!(c.dtype(), DType::BF16 | DType::F16 | DType::F32)
        && a.dtype() == c.dtype()
        && b.dtype() == c.dtype();
    c.device().is_cuda() && dtype_ok && [c, a, b].iter().all(|t| t.rank() == 2 && t.is_contiguous())
}

/// `c += a · bᵀ` (`b` `[n, k]`, when `b_transposed`) or `c += a · b` (`b` `[k, n]`) in place, `a` `[m, k]`,
/// `c` `[m, n]`; see [`supported`]. `c` must not share storage with another live tensor that expects its old
/// values (callers pass results they just computed).
pub fn add_matmul_(c: &Tensor, a: &Tensor, b: &Tensor, b_transposed: bool) -> Result<()> {
    if !supported(c, a, b) {
        candle_core::bail!(
            "add_matmul_: needs contiguous 2-D CUDA tensors of one float dtype, got {:?} {:?} {:?} ({:?})",
            c.dims(),
            a.dims(),
            b.dims(),
            c.dtype()
        );
    }
    let (m, n) = c.dims2()?;
    let (am, k) = a.dims2()?;
    let (bn, bk) = if b_transposed {
        b.dims2()?
    } else {
        let (bk, bn) = b.dims2()?;
        (bn, bk)
    };
    if am != m || bn != n || bk != k {
        candle_core::bail!(
            "add_matmul_: c {:?} += a {:?} · b{} {:?} do not fit",
            c.dims(),
            a.dims(),
            if b_transposed { "ᵀ" } else { "" },
            b.dims()
        );
    }
    c.inplace_op3(
        a,
        b,
        &AddMatmul {
            m,
            n,
            k,
            b_transposed,
        },
    )
}

struct AddMatmul {
    m: usize,
    n: usize,
    k: usize,
    b_transposed: bool,
}

fn int(x: usize) -> Result<i32> {
    i32::try_from(x)
        .map_err(|_| candle_core::Error::Msg(format!("add_matmul_: {x} exceeds cuBLAS's int")))
}

impl AddMatmul {
    /// The row-major product as cuBLAS's column-major one: `cᵀ [n, m] += op(b)ᵀ · aᵀ`.
    fn config<T: Copy>(&self, one: T) -> Result<GemmConfig<T>> {
        let (m, n, k) = (int(self.m)?, int(self.n)?, int(self.k)?);
        let (transa, lda) = if self.b_transposed {
            (cublasOperation_t::CUBLAS_OP_T, k)
        } else {
            (cublasOperation_t::CUBLAS_OP_N, n)
        };
        Ok(GemmConfig {
            transa,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: one,
            lda,
            ldb: k,
            beta: one,
            ldc: n,
        })
    }

    // A cuBLAS call: each of the three matrices comes as candle hands it to a custom op, a (storage, layout) pair.
    #[allow(clippy::too_many_arguments)]
    fn run<T: CudaDType + Copy>(
        &self,
        c: &mut CudaStorage,
        cl: &Layout,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
        one: T,
    ) -> Result<()>
    where
        candle_core::cuda_backend::cudarc::cublas::CudaBlas: Gemm<T>,
    {
        let range = |l: &Layout| {
            l.contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg("add_matmul_: non-contiguous input".into()))
        };
        let ((cs, ce), (as_, ae), (bs, be)) = (range(cl)?, range(al)?, range(bl)?);
        // A cuBLAS handle runs in the context current on this thread, which must be its device's: a process
        // driving several GPUs (a Wan2.2 A14B expert on each) may have left another one current, and this op
        // allocates nothing that would have bound it.
        c.device().cuda_stream().context().bind_to_thread().w()?;
        let blas = c.device().cublas_handle();
        let cfg = self.config(one)?;
        let a = a.as_cuda_slice::<T>()?.slice(as_..ae);
        let b = b.as_cuda_slice::<T>()?.slice(bs..be);
        let mut c = c.as_cuda_slice_mut::<T>()?.slice_mut(cs..ce);
        // SAFETY: shapes were checked against the layouts in `add_matmul_`; the config reads b [n, k] or [k, n],
        // a [m, k] and writes c [m, n], all contiguous row-major views of the right lengths, on candle's stream.
        unsafe { blas.gemm(cfg, &b, &a, &mut c) }.w()?;
        Ok(())
    }
}

impl InplaceOp3 for AddMatmul {
    fn name(&self) -> &'static str {
        "framesmith-add-matmul"
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
        Err(super::cuda_only(self.name(), "nn::linear::add_matmul"))
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
            DType::BF16 => self.run(c, cl, a, al, b, bl, half::bf16::ONE),
            DType::F16 => self.run(c, cl, a, al, b, bl, half::f16::ONE),
            DType::F32 => self.run(c, cl, a, al, b, bl, 1f32),
            other => candle_core::bail!("add_matmul_: {other:?} is not supported"),
        }
    }
}
