//! RMSNorm fused with the 3D RoPE that follows it (Wan's `q` and `k`; `fs_rms_rope_*` in `kernels/norm.cu`),
//! outside autograd: the forward writes the rotated heads from the projection's output in one pass, the backward
//! takes the rotated heads' gradient and returns the projection output's, rotating it back on the way (each
//! saves writing and reading back one full-size intermediate). Same arithmetic and roundings as
//! [`super::norm::rms_norm`] followed by [`super::rope::rope_apply`], and as their backwards.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result, Tensor, WithDType};

use super::ptx::{self, cuda_storage, long, untracked};
use crate::ops::Dense;

/// Whether the fused kernels take `xs`: an f32 / bf16 CUDA tensor.
pub fn applies(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16)
}

/// The geometry both directions check: `x` [b, l, heads · d], tables of `b · l · d/2` values, the weight `cols`.
fn geometry(
    xs: &Tensor,
    weight: &Tensor,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(usize, usize, usize, usize)> {
    let (b, l, cols) = xs.dims3()?;
    if heads == 0 || cols % heads != 0 || (cols / heads) % 2 != 0 {
        candle_core::bail!(
            "RMSNorm + RoPE: {cols} features do not split into {heads} heads of even width"
        );
    }
    let half = cols / heads / 2;
    if cos.elem_count() != b * l * half || sin.elem_count() != cos.elem_count() {
        candle_core::bail!(
            "RMSNorm + RoPE: tables of {} / {} values for x {:?} in {heads} heads",
            cos.elem_count(),
            sin.elem_count(),
            xs.dims()
        );
    }
    if weight.elem_count() != cols {
        candle_core::bail!(
            "RMSNorm weight has {} values for {cols} features",
            weight.elem_count()
        );
    }
    Ok((b * l, cols, half, cols / heads))
}

/// `rope(rms_norm(x, weight))`: `x` [b, l, heads · d] → [b, l, heads, d], `cos` / `sin` `b · l · d/2` angles
/// (e.g. [b, l, 1, d/2]). CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn rms_norm_rope(
    xs: &Tensor,
    weight: &Tensor,
    eps: f64,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let (rows, cols, half, d) = geometry(xs, weight, heads, cos, sin)?;
    let (b, l, _) = xs.dims3()?;
    let y = launch("fwd", xs, weight, None, cos, sin, eps, [rows, cols, half])?;
    y.reshape((b, l, heads, d))
}

/// Input gradient of [`rms_norm_rope`] for the rotated heads' gradient `dy` [b, l, heads, d]: `x`'s gradient
/// [b, l, heads · d]. CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn rms_norm_rope_backward(
    xs: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let (b, l, h, d) = dy.dims4()?;
    if [b, l, h * d] != xs.dims() {
        candle_core::bail!(
            "RMSNorm + RoPE backward: dy {:?} for x {:?}",
            dy.dims(),
            xs.dims()
        );
    }
    let (rows, cols, half, _) = geometry(xs, weight, h, cos, sin)?;
    let dy = dy.to_dtype(xs.dtype())?.dense()?;
    launch(
        "bwd",
        xs,
        weight,
        Some(&dy),
        cos,
        sin,
        eps,
        [rows, cols, half],
    )
}

// A kernel launch: one argument per kernel input, as the forward and the backward each pass them.
#[allow(clippy::too_many_arguments)]
fn launch(
    direction: &str,
    xs: &Tensor,
    weight: &Tensor,
    dy: Option<&Tensor>,
    cos: &Tensor,
    sin: &Tensor,
    eps: f64,
    [rows, cols, half]: [usize; 3],
) -> Result<Tensor> {
    let dtype = xs.dtype();
    let x = xs.dense()?;
    let w = weight.to_dtype(dtype)?.flatten_all()?.dense()?;
    let table = |t: &Tensor| t.detach().to_dtype(DType::F32)?.flatten_all()?.dense();
    let (c, s) = (table(cos)?, table(sin)?);
    // Without a gradient (the forward) the slot holds the input, which the kernel does not read.
    let dy = dy.cloned().unwrap_or_else(|| x.clone());
    let guards = [
        x.storage_and_layout(),
        w.storage_and_layout(),
        dy.storage_and_layout(),
        c.storage_and_layout(),
        s.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(st, _)| cuda_storage(st, "RMSNorm + RoPE"))
        .collect::<Result<Vec<_>>>()?;
    let dev = stores[0].device().clone();
    let func = ptx::load(
        &dev,
        &ptx::NORM,
        &format!("fs_rms_rope_{direction}_{}", ptx::suffix(dtype)?),
    )?;
    let size = dtype.size_in_bytes();
    let aligned = [guards[0].1, guards[1].1, guards[2].1]
        .iter()
        .all(|l| (l.start_offset() * size) % 16 == 0);
    let vec = i32::from((cols * size) % 16 == 0 && aligned);
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
        (stores[3], guards[3].1),
        (stores[4], guards[4].1),
    ];
    let backward = direction == "bwd";
    let args = (rows, long(cols)?, long(half)?, eps as f32, vec);
    let out = match dtype {
        DType::F32 => go::<f32>(&func, &dev, inputs, backward, args)?,
        DType::BF16 => go::<half::bf16>(&func, &dev, inputs, backward, args)?,
        other => candle_core::bail!("RMSNorm + RoPE: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok(untracked(out, x.shape().clone()))
}

fn go<T: CudaDType + DeviceRepr + WithDType>(
    func: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
    dev: &candle_core::CudaDevice,
    inputs: [(&CudaStorage, &Layout); 5],
    backward: bool,
    (rows, cols, half, eps, vec): (usize, i64, i64, f32, i32),
) -> Result<CudaStorage> {
    let [x, w, dy, c, s] = inputs;
    let xv = ptx::view::<T>(x.0, x.1)?;
    let wv = ptx::view::<T>(w.0, w.1)?;
    let dyv = ptx::view::<T>(dy.0, dy.1)?;
    let cv = ptx::view::<f32>(c.0, c.1)?;
    let sv = ptx::view::<f32>(s.0, s.1)?;
    // SAFETY: every row is written by its block before the tensor is read.
    let out = unsafe { dev.alloc::<T>(x.1.shape().elem_count())? };
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(func);
    b.arg(&xv).arg(&wv);
    if backward {
        b.arg(&dyv);
    }
    b.arg(&cv).arg(&sv).arg(&out);
    b.arg(&cols).arg(&half).arg(&eps).arg(&vec);
    // SAFETY: argument order and types match fs_rms_rope_fwd / fs_rms_rope_bwd in kernels/norm.cu: x, dy and the
    // output hold rows × cols values, the weight cols, the tables rows × half; `vec` only for whole aligned
    // 16-byte chunks (which hold whole pairs).
    unsafe { b.launch(ptx::row_config(rows)?) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
