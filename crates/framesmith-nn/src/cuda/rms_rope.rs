//! RMSNorm fused with the 3D RoPE that follows it (Wan's `q` and `k`; `fs_rms_rope_*` in `kernels/norm.cu`),
//! outside autograd: the forward writes the rotated heads from the projection's output in one pass, the backward
//! takes the rotated heads' gradient and returns the projection output's, rotating it back on the way (each
//! saves writing and reading back one full-size intermediate). Same arithmetic and roundings as
//! [`super::norm::rms_norm`] followed by [`super::rope::rope_apply`], and as their backwards. The rotate-half
//! variant (LTX-2's q and k: each head's halves rotate against each other, by tables per head) does the same for
//! RMSNorm followed by the separate element-wise ops of that rotation ([`crate::ops::rope_halves`]).

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
    let tables = Tables::Pairs { half };
    let y = launch(
        "fwd",
        (xs, weight, None),
        (cos, sin),
        eps,
        [rows, cols],
        tables,
    )?;
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
    check_dy(xs, dy)?;
    let (rows, cols, half, _) = geometry(xs, weight, dy.dim(2)?, cos, sin)?;
    let dy = dy.to_dtype(xs.dtype())?.dense()?;
    let tables = Tables::Pairs { half };
    launch(
        "bwd",
        (xs, weight, Some(&dy)),
        (cos, sin),
        eps,
        [rows, cols],
        tables,
    )
}

fn check_dy(xs: &Tensor, dy: &Tensor) -> Result<()> {
    let (b, l, h, d) = dy.dims4()?;
    if [b, l, h * d] != xs.dims() {
        candle_core::bail!(
            "RMSNorm + RoPE backward: dy {:?} for x {:?}",
            dy.dims(),
            xs.dims()
        );
    }
    Ok(())
}

/// The geometry of the rotate-half layout: `x` [b, l, heads · d], tables of `b · l · heads · d/2` values, the
/// weight `cols`; `(rows, cols, d)`.
fn geometry_halves(
    xs: &Tensor,
    weight: &Tensor,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(usize, usize, usize)> {
    let (b, l, cols) = xs.dims3()?;
    if heads == 0 || cols % heads != 0 || (cols / heads) % 2 != 0 {
        candle_core::bail!(
            "RMSNorm + rotate-half RoPE: {cols} features do not split into {heads} heads of even width"
        );
    }
    if cos.elem_count() != b * l * cols / 2 || sin.elem_count() != cos.elem_count() {
        candle_core::bail!(
            "RMSNorm + rotate-half RoPE: tables of {} / {} values for x {:?} in {heads} heads (want one per \
             head and pair)",
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
    Ok((b * l, cols, cols / heads))
}

/// `rope(rms_norm(x, weight))` in the rotate-half layout (see [`crate::ops::rms_norm_rope_halves`]): `x`
/// [b, l, heads · d] → [b, l, heads, d], `cos` / `sin` one value per head and pair, [b, l, heads, d/2] (cast to
/// `x`'s dtype, in which the separate ops multiply). CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn rms_norm_rope_halves(
    xs: &Tensor,
    weight: &Tensor,
    eps: f64,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    let (rows, cols, d) = geometry_halves(xs, weight, heads, cos, sin)?;
    let (b, l, _) = xs.dims3()?;
    let y = launch(
        "fwd",
        (xs, weight, None),
        (cos, sin),
        eps,
        [rows, cols],
        Tables::Halves { d },
    )?;
    y.reshape((b, l, heads, d))
}

/// Input gradient of [`rms_norm_rope_halves`] for the rotated heads' gradient `dy` [b, l, heads, d]: `x`'s
/// gradient [b, l, heads · d]. CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn rms_norm_rope_halves_backward(
    xs: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    check_dy(xs, dy)?;
    let (rows, cols, d) = geometry_halves(xs, weight, dy.dim(2)?, cos, sin)?;
    let dy = dy.to_dtype(xs.dtype())?.dense()?;
    launch(
        "bwd",
        (xs, weight, Some(&dy)),
        (cos, sin),
        eps,
        [rows, cols],
        Tables::Halves { d },
    )
}

/// The tables' layout: angles shared by the heads, rotating adjacent pairs (f32 tables of `half` values per
/// row), or per head, rotating each head's halves (tables in `x`'s dtype, `cols / 2` values per row; `d` the
/// head width).
#[derive(Clone, Copy)]
enum Tables {
    Pairs { half: usize },
    Halves { d: usize },
}

fn launch(
    direction: &str,
    (xs, weight, dy): (&Tensor, &Tensor, Option<&Tensor>),
    (cos, sin): (&Tensor, &Tensor),
    eps: f64,
    [rows, cols]: [usize; 2],
    tables: Tables,
) -> Result<Tensor> {
    let dtype = xs.dtype();
    let x = xs.dense()?;
    let w = weight.to_dtype(dtype)?.flatten_all()?.dense()?;
    let (table_dtype, kernel, size_arg) = match tables {
        Tables::Pairs { half } => (DType::F32, "fs_rms_rope", half),
        Tables::Halves { d } => (dtype, "fs_rms_rope_halves", d),
    };
    let table = |t: &Tensor| t.detach().to_dtype(table_dtype)?.flatten_all()?.dense();
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
        &format!("{kernel}_{direction}_{}", ptx::suffix(dtype)?),
    )?;
    let size = dtype.size_in_bytes();
    let width = 16 / size;
    let vec = match tables {
        Tables::Pairs { .. } => {
            let aligned = [guards[0].1, guards[1].1, guards[2].1]
                .iter()
                .all(|l| (l.start_offset() * size) % 16 == 0);
            (cols * size) % 16 == 0 && aligned
        }
        // Whole chunks within a half, and the tables read by the same 16-byte accesses.
        Tables::Halves { d } => {
            let aligned = guards
                .iter()
                .all(|(_, l)| (l.start_offset() * size) % 16 == 0);
            (d / 2) % width == 0 && aligned
        }
    };
    let vec = i32::from(vec);
    let inputs = [
        (stores[0], guards[0].1),
        (stores[1], guards[1].1),
        (stores[2], guards[2].1),
        (stores[3], guards[3].1),
        (stores[4], guards[4].1),
    ];
    let backward = direction == "bwd";
    let args = (rows, long(cols)?, long(size_arg)?, eps as f32, vec);
    let out = match (dtype, table_dtype) {
        (DType::F32, DType::F32) => go::<f32, f32>(&func, &dev, inputs, backward, args)?,
        (DType::BF16, DType::F32) => go::<half::bf16, f32>(&func, &dev, inputs, backward, args)?,
        (DType::BF16, DType::BF16) => {
            go::<half::bf16, half::bf16>(&func, &dev, inputs, backward, args)?
        }
        (other, _) => candle_core::bail!("RMSNorm + RoPE: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok(untracked(out, x.shape().clone()))
}

fn go<T: CudaDType + DeviceRepr + WithDType, C: CudaDType + DeviceRepr>(
    func: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
    dev: &candle_core::CudaDevice,
    inputs: [(&CudaStorage, &Layout); 5],
    backward: bool,
    (rows, cols, size, eps, vec): (usize, i64, i64, f32, i32),
) -> Result<CudaStorage> {
    let [x, w, dy, c, s] = inputs;
    let xv = ptx::view::<T>(x.0, x.1)?;
    let wv = ptx::view::<T>(w.0, w.1)?;
    let dyv = ptx::view::<T>(dy.0, dy.1)?;
    let cv = ptx::view::<C>(c.0, c.1)?;
    let sv = ptx::view::<C>(s.0, s.1)?;
    // SAFETY: every row is written by its block before the tensor is read.
    let out = unsafe { dev.alloc::<T>(x.1.shape().elem_count())? };
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(func);
    b.arg(&xv).arg(&wv);
    if backward {
        b.arg(&dyv);
    }
    b.arg(&cv).arg(&sv).arg(&out);
    b.arg(&cols).arg(&size).arg(&eps).arg(&vec);
    // SAFETY: argument order and types match fs_rms_rope_{fwd,bwd} (f32 tables of `size` = d/2 values per row)
    // and fs_rms_rope_halves_{fwd,bwd} (tables in T of cols/2 values per row, `size` = d) in kernels/norm.cu: x,
    // dy and the output hold rows × cols values, the weight cols; `vec` only for whole aligned 16-byte chunks
    // (which hold whole pairs, or lie within one half of a head).
    unsafe { b.launch(ptx::row_config(rows)?) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
