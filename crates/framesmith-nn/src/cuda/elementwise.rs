//! Element-wise ops of the Wan block on CUDA (`kernels/elementwise.cu`) as differentiable candle custom ops:
//! adaptive modulation `x * (1 + scale) + shift`, the gated residual `x + y * gate`, and GELU-tanh. Modulation
//! vectors are `[B, D]`, `[B, 1, D]` (one per sample) or `[B, L, D]` (one per token, Wan2.2 TI2V) and are used in
//! f32. Each function has a plain candle composition (`*_reference`) that is the CPU path and the test reference.

mod ops;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, WithDType};

use super::ptx::{self, long};
use crate::ops::Dense;
use ops::{mod_param_grad, Gated, Gelu, GeluBwd, Modulate, ScaledBwd};

/// `x * (1 + scale) + shift` for `x` `[B, L, D]` (any rank ≥ 2: first dim batch, last dim features); result in
/// `x`'s dtype. Differentiable in all three inputs.
pub fn modulate(xs: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    if !runs_on_kernel(xs) {
        return modulate_reference(xs, scale, shift);
    }
    let g = Geometry::of(xs, scale)?;
    check_shift(scale, shift)?;
    xs.dense()?
        .apply_op3(&as_mod_f32(scale)?, &as_mod_f32(shift)?, Modulate { g })
}

/// A modulation's shift must have as many values as its scale.
pub(super) fn check_shift(scale: &Tensor, shift: &Tensor) -> Result<()> {
    if shift.elem_count() != scale.elem_count() {
        candle_core::bail!(
            "modulate: shift has {} values, scale {}",
            shift.elem_count(),
            scale.elem_count()
        );
    }
    Ok(())
}

/// Composition of candle ops computing [`modulate`] (f32 arithmetic, result in `x`'s dtype).
pub fn modulate_reference(xs: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    let g = Geometry::of(xs, scale)?;
    let x = xs
        .to_dtype(DType::F32)?
        .reshape((g.batch, g.tokens, g.dim))?;
    let scale = scale
        .to_dtype(DType::F32)?
        .reshape((g.batch, g.mod_tokens, g.dim))?;
    let shift = shift
        .to_dtype(DType::F32)?
        .reshape((g.batch, g.mod_tokens, g.dim))?;
    x.broadcast_mul(&(scale + 1.0)?)?
        .broadcast_add(&shift)?
        .reshape(xs.shape())?
        .to_dtype(xs.dtype())
}

/// `x + y * gate` (the gated residual), `y` cast to `x`'s dtype first (so an f32 residual stream stays f32).
/// Differentiable in all three inputs.
pub fn gated_residual(xs: &Tensor, ys: &Tensor, gate: &Tensor) -> Result<Tensor> {
    if !runs_on_kernel(xs) {
        return gated_residual_reference(xs, ys, gate);
    }
    let g = Geometry::of(xs, gate)?;
    let ys = ys.to_dtype(xs.dtype())?.dense()?;
    xs.dense()?.apply_op3(&ys, &as_mod_f32(gate)?, Gated { g })
}

/// Composition of candle ops computing [`gated_residual`].
pub fn gated_residual_reference(xs: &Tensor, ys: &Tensor, gate: &Tensor) -> Result<Tensor> {
    let g = Geometry::of(xs, gate)?;
    let y = ys
        .to_dtype(DType::F32)?
        .reshape((g.batch, g.tokens, g.dim))?;
    let gate = gate
        .to_dtype(DType::F32)?
        .reshape((g.batch, g.mod_tokens, g.dim))?;
    let branch = y.broadcast_mul(&gate)?.reshape(xs.shape())?;
    (xs.to_dtype(DType::F32)? + branch)?.to_dtype(xs.dtype())
}

/// GELU with the tanh approximation (Wan's FFN), differentiable.
pub fn gelu_tanh(xs: &Tensor) -> Result<Tensor> {
    if !runs_on_kernel(xs) {
        return gelu_tanh_reference(xs);
    }
    xs.dense()?.apply_op1(Gelu)
}

/// Input gradient of [`modulate`] (`dy * (1 + scale)`) outside autograd. CUDA only.
pub fn modulate_backward(dy: &Tensor, scale: &Tensor) -> Result<Tensor> {
    if !runs_on_kernel(dy) {
        candle_core::bail!("modulate_backward needs an f32 / bf16 CUDA tensor");
    }
    scaled(dy, scale, 1.0)
}

/// `dy * (offset + scale)` in `dy`'s dtype, outside autograd (f32 / bf16 CUDA tensors, checked by the callers).
pub(super) fn scaled(dy: &Tensor, scale: &Tensor, offset: f32) -> Result<Tensor> {
    let g = Geometry::of(dy, scale)?;
    dy.dense()?
        .apply_op2_no_bwd(&as_mod_f32(scale)?, &ScaledBwd { g, offset })
}

/// Gradient of the branch `y` of [`gated_residual`] (`dout * gate`, in `dout`'s dtype) outside autograd.
/// CUDA only.
pub fn gated_residual_backward(dout: &Tensor, gate: &Tensor) -> Result<Tensor> {
    if !runs_on_kernel(dout) {
        candle_core::bail!("gated_residual_backward needs an f32 / bf16 CUDA tensor");
    }
    scaled(dout, gate, 0.0)
}

/// Input gradient of [`gelu_tanh`] for the output gradient `dy`, outside autograd. CUDA only.
pub fn gelu_tanh_backward(xs: &Tensor, dy: &Tensor) -> Result<Tensor> {
    if !runs_on_kernel(xs) || dy.dims() != xs.dims() {
        candle_core::bail!("gelu_tanh_backward needs f32 / bf16 CUDA tensors of one shape");
    }
    let dy = dy.to_dtype(xs.dtype())?.dense()?;
    xs.dense()?.apply_op2_no_bwd(&dy, &GeluBwd)
}

/// `(Σ_tokens g · a, Σ_tokens g)` for `a` and `g` [B, L, D] of one dtype, each [B, 1, D] f32 (the second only
/// with `with_sum`): the gradients of a per-sample modulation vector in one pass. Outside autograd. CUDA only.
pub fn token_sums(a: &Tensor, g: &Tensor, with_sum: bool) -> Result<(Tensor, Option<Tensor>)> {
    if !runs_on_kernel(a) || a.dtype() != g.dtype() || a.dims() != g.dims() || a.rank() < 2 {
        candle_core::bail!("token_sums needs two f32 / bf16 CUDA tensors of one shape and dtype");
    }
    let (batch, dim) = (a.dim(0)?, a.dim(candle_core::D::Minus1)?);
    let geo = Geometry {
        batch,
        tokens: a.elem_count() / (batch * dim).max(1),
        dim,
        mod_tokens: 1,
    };
    mod_param_grad(a, &g.contiguous()?, geo, with_sum)
}

/// `xs` densely laid out: as it is when contiguous, through the vectorised row copy when its layout is rows of
/// contiguous values at a constant stride (`crate::ops::row_strided`), else candle's copy.
pub fn contiguous_rows(xs: &Tensor) -> Result<Tensor> {
    if xs.is_contiguous() {
        return Ok(xs.clone());
    }
    if !runs_on_kernel(xs) || crate::ops::row_strided(xs.layout()).is_none() {
        return xs.contiguous();
    }
    xs.apply_op1_no_bwd(&CopyRows)
}

struct CopyRows;

impl CustomOp1 for CopyRows {
    fn name(&self) -> &'static str {
        "framesmith-copy-rows"
    }

    cuda_only_cpu_fwd!("Tensor::contiguous"; a);

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        let Some(rows) = crate::ops::row_strided(xl) else {
            candle_core::bail!(
                "framesmith-copy-rows given a layout that is not rows at one stride"
            );
        };
        let dev = x.device().clone();
        let n = rows.rows * rows.cols;
        let func = ptx::load(
            &dev,
            &ptx::ELEMENTWISE,
            &format!("fs_copy_rows_{}", ptx::suffix(x.dtype())?),
        )?;
        let sizes = [long(rows.rows)?, long(rows.cols)?, long(rows.stride)?];
        macro_rules! launch {
            ($t:ty) => {{
                let width = 16 / std::mem::size_of::<$t>();
                let vec = rows.cols % width == 0 && rows.stride % width == 0 && rows.start % width == 0;
                let src = x.as_cuda_slice::<$t>()?.slice(rows.start..);
                // SAFETY: every one of the n values is written by the kernel below before the tensor is read.
                let out = unsafe { dev.alloc::<$t>(n)? };
                let chunks = if vec { n / width } else { n };
                let cfg = ptx::elementwise_config(chunks);
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&func);
                let flag = i64::from(vec);
                b.arg(&src).arg(&out);
                for v in &sizes {
                    b.arg(v);
                }
                b.arg(&flag);
                // SAFETY: argument order and types match fs_copy_rows in kernels/elementwise.cu; the source holds
                // rows · stride values from `start` (the layout's own extent) and the output rows · cols.
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev)
            }};
        }
        let out = match x.dtype() {
            DType::F32 => launch!(f32),
            DType::BF16 => launch!(half::bf16),
            other => candle_core::bail!("framesmith-copy-rows takes f32 or bf16, not {other:?}"),
        };
        Ok((out, xl.shape().clone()))
    }
}

/// GELU-tanh in f32 through candle's own op, result in `xs`' dtype.
pub fn gelu_tanh_reference(xs: &Tensor) -> Result<Tensor> {
    xs.to_dtype(DType::F32)?.gelu()?.to_dtype(xs.dtype())
}

fn runs_on_kernel(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16)
}

pub(super) fn as_mod_f32(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(DType::F32)?.dense()
}

/// `x` seen as `[batch, tokens, dim]` and its modulation as `[batch, mod_tokens, dim]`, `mod_tokens` 1 or
/// `tokens`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    pub(super) batch: usize,
    pub(super) tokens: usize,
    pub(super) dim: usize,
    pub(super) mod_tokens: usize,
}

impl Geometry {
    pub(super) fn of(xs: &Tensor, modulation: &Tensor) -> Result<Self> {
        let dims = xs.dims();
        if dims.len() < 2 {
            candle_core::bail!("modulation input needs rank >= 2, got {:?}", dims);
        }
        let (batch, dim) = (dims[0], dims[dims.len() - 1]);
        let tokens = xs.elem_count() / (batch * dim).max(1);
        let mod_tokens = match modulation.elem_count() {
            n if n == batch * dim => 1,
            n if n == batch * tokens * dim => tokens,
            n => candle_core::bail!(
                "modulation with {n} values fits neither [{batch}, 1, {dim}] nor [{batch}, {tokens}, {dim}]"
            ),
        };
        Ok(Self {
            batch,
            tokens,
            dim,
            mod_tokens,
        })
    }

    fn rows(&self) -> usize {
        self.batch * self.tokens
    }

    pub(super) fn args(&self) -> Result<[i64; 4]> {
        Ok([
            long(self.rows())?,
            long(self.dim)?,
            long(self.tokens)?,
            long(self.mod_tokens)?,
        ])
    }

    fn mod_shape(&self) -> (usize, usize, usize) {
        (self.batch, self.mod_tokens, self.dim)
    }
}

/// A kernel input as the kernel sees it: f32 (activations or modulation / angle tables) or bf16.
enum Input<'a> {
    F32(CudaView<'a, f32>),
    Bf16(CudaView<'a, half::bf16>),
}

/// One launch of an element-wise kernel: `name_{f32|bf16}(inputs..., scalars..., out, sizes..., vec)` over `n`
/// output elements (the argument order every kernel in kernels/elementwise.cu follows).
pub(super) struct Launch<'a> {
    /// Kernel name without the dtype suffix.
    pub name: &'a str,
    /// Activations (T) and f32 modulation / angle tables.
    pub inputs: &'a [(&'a CudaStorage, &'a Layout)],
    /// f32 arguments after the inputs.
    pub scalars: &'a [f32],
    /// Size arguments after the output.
    pub sizes: &'a [i64],
    /// Output elements.
    pub n: usize,
    /// The length every 16-byte chunk must stay within (row width, head dim, or n): the vectorised path runs
    /// when it is a multiple of the chunk and every input is 16-byte aligned.
    pub unit: usize,
}

fn launch_elementwise<T: CudaDType + DeviceRepr + WithDType>(l: &Launch) -> Result<CudaStorage> {
    let function = format!("{}_{}", l.name, ptx::suffix(T::DTYPE)?);
    launch_named::<T>(l, &function, 16 / T::DTYPE.size_in_bytes())
}

/// Launches `function` (the full kernel name) writing a fresh `TO` output; vectorised chunks hold `width`
/// values.
pub(super) fn launch_named<TO: CudaDType + DeviceRepr>(
    l: &Launch,
    function: &str,
    width: usize,
) -> Result<CudaStorage> {
    let Launch {
        inputs,
        scalars,
        sizes,
        n,
        unit,
        ..
    } = *l;
    let aligned = inputs
        .iter()
        .all(|(s, l)| (l.start_offset() * s.dtype().size_in_bytes()) % 16 == 0);
    let vec = unit % width == 0 && aligned;
    let dev = inputs[0].0.device().clone();
    let func = ptx::load(&dev, &ptx::ELEMENTWISE, function)?;
    let views = inputs
        .iter()
        .map(|(s, l)| match s.dtype() {
            DType::F32 => ptx::view::<f32>(s, l).map(Input::F32),
            DType::BF16 => ptx::view::<half::bf16>(s, l).map(Input::Bf16),
            other => candle_core::bail!("{function} takes f32 or bf16 inputs, not {other:?}"),
        })
        .collect::<Result<Vec<_>>>()?;
    // SAFETY: the kernel writes all n elements before the tensor is read.
    let out = unsafe { dev.alloc::<TO>(n)? };
    let stream = dev.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    for v in &views {
        match v {
            Input::F32(a) => builder.arg(a),
            Input::Bf16(a) => builder.arg(a),
        };
    }
    for s in scalars {
        builder.arg(s);
    }
    builder.arg(&out);
    for s in sizes {
        builder.arg(s);
    }
    let vec_arg = i64::from(vec);
    builder.arg(&vec_arg);
    let chunks = if vec { n.div_ceil(width) } else { n };
    // SAFETY: the callers pass arguments in the order of the kernel signatures in kernels/elementwise.cu, with
    // buffers sized by the checked Geometry; `vec` only when sizes and alignment allow 16-byte accesses.
    unsafe { builder.launch(ptx::elementwise_config(chunks)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Dispatches a launch on the activation dtype of the first input.
pub(super) fn launch_dispatch(l: &Launch) -> Result<CudaStorage> {
    match l.inputs[0].0.dtype() {
        DType::F32 => launch_elementwise::<f32>(l),
        DType::BF16 => launch_elementwise::<half::bf16>(l),
        other => candle_core::bail!("{} takes f32 or bf16 activations, not {other:?}", l.name),
    }
}
