//! RMSNorm and LayerNorm over the last dimension on CUDA (`kernels/norm.cu`), forward and backward, as candle
//! custom ops. Same numerics as the portable compositions in [`crate::norm`] (statistics in f32; RMSNorm
//! rounds the normalised value to the activation dtype before the weight multiplies it), which are the CPU
//! reference and the fallback for tensors on other devices.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType, D};

use super::ptx::{self, long};
use crate::ops::Dense;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Rms,
    Layer,
}

/// `x * rsqrt(mean(x²) + eps) * weight` over the last dimension; differentiable (input and, when it is tracked,
/// weight). CUDA f32 / bf16 tensors run the fused kernels, anything else [`crate::norm::rms_norm_portable`].
pub fn rms_norm(xs: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    if !runs_on_kernel(xs) {
        return crate::norm::rms_norm_portable(xs, weight, eps);
    }
    apply(Kind::Rms, xs, weight, None, eps)
}

/// LayerNorm over the last dimension with optional affine parameters; differentiable (input, and weight / bias
/// when tracked). CUDA f32 / bf16 tensors run the fused kernels, anything else [`crate::norm::layer_norm_portable`].
pub fn layer_norm(
    xs: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    if !runs_on_kernel(xs) {
        return crate::norm::layer_norm_portable(xs, weight, bias, eps);
    }
    apply(Kind::Layer, xs, weight, bias, eps)
}

/// 1 when a row splits into 16-byte chunks and every buffer starts 16-byte aligned (the kernels' `vec`).
fn vec_flag<T: WithDType>(cols: usize, layouts: &[&Layout]) -> i32 {
    let size = T::DTYPE.size_in_bytes();
    let aligned = layouts.iter().all(|l| (l.start_offset() * size) % 16 == 0);
    i32::from((cols * size) % 16 == 0 && aligned)
}

fn runs_on_kernel(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16) && xs.rank() > 0
}

/// The custom ops always take three tensors; a missing weight or bias is a one-element placeholder that the
/// kernel never reads (it is passed as a null pointer).
fn param(p: Option<&Tensor>, xs: &Tensor) -> Result<Tensor> {
    let cols = xs.dim(D::Minus1)?;
    match p {
        Some(p) if p.elem_count() == cols => p.to_dtype(xs.dtype())?.flatten_all()?.dense(),
        Some(p) => candle_core::bail!(
            "norm parameter has {} values for {cols} features",
            p.elem_count()
        ),
        None => Tensor::zeros(1, xs.dtype(), xs.device()),
    }
}

fn apply(
    kind: Kind,
    xs: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let op = NormFwd {
        kind,
        eps: eps as f32,
        has_weight: weight.is_some(),
        has_bias: bias.is_some(),
    };
    xs.dense()?
        .apply_op3(&param(weight, xs)?, &param(bias, xs)?, op)
}

/// Input gradient of [`rms_norm`] for the output gradient `dy`, outside autograd (for hand-written backward
/// passes: candle's autograd adds a zero-fill and an add for every gradient it accumulates). CUDA only.
pub fn rms_norm_backward(
    xs: &Tensor,
    weight: Option<&Tensor>,
    dy: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    backward(Kind::Rms, xs, weight, dy, eps)
}

/// Input gradient of [`layer_norm`] (the bias does not enter it) for the output gradient `dy`, outside
/// autograd. CUDA only.
pub fn layer_norm_backward(
    xs: &Tensor,
    weight: Option<&Tensor>,
    dy: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    backward(Kind::Layer, xs, weight, dy, eps)
}

fn backward(
    kind: Kind,
    xs: &Tensor,
    weight: Option<&Tensor>,
    dy: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    if !runs_on_kernel(xs) || dy.dims() != xs.dims() {
        candle_core::bail!("norm backward needs f32 / bf16 CUDA tensors of one shape");
    }
    let op = NormBwd {
        kind,
        eps: eps as f32,
        has_weight: weight.is_some(),
    };
    let dy = dy.to_dtype(xs.dtype())?.dense()?;
    xs.dense()?.apply_op3_no_bwd(&param(weight, xs)?, &dy, &op)
}

struct NormFwd {
    kind: Kind,
    eps: f32,
    has_weight: bool,
    has_bias: bool,
}

struct NormBwd {
    kind: Kind,
    eps: f32,
    has_weight: bool,
}

impl NormFwd {
    fn launch<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        args: [(&CudaStorage, &Layout); 3],
    ) -> Result<CudaStorage> {
        let [(x, xl), (w, wl), (b, bl)] = args;
        let dev = x.device().clone();
        let cols = *xl.shape().dims().last().unwrap_or(&1);
        let rows = xl.shape().elem_count() / cols.max(1);
        let name = match self.kind {
            Kind::Rms => format!("fs_rms_fwd_{}", ptx::suffix(x.dtype())?),
            Kind::Layer => format!("fs_ln_fwd_{}", ptx::suffix(x.dtype())?),
        };
        let func = ptx::load(&dev, &ptx::NORM, &name)?;
        let (xv, wv, bv) = (
            ptx::view::<T>(x, xl)?,
            ptx::view::<T>(w, wl)?,
            ptx::view::<T>(b, bl)?,
        );
        let null = 0u64;
        // SAFETY: every row is written by its block before the tensor is read.
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        let (cols_l, eps) = (long(cols)?, self.eps);
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&xv);
        if self.has_weight {
            builder.arg(&wv)
        } else {
            builder.arg(&null)
        };
        if self.kind == Kind::Layer {
            if self.has_bias {
                builder.arg(&bv)
            } else {
                builder.arg(&null)
            };
        }
        let vec = vec_flag::<T>(cols, &[xl, wl, bl]);
        builder.arg(&out).arg(&cols_l).arg(&eps).arg(&vec);
        // SAFETY: argument order and types match kernels/norm.cu; x holds rows * cols values, w and b cols;
        // `vec` only when rows and buffers allow 16-byte accesses.
        unsafe { builder.launch(ptx::row_config(rows)?) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }
}

impl CustomOp3 for NormFwd {
    fn name(&self) -> &'static str {
        "framesmith-norm"
    }

    cuda_only_cpu_fwd!("crate::norm"; x, weight, bias);

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let args = [(x, xl), (w, wl), (b, bl)];
        let out = match x.dtype() {
            DType::F32 => self.launch::<f32>(args)?,
            DType::BF16 => self.launch::<half::bf16>(args)?,
            other => candle_core::bail!("framesmith-norm takes f32 or bf16, not {other:?}"),
        };
        Ok((out, xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dy = dy.dense()?;
        let bwd = NormBwd {
            kind: self.kind,
            eps: self.eps,
            has_weight: self.has_weight,
        };
        let dx = x.apply_op3_no_bwd(w, &dy, &bwd)?;
        let want_dw = self.has_weight && w.track_op();
        let want_db = self.has_bias && b.track_op();
        if !want_dw && !want_db {
            return Ok((Some(dx), None, None));
        }
        // Parameter gradients are rarely needed (norm weights are frozen in LoRA training): computed from the
        // normalised input with plain candle ops rather than a dedicated kernel.
        let cols = x.dim(D::Minus1)?;
        let rows = x.elem_count() / cols;
        let dy32 = dy.to_dtype(DType::F32)?.reshape((rows, cols))?;
        let dw = if want_dw {
            let plain = NormFwd {
                has_weight: false,
                has_bias: false,
                ..*self
            };
            let xhat = x
                .apply_op3_no_bwd(w, b, &plain)?
                .to_dtype(DType::F32)?
                .reshape((rows, cols))?;
            Some((&dy32 * xhat)?.sum(0)?.to_dtype(w.dtype())?)
        } else {
            None
        };
        let db = if want_db {
            Some(dy32.sum(0)?.to_dtype(b.dtype())?)
        } else {
            None
        };
        Ok((Some(dx), dw, db))
    }
}

impl Clone for NormFwd {
    fn clone(&self) -> Self {
        *self
    }
}

impl Copy for NormFwd {}

impl NormBwd {
    fn launch<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        args: [(&CudaStorage, &Layout); 3],
    ) -> Result<CudaStorage> {
        let [(x, xl), (w, wl), (dy, dyl)] = args;
        let dev = x.device().clone();
        let cols = *xl.shape().dims().last().unwrap_or(&1);
        let rows = xl.shape().elem_count() / cols.max(1);
        let name = match self.kind {
            Kind::Rms => format!("fs_rms_bwd_{}", ptx::suffix(x.dtype())?),
            Kind::Layer => format!("fs_ln_bwd_{}", ptx::suffix(x.dtype())?),
        };
        let func = ptx::load(&dev, &ptx::NORM, &name)?;
        let (xv, wv, dyv) = (
            ptx::view::<T>(x, xl)?,
            ptx::view::<T>(w, wl)?,
            ptx::view::<T>(dy, dyl)?,
        );
        let null = 0u64;
        // SAFETY: every row is written by its block before the tensor is read.
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        let (cols_l, eps) = (long(cols)?, self.eps);
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&xv);
        if self.has_weight {
            builder.arg(&wv)
        } else {
            builder.arg(&null)
        };
        let vec = vec_flag::<T>(cols, &[xl, wl, dyl]);
        builder.arg(&dyv).arg(&out).arg(&cols_l).arg(&eps).arg(&vec);
        // SAFETY: argument order and types match kernels/norm.cu; x and dy hold rows * cols values, w cols;
        // `vec` only when rows and buffers allow 16-byte accesses.
        unsafe { builder.launch(ptx::row_config(rows)?) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }
}

impl CustomOp3 for NormBwd {
    fn name(&self) -> &'static str {
        "framesmith-norm-bwd"
    }

    cuda_only_cpu_fwd!("crate::norm"; x, weight, bias);

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let args = [(x, xl), (w, wl), (dy, dyl)];
        let out = match x.dtype() {
            DType::F32 => self.launch::<f32>(args)?,
            DType::BF16 => self.launch::<half::bf16>(args)?,
            other => candle_core::bail!("framesmith-norm-bwd takes f32 or bf16, not {other:?}"),
        };
        Ok((out, xl.shape().clone()))
    }
}
