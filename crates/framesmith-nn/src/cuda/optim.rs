//! The CUDA passes of [`crate::optim::adamw_update`] (`kernels/optim.cu`), each updating one tensor in place, and
//! the multi-tensor kernels of [`crate::optim::adamw_update_all`] and [`crate::optim::sums_of_squares`], one launch
//! for all of an optimizer's tensors (read through a table of device pointers copied to the device per call).

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    CudaDevice, CudaStorage, DType, Device, Layout, Result, Storage, Tensor, WithDType,
};

use super::ptx::{self, long};
use crate::optim::{AdamWTensors, Scalars};

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

/// Words per tensor in the table the multi-tensor kernels read, and their places (`TABLE_WORDS`, `T_*` in
/// `kernels/optim.cu`).
const TABLE_WORDS: usize = 7;
const T_GRAD: usize = 1;
const T_N: usize = 4;
const T_FLAGS: usize = 6;
/// Elements one block of `fs_adamw_multi` updates (`ADAMW_CHUNK`).
const ADAMW_CHUNK: usize = 4096;
const FLAG_PARAM_BF16: u64 = 1;
const FLAG_GRAD_BF16: u64 = 2;

/// The CUDA device every tensor lives on, when they share one and candle's stream is not synchronised through
/// events (cudarc's multi-stream mode, which a table of raw pointers would bypass): the multi-tensor kernels' case.
fn one_device<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Option<CudaDevice> {
    let mut dev: Option<CudaDevice> = None;
    for t in tensors {
        let Device::Cuda(d) = t.device() else {
            return None;
        };
        match &dev {
            Some(first) if !first.same_device(d) => return None,
            Some(_) => {}
            None => dev = Some(d.clone()),
        }
    }
    let dev = dev?;
    (!dev
        .cuda_stream()
        .context()
        .is_managing_stream_synchronization())
    .then_some(dev)
}

/// The device address of a contiguous f32 or bf16 tensor's first element. Valid while its storage lives; written
/// through only by kernels queued on the one stream, which orders them with every other use of the buffer.
fn address(storage: &Storage, layout: &Layout, stream: &CudaStream) -> Result<u64> {
    fn typed<T: CudaDType>(s: &CudaStorage, layout: &Layout, stream: &CudaStream) -> Result<u64> {
        let view = ptx::view::<T>(s, layout)?;
        let (ptr, _sync) = view.device_ptr(stream);
        Ok(ptr)
    }
    let s = ptx::cuda_storage(storage, "a multi-tensor optimizer kernel")?;
    match s.dtype() {
        DType::F32 => typed::<f32>(s, layout, stream),
        DType::BF16 => typed::<half::bf16>(s, layout, stream),
        other => {
            candle_core::bail!("the multi-tensor optimizer kernels take f32 or bf16, not {other:?}")
        }
    }
}

fn bf16_flag(t: &Tensor, flag: u64) -> u64 {
    if t.dtype() == DType::BF16 {
        flag
    } else {
        0
    }
}

fn grid(blocks: usize, threads: u32) -> Result<LaunchConfig> {
    let blocks = u32::try_from(blocks)
        .map_err(|_| candle_core::Error::Msg(format!("too many blocks ({blocks})")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// [`crate::optim::adamw_update_all`] in one launch, when every tensor is on one CUDA device (checked, shapes and
/// dtypes, by the caller): `false`, with nothing done, otherwise.
pub(crate) fn adamw_multi(items: &[AdamWTensors<'_>], s: &Scalars) -> Result<bool> {
    let all = items
        .iter()
        .flat_map(|i| [i.param, i.grad, i.exp_avg, i.exp_avg_sq]);
    let Some(dev) = one_device(all) else {
        return Ok(false);
    };
    if items.is_empty() {
        return Ok(true);
    }
    let grads = items
        .iter()
        .map(|i| i.grad.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let stream = dev.cuda_stream();
    let mut table = Vec::with_capacity(items.len() * TABLE_WORDS);
    let mut blocks = 0usize;
    // The storages stay read-locked until the kernel is queued. In table order: param, grad, exp_avg, exp_avg_sq,
    // then n, the first block and the flags.
    let mut guards = Vec::with_capacity(4 * items.len());
    for (item, grad) in items.iter().zip(&grads) {
        let tensors = [item.param, grad, item.exp_avg, item.exp_avg_sq];
        for t in tensors {
            let (storage, layout) = t.storage_and_layout();
            table.push(address(&storage, layout, &stream)?);
            guards.push(storage);
        }
        let n = item.param.elem_count();
        table.extend([
            n as u64,
            blocks as u64,
            bf16_flag(item.param, FLAG_PARAM_BF16) | bf16_flag(grad, FLAG_GRAD_BF16),
        ]);
        blocks += n.div_ceil(ADAMW_CHUNK);
    }
    if blocks == 0 {
        return Ok(true);
    }
    let count = i32::try_from(items.len())
        .map_err(|_| candle_core::Error::Msg("adamw_update_all: too many tensors".into()))?;
    let table = dev.clone_htod(&table)?;
    let func = ptx::load(&dev, &ptx::OPTIM, "fs_adamw_multi")?;
    let mut b = stream.launch_builder(&func);
    b.arg(&table).arg(&count);
    for x in [
        &s.grad_scale,
        &s.one_minus_beta1,
        &s.beta2,
        &s.one_minus_beta2,
        &s.decay,
        &s.inv_bc2_sqrt,
        &s.eps,
        &s.step_size,
    ] {
        b.arg(x);
    }
    // SAFETY: the arguments follow fs_adamw_multi's signature; the table holds `count` entries of TABLE_WORDS
    // words, each naming buffers of n elements of the flagged dtypes that stay allocated (their tensors are
    // borrowed, the contiguous gradients held) until the kernel is queued and are freed stream-ordered after it;
    // the blocks are the sum of the entries' chunks.
    unsafe { b.launch(grid(blocks, ptx::THREADS)?) }.w()?;
    drop(guards);
    Ok(true)
}

/// [`crate::optim::sums_of_squares`] in one launch and one read, when every tensor is an f32 or bf16 tensor on one
/// CUDA device: `None` otherwise.
pub(crate) fn sums_of_squares(tensors: &[Tensor]) -> Result<Option<Vec<f32>>> {
    if tensors
        .iter()
        .any(|t| !matches!(t.dtype(), DType::F32 | DType::BF16))
    {
        return Ok(None);
    }
    let Some(dev) = one_device(tensors) else {
        return Ok(None);
    };
    if tensors.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let tensors = tensors
        .iter()
        .map(Tensor::contiguous)
        .collect::<Result<Vec<_>>>()?;
    let stream = dev.cuda_stream();
    let mut table = vec![0u64; tensors.len() * TABLE_WORDS];
    let mut guards = Vec::with_capacity(tensors.len());
    for (t, entry) in tensors.iter().zip(table.chunks_exact_mut(TABLE_WORDS)) {
        let (storage, layout) = t.storage_and_layout();
        entry[T_GRAD] = address(&storage, layout, &stream)?;
        entry[T_N] = t.elem_count() as u64;
        entry[T_FLAGS] = bf16_flag(t, FLAG_GRAD_BF16);
        guards.push(storage);
    }
    let table = dev.clone_htod(&table)?;
    let mut sums = dev.alloc_zeros::<f32>(tensors.len())?;
    let func = ptx::load(&dev, &ptx::OPTIM, "fs_sum_squares_multi")?;
    let mut b = stream.launch_builder(&func);
    b.arg(&table).arg(&mut sums);
    // SAFETY: the arguments follow fs_sum_squares_multi's signature; one block per table entry, each reading its
    // gradient's n elements (kept allocated by `tensors` until the kernel is queued, freed stream-ordered after it)
    // and writing its own slot of `sums`.
    unsafe { b.launch(grid(tensors.len(), 1024)?) }.w()?;
    drop(guards);
    Ok(Some(dev.clone_dtoh(&sums)?))
}
