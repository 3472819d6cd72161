//! Per-head gates (`fs_head_gate_*` in `kernels/elementwise.cu`), outside autograd: each head of an attention's
//! output times one gate per token and head (LTX-2.3's gated attention), and the backward giving both the
//! output's gradient and the gates' in one pass. Same arithmetic and roundings as [`crate::ops::head_gate`]'s
//! composition (the product rounded to the activations' dtype; the gates' gradient summed in f32 from the
//! rounded products, then rounded).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result, Tensor, WithDType};

use super::elementwise::{launch_dispatch, Launch};
use super::ptx::{self, cuda_storage, long, untracked};
use crate::ops::Dense;

/// Whether the kernels take `xs`: an f32 / bf16 CUDA tensor.
pub fn applies(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16)
}

/// `(rows, d)` of heads `xs` [b, l, heads, d] and gates [b, l, heads].
fn geometry(xs: &Tensor, gates: &Tensor) -> Result<(usize, usize)> {
    let (b, l, heads, d) = xs.dims4()?;
    if gates.dims() != [b, l, heads] {
        candle_core::bail!(
            "head gates {:?} for heads {:?} (want [b, l, heads])",
            gates.dims(),
            xs.dims()
        );
    }
    Ok((b * l * heads, d))
}

/// Each head of `xs` [b, l, heads, d] times its gate of `gates` [b, l, heads] (cast to `xs`' dtype). CUDA f32 /
/// bf16 only; the caller checks [`applies`].
pub fn head_gate(xs: &Tensor, gates: &Tensor) -> Result<Tensor> {
    let (_, d) = geometry(xs, gates)?;
    let x = xs.dense()?;
    let g = gates.to_dtype(xs.dtype())?.dense()?;
    let (xg, gg) = (x.storage_and_layout(), g.storage_and_layout());
    let n = x.elem_count();
    let out = launch_dispatch(&Launch {
        name: "fs_head_gate_fwd",
        inputs: &[
            (cuda_storage(&xg.0, "head gates")?, xg.1),
            (cuda_storage(&gg.0, "head gates")?, gg.1),
        ],
        scalars: &[],
        sizes: &[long(n)?, long(d)?],
        n,
        unit: d,
    })?;
    drop((xg, gg));
    Ok(untracked(out, x.shape().clone()))
}

/// The backward of [`head_gate`] at `xs` for the output gradient `dy`: `(dy · gate, Σ_d dy · xs)`, the second
/// [b, l, heads], both in `xs`' dtype. CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn head_gate_backward(dy: &Tensor, xs: &Tensor, gates: &Tensor) -> Result<(Tensor, Tensor)> {
    let (rows, d) = geometry(xs, gates)?;
    if dy.dims() != xs.dims() {
        candle_core::bail!(
            "head gates backward: dy {:?} for heads {:?}",
            dy.dims(),
            xs.dims()
        );
    }
    let dtype = xs.dtype();
    let (x, dy, g) = (
        xs.dense()?,
        dy.to_dtype(dtype)?.dense()?,
        gates.to_dtype(dtype)?.dense()?,
    );
    let guards = [
        dy.storage_and_layout(),
        x.storage_and_layout(),
        g.storage_and_layout(),
    ];
    let stores = guards
        .iter()
        .map(|(s, _)| cuda_storage(s, "head gates backward"))
        .collect::<Result<Vec<_>>>()?;
    let size = dtype.size_in_bytes();
    let aligned = guards
        .iter()
        .all(|(_, l)| (l.start_offset() * size) % 16 == 0);
    let vec = i64::from(d % (16 / size) == 0 && aligned);
    let layouts = [guards[0].1, guards[1].1, guards[2].1];
    let (dx, dg) = match dtype {
        DType::F32 => go::<f32>(&stores, layouts, (rows, d, vec))?,
        DType::BF16 => go::<half::bf16>(&stores, layouts, (rows, d, vec))?,
        other => candle_core::bail!("head gates backward: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok((
        untracked(dx, x.shape().clone()),
        untracked(dg, g.shape().clone()),
    ))
}

fn go<T: CudaDType + DeviceRepr + WithDType>(
    stores: &[&CudaStorage],
    layouts: [&Layout; 3],
    (rows, d, vec): (usize, usize, i64),
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = stores[0].device().clone();
    let func = ptx::load(
        &dev,
        &ptx::ELEMENTWISE,
        &format!("fs_head_gate_bwd_{}", ptx::suffix(T::DTYPE)?),
    )?;
    let dyv = ptx::view::<T>(stores[0], layouts[0])?;
    let xv = ptx::view::<T>(stores[1], layouts[1])?;
    let gv = ptx::view::<T>(stores[2], layouts[2])?;
    // SAFETY: the kernel writes every value of both outputs (one warp per row) before either is read.
    let (dx, dg) = unsafe { (dev.alloc::<T>(rows * d)?, dev.alloc::<T>(rows)?) };
    let (rows_arg, d_arg) = (long(rows)?, long(d)?);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&dyv).arg(&xv).arg(&gv).arg(&dx).arg(&dg);
    b.arg(&rows_arg).arg(&d_arg).arg(&vec);
    let warps_per_block = (ptx::THREADS / 32) as usize;
    let blocks = u32::try_from(rows.div_ceil(warps_per_block))
        .map_err(|_| candle_core::Error::Msg(format!("head gates: too many rows ({rows})")))?;
    let config = LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (ptx::THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument order and types match fs_head_gate_bwd in kernels/elementwise.cu: dy, x and dx hold
    // rows × d values, the gates and dg one per row; `vec` only when 16-byte chunks divide d and every buffer is
    // aligned.
    unsafe { b.launch(config) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(dx, dev.clone()),
        CudaStorage::wrap_cuda_slice(dg, dev),
    ))
}

/// The gates `2·sigmoid(logits)` of LTX-2.3's gated attention in one pass, in the logits' dtype, bit for bit as
/// `crate::ops::sigmoid_gates`' composition. CUDA f32 / bf16 only; the caller checks [`applies`].
pub fn sigmoid_gates(logits: &Tensor) -> Result<Tensor> {
    let z = logits.dense()?;
    unary_pass("fs_sigmoid_gate_fwd", &[&z], "sigmoid gates")
}

/// The logits' gradient `(dg · g) · (1 − g/2)` for the gates `g` and their gradient `dg` (one shape, `g`'s
/// dtype), in one pass, bit for bit as `crate::ops::sigmoid_gates_backward`' composition. CUDA f32 / bf16 only.
pub fn sigmoid_gates_backward(dg: &Tensor, g: &Tensor) -> Result<Tensor> {
    if dg.dims() != g.dims() {
        candle_core::bail!(
            "sigmoid gates backward: dg {:?} for gates {:?}",
            dg.dims(),
            g.dims()
        );
    }
    let (dg, g) = (dg.to_dtype(g.dtype())?.dense()?, g.dense()?);
    unary_pass("fs_sigmoid_gate_bwd", &[&dg, &g], "sigmoid gates backward")
}

/// One value of the output per value of `inputs` (dense, one shape and dtype) through `fs_{name}_{dtype}`.
fn unary_pass(name: &str, inputs: &[&Tensor], op: &str) -> Result<Tensor> {
    let first = inputs
        .first()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: no input")))?;
    let (dtype, shape, n) = (first.dtype(), first.shape().clone(), first.elem_count());
    let guards: Vec<_> = inputs.iter().map(|t| t.storage_and_layout()).collect();
    let stores = guards
        .iter()
        .map(|(s, _)| cuda_storage(s, op))
        .collect::<Result<Vec<_>>>()?;
    let layouts: Vec<&Layout> = guards.iter().map(|(_, l)| *l).collect();
    let out = match dtype {
        DType::F32 => pass::<f32>(name, &stores, &layouts, n)?,
        DType::BF16 => pass::<half::bf16>(name, &stores, &layouts, n)?,
        other => candle_core::bail!("{op}: no {other:?} kernel"),
    };
    drop(stores);
    drop(guards);
    Ok(untracked(out, shape))
}

fn pass<T: CudaDType + DeviceRepr + WithDType>(
    name: &str,
    stores: &[&CudaStorage],
    layouts: &[&Layout],
    n: usize,
) -> Result<CudaStorage> {
    let dev = stores[0].device().clone();
    let func = ptx::load(
        &dev,
        &ptx::ELEMENTWISE,
        &format!("{name}_{}", ptx::suffix(T::DTYPE)?),
    )?;
    let views = stores
        .iter()
        .zip(layouts)
        .map(|(s, l)| ptx::view::<T>(s, l))
        .collect::<Result<Vec<_>>>()?;
    // SAFETY: the kernel writes every one of the n values before they are read.
    let out = unsafe { dev.alloc::<T>(n)? };
    let n_arg = long(n)?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    for v in &views {
        b.arg(v);
    }
    b.arg(&out).arg(&n_arg);
    // SAFETY: argument order and types match fs_sigmoid_gate_{fwd,bwd}_* in kernels/elementwise.cu: each input and
    // the output hold n values of T.
    unsafe { b.launch(ptx::elementwise_config(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
