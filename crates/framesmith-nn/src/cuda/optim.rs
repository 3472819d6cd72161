//! The CUDA passes of [`crate::optim::adamw_update`] (`kernels/optim.cu`): each updates one tensor in place.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, WithDType};

use super::ptx::{self, long};
use crate::optim::Scalars;

fn offsets(layout: &Layout) -> Result<(usize, usize)> {
    layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("adamw_update: a non-contiguous tensor".into()))
}

fn function(dev: &CudaDevice, pass: &str, dtype: DType) -> Result<CudaFunction> {
    ptx::load(
        dev,
        &ptx::OPTIM,
        &format!("fs_adamw_{pass}_{}", ptx::suffix(dtype)?),
    )
}

/// A moment pass: `dst` (f32) from the gradient `g` (`G`), with the pass's f32 scalars after `n`.
fn moment_pass<G: CudaDType + DeviceRepr + WithDType>(
    pass: &str,
    dst: &mut CudaStorage,
    dl: &Layout,
    g: &CudaStorage,
    gl: &Layout,
    scalars: &[f32],
) -> Result<()> {
    let dev = dst.device().clone();
    let func = function(&dev, pass, G::DTYPE)?;
    let n = dl.shape().elem_count();
    let n_arg = long(n)?;
    let (start, end) = offsets(dl)?;
    let gv = ptx::view::<G>(g, gl)?;
    let mut dv = dst.as_cuda_slice_mut::<f32>()?.slice_mut(start..end);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&mut dv).arg(&gv).arg(&n_arg);
    for s in scalars {
        b.arg(s);
    }
    // SAFETY: the arguments follow fs_adamw_{exp_avg,exp_avg_sq}_*'s signatures (the scalars in order); both
    // buffers hold n elements.
    unsafe { b.launch(ptx::elementwise_config(n)) }.w()?;
    Ok(())
}

fn by_grad_dtype(
    pass: &str,
    dst: &mut CudaStorage,
    dl: &Layout,
    g: &CudaStorage,
    gl: &Layout,
    scalars: &[f32],
) -> Result<()> {
    match g.dtype() {
        DType::F32 => moment_pass::<f32>(pass, dst, dl, g, gl, scalars),
        DType::BF16 => moment_pass::<half::bf16>(pass, dst, dl, g, gl, scalars),
        other => candle_core::bail!("adamw_update: a {other:?} gradient"),
    }
}

/// `m += (g − m) · (1 − beta1)` on `m`'s device.
pub(crate) fn exp_avg(
    m: &mut CudaStorage,
    ml: &Layout,
    g: &CudaStorage,
    gl: &Layout,
    s: &Scalars,
) -> Result<()> {
    by_grad_dtype("exp_avg", m, ml, g, gl, &[s.grad_scale, s.one_minus_beta1])
}

/// `v = v · beta2 + g² · (1 − beta2)` on `v`'s device.
pub(crate) fn exp_avg_sq(
    v: &mut CudaStorage,
    vl: &Layout,
    g: &CudaStorage,
    gl: &Layout,
    s: &Scalars,
) -> Result<()> {
    by_grad_dtype(
        "exp_avg_sq",
        v,
        vl,
        g,
        gl,
        &[s.grad_scale, s.beta2, s.one_minus_beta2],
    )
}

// A kernel launch: p, m and v each come as candle hands them to a custom op, a (storage, layout) pair.
#[allow(clippy::too_many_arguments)]
fn param_pass<P: CudaDType + DeviceRepr + WithDType>(
    p: &mut CudaStorage,
    pl: &Layout,
    m: &CudaStorage,
    ml: &Layout,
    v: &CudaStorage,
    vl: &Layout,
    s: &Scalars,
) -> Result<()> {
    let dev = p.device().clone();
    let func = function(&dev, "param", P::DTYPE)?;
    let n = pl.shape().elem_count();
    let n_arg = long(n)?;
    let (start, end) = offsets(pl)?;
    let (mv, vv) = (ptx::view::<f32>(m, ml)?, ptx::view::<f32>(v, vl)?);
    let mut pv = p.as_cuda_slice_mut::<P>()?.slice_mut(start..end);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&mut pv).arg(&mv).arg(&vv).arg(&n_arg);
    b.arg(&s.decay)
        .arg(&s.inv_bc2_sqrt)
        .arg(&s.eps)
        .arg(&s.step_size);
    // SAFETY: the arguments follow fs_adamw_param_*'s signature; all three buffers hold n elements.
    unsafe { b.launch(ptx::elementwise_config(n)) }.w()?;
    Ok(())
}

/// `p = p · decay − (m / (√v / √bc2 + eps)) · step_size` on `p`'s device.
// p, m and v each come as candle hands them to a custom op, a (storage, layout) pair, as the kernel takes them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn param(
    p: &mut CudaStorage,
    pl: &Layout,
    m: &CudaStorage,
    ml: &Layout,
    v: &CudaStorage,
    vl: &Layout,
    s: &Scalars,
) -> Result<()> {
    match p.dtype() {
        DType::F32 => param_pass::<f32>(p, pl, m, ml, v, vl, s),
        DType::BF16 => param_pass::<half::bf16>(p, pl, m, ml, v, vl, s),
        other => candle_core::bail!("adamw_update: a {other:?} parameter"),
    }
}
