//! Element-wise steps of the transformer blocks and their backward, each on the fused CUDA kernel for CUDA
//! tensors and written with candle ops elsewhere: models call these, never `crate::cuda` directly, so every
//! CUDA dispatch lives here.

use candle_core::{DType, Result, Tensor, D};

mod adapter;
mod heads;
mod rope_halves;
pub use adapter::{
    add_kron, add_product, dora_row_norms, lora_mid, lora_up, pair_products, pair_products_backward,
};
pub use heads::{head_gate, head_gate_backward, sigmoid_gates, sigmoid_gates_backward};
pub use rope_halves::{
    rms_norm_rope_halves, rms_norm_rope_halves_backward, rope_halves, rope_halves_backward,
};

#[cfg(feature = "cuda")]
use crate::cuda::norm_mod::Stats;

/// `x * (1 + scale) + shift` for an f32 `x` with f32 modulation vectors; the fused kernel on CUDA (same f32
/// arithmetic, one pass instead of four).
pub fn modulate(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return crate::cuda::modulate(x, scale, shift);
    }
    x.broadcast_mul(&(scale + 1.0)?)?.broadcast_add(shift)
}

/// The gated residual `x + y · gate` in f32, returned in `residual`; the fused kernel on CUDA when `x` is
/// already in `residual` (it computes in f32 and keeps `x`'s dtype).
pub fn gated_residual(x: &Tensor, y: &Tensor, gate: &Tensor, residual: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && x.dtype() == residual {
        // Outside autograd, the kernel that reads a bf16 branch directly (no cast of `y` to f32 first).
        if !tracked(&[x, y, gate]) {
            return crate::cuda::mixed::gated_residual_mixed(x, y, gate);
        }
        return crate::cuda::gated_residual(x, y, gate);
    }
    let update = y.to_dtype(DType::F32)?.broadcast_mul(gate)?;
    (x.to_dtype(DType::F32)? + update)?.to_dtype(residual)
}

/// GELU with the tanh approximation (candle's `gelu`); the fused kernel on CUDA.
pub fn gelu_tanh(xs: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if xs.device().is_cuda() {
        return crate::cuda::gelu_tanh(xs);
    }
    xs.gelu()
}

/// Whether any of `ts` is part of an autograd graph: the fused kernels below have no backward, so a tracked
/// input takes the differentiable composition instead (FLUX's head runs `modulate_to` under autograd; the kernel
/// there cut the gradient to every block on CUDA).
#[cfg(feature = "cuda")]
fn tracked(ts: &[&Tensor]) -> bool {
    ts.iter().any(|t| t.track_op())
}

#[cfg(feature = "cuda")]
fn on_kernel(xs: &Tensor) -> bool {
    xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16)
}

/// `xs` in `dtype`; the vectorised f32 ↔ bf16 kernel on CUDA (candle's bf16 → f32 cast is five times slower).
pub fn cast(xs: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) && !tracked(&[xs]) {
        return crate::cuda::mixed::cast(xs, dtype);
    }
    xs.to_dtype(dtype)
}

/// `x * (1 + scale) + shift` computed in f32 (`x` cast to f32 first), returned in `dtype` (the casts fused in
/// on CUDA).
pub fn modulate_to(x: &Tensor, scale: &Tensor, shift: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(x) && !tracked(&[x, scale, shift]) {
        return crate::cuda::mixed::modulate_to(x, scale, shift, dtype);
    }
    modulate(&x.to_dtype(DType::F32)?, scale, shift)?.to_dtype(dtype)
}

/// The residual `x + y` computed in f32 and returned in `x`'s dtype (the residual dtype), `y` in any float
/// dtype: on CUDA the gated-residual kernel with a unit gate (exactly the same arithmetic), no cast of `y`.
pub fn residual_add(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(x) && on_kernel(y) && !tracked(&[x, y]) {
        let (b, dim) = (x.dim(0)?, x.dim(candle_core::D::Minus1)?);
        let ones = Tensor::ones((b, 1, dim), DType::F32, x.device())?;
        return crate::cuda::mixed::gated_residual_mixed(x, y, &ones);
    }
    (x.to_dtype(DType::F32)? + y.to_dtype(DType::F32)?)?.to_dtype(x.dtype())
}

/// `xs + row` for `xs` [.., n] and `row` [n] (a bias) broadcast over the rows, in `xs`' dtype, outside autograd:
/// on CUDA the modulation kernel with a zero scale (one pass, the sum in f32), not candle's broadcast add, whose
/// strided index arithmetic keeps it far below the memory's speed on a layer's output; elsewhere candle's
/// broadcast add in `xs`' dtype.
pub fn add_row(xs: &Tensor, row: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) && !tracked(&[xs, row]) {
        let n = xs.dim(D::Minus1)?;
        let x3 = xs.reshape((1, xs.elem_count() / n.max(1), n))?;
        let shift = row.to_dtype(DType::F32)?.reshape((1, n))?;
        let scale = Tensor::zeros((1, n), DType::F32, xs.device())?;
        return modulate_to(&x3, &scale, &shift, xs.dtype())?.reshape(xs.shape());
    }
    xs.broadcast_add(&row.to_dtype(xs.dtype())?)
}

/// `layer_norm(x) * (1 + scale) + shift` — LayerNorm without affine parameters, then the block's modulation
/// ([`modulate_to`]) — written in `dtype`. On CUDA one kernel with the two ops' arithmetic (LayerNorm's output
/// rounded to `x`'s dtype, as it is stored between them), elsewhere the two ops. No gradient on CUDA.
pub fn layer_norm_modulate(
    x: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    eps: f64,
    dtype: DType,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::norm_mod::applies(x, dtype) && !tracked(&[x, scale, shift]) {
        return crate::cuda::norm_mod::layer_norm_modulate(
            x,
            scale,
            shift,
            Stats::Layer(eps),
            dtype,
        );
    }
    modulate_to(
        &crate::norm::layer_norm(x, None, None, eps)?,
        scale,
        shift,
        dtype,
    )
}

/// LayerNorm with optional affine parameters ([`crate::norm::layer_norm`], its output in `x`'s dtype) cast to
/// `dtype`: on CUDA one kernel with the same arithmetic and roundings, elsewhere the two ops. No gradient on CUDA.
pub fn layer_norm_to(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    dtype: DType,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        let params: Vec<&Tensor> = [Some(x), weight, bias].into_iter().flatten().collect();
        if crate::cuda::norm_mod::applies(x, dtype) && !tracked(&params) {
            return crate::cuda::norm_mod::layer_norm_to(x, weight, bias, eps, dtype);
        }
    }
    cast(&crate::norm::layer_norm(x, weight, bias, eps)?, dtype)
}

/// `rms_norm(x) · (1 + scale) + shift` — RMSNorm without a weight ([`crate::norm::rms_norm`], its output in `x`'s
/// dtype), then the block's modulation ([`modulate_to`]) — written in `dtype`. On CUDA one kernel with the two
/// ops' arithmetic and roundings, elsewhere the two ops. No gradient on CUDA.
pub fn rms_norm_modulate(
    x: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    eps: f64,
    dtype: DType,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::norm_mod::applies(x, dtype) && !tracked(&[x, scale, shift]) {
        return crate::cuda::norm_mod::layer_norm_modulate(x, scale, shift, Stats::Rms(eps), dtype);
    }
    modulate_to(&crate::norm::rms_norm(x, None, eps)?, scale, shift, dtype)
}

/// The norm [`residual_layer_norm`] applies to the updated residual.
#[derive(Clone, Copy, Debug)]
pub enum NormAfter<'a> {
    /// LayerNorm with optional affine parameters ([`layer_norm_to`]).
    Affine(Option<&'a Tensor>, Option<&'a Tensor>),
    /// LayerNorm without affine parameters, then `· (1 + scale) + shift` ([`layer_norm_modulate`]).
    Modulated {
        scale: &'a Tensor,
        shift: &'a Tensor,
    },
    /// RMSNorm without a weight ([`crate::norm::rms_norm`], cast to the output dtype), then with a modulation
    /// `(scale, shift)` `· (1 + scale) + shift` ([`rms_norm_modulate`]).
    Rms(Option<(&'a Tensor, &'a Tensor)>),
}

/// The residual update `x + y · gate` ([`gated_residual`]; [`residual_add`] without a gate) in `x`'s dtype, and
/// its LayerNorm as `norm` says, written in `dtype`: `(updated residual, normalised)`. On CUDA one kernel with the
/// separate ops' arithmetic (the residual is not read back), elsewhere the separate ops. No gradient on CUDA.
pub fn residual_layer_norm(
    x: &Tensor,
    y: &Tensor,
    gate: Option<&Tensor>,
    norm: NormAfter,
    eps: f64,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    {
        let (affine, modulation, stats) = match norm {
            NormAfter::Affine(w, b) => ((w, b), None, Stats::Layer(eps)),
            NormAfter::Modulated { scale, shift } => {
                ((None, None), Some((scale, shift)), Stats::Layer(eps))
            }
            NormAfter::Rms(modulation) => ((None, None), modulation, Stats::Rms(eps)),
        };
        let inputs: Vec<&Tensor> = [Some(x), Some(y), gate, affine.0, affine.1]
            .into_iter()
            .flatten()
            .chain(modulation.into_iter().flat_map(|(s, h)| [s, h]))
            .collect();
        if crate::cuda::norm_mod::applies(x, dtype) && y.dtype() == dtype && !tracked(&inputs) {
            return crate::cuda::norm_mod::residual_layer_norm(
                x, y, gate, affine, modulation, stats,
            );
        }
    }
    let updated = match gate {
        Some(g) => gated_residual(x, y, g, x.dtype())?,
        None => residual_add(x, y)?,
    };
    let normed = match norm {
        NormAfter::Affine(w, b) => layer_norm_to(&updated, w, b, eps, dtype)?,
        NormAfter::Modulated { scale, shift } => {
            layer_norm_modulate(&updated, scale, shift, eps, dtype)?
        }
        NormAfter::Rms(Some((scale, shift))) => {
            rms_norm_modulate(&updated, scale, shift, eps, dtype)?
        }
        NormAfter::Rms(None) => cast(&crate::norm::rms_norm(&updated, None, eps)?, dtype)?,
    };
    Ok((updated, normed))
}

/// The gradient of a residual stream `x` that feeds `x + f(layer_norm(x))`: `dres` (the gradient arriving
/// along the residual) plus LayerNorm's input gradient ([`crate::norm::layer_norm_backward`], weight optional)
/// for `dy = dh · (1 + scale)` ([`modulate_backward`], with a modulation) or `dh` (without), `dy` taken in `x`'s
/// dtype. On CUDA one kernel, elsewhere the separate ops; the result in `x`'s dtype either way.
pub fn layer_norm_backward_add(
    x: &Tensor,
    weight: Option<&Tensor>,
    dh: &Tensor,
    scale: Option<&Tensor>,
    dres: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    norm_backward_add(x, weight, dh, scale, dres, NormOf::Layer(eps))
}

/// [`layer_norm_backward_add`] for RMSNorm without a weight: `dres` plus [`crate::norm::rms_norm_backward`] for
/// `dy = dh · (1 + scale)` (with a modulation) or `dh`, taken in `x`'s dtype; the gradient of a residual stream
/// that feeds `x + f(rms_norm_modulate(x))`. On CUDA one kernel, elsewhere the separate ops; in `x`'s dtype.
pub fn rms_norm_backward_add(
    x: &Tensor,
    dh: &Tensor,
    scale: Option<&Tensor>,
    dres: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    norm_backward_add(x, None, dh, scale, dres, NormOf::Rms(eps))
}

/// Which norm's statistics a fused backward takes, with its epsilon.
#[derive(Clone, Copy)]
enum NormOf {
    Layer(f64),
    Rms(f64),
}

/// [`layer_norm_backward_add`] and [`rms_norm_backward_add`]: one kernel on CUDA, the modulation's backward then the
/// norm's elsewhere.
fn norm_backward_add(
    x: &Tensor,
    weight: Option<&Tensor>,
    dh: &Tensor,
    scale: Option<&Tensor>,
    dres: &Tensor,
    norm: NormOf,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::norm_mod::applies(x, dh.dtype()) && dres.dtype() == x.dtype() {
        let stats = match norm {
            NormOf::Layer(eps) => Stats::Layer(eps),
            NormOf::Rms(eps) => Stats::Rms(eps),
        };
        return crate::cuda::norm_mod::layer_norm_backward_add(x, weight, dh, scale, dres, stats);
    }
    let dy = match scale {
        Some(scale) => modulate_backward(dh, scale, x.dtype())?,
        None => cast(dh, x.dtype())?,
    };
    let dx = match norm {
        NormOf::Layer(eps) => crate::norm::layer_norm_backward(x, weight, &dy, eps)?,
        NormOf::Rms(eps) => crate::norm::rms_norm_backward(x, weight, &dy, eps)?,
    };
    dres + dx
}

/// Input gradient of `x * (1 + scale) + shift`: `dy * (1 + scale)` computed in f32, returned in `dtype`.
pub fn modulate_backward(dy: &Tensor, scale: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dy) {
        return crate::cuda::mixed::scaled_to(dy, scale, 1.0, dtype);
    }
    dy.to_dtype(DType::F32)?
        .broadcast_mul(&(scale + 1.0)?)?
        .to_dtype(dtype)
}

/// Gradient of the branch `y` of the gated residual `x + y · gate` for the residual gradient `dout`:
/// `dout · gate` computed in f32, returned in `dtype` (the branch's dtype).
pub fn gate_backward(dout: &Tensor, gate: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dout) {
        return crate::cuda::mixed::scaled_to(dout, gate, 0.0, dtype);
    }
    dout.to_dtype(DType::F32)?
        .broadcast_mul(gate)?
        .to_dtype(dtype)
}

/// Input gradient of GELU-tanh at `xs` for the output gradient `dy`, in `xs`' dtype:
/// `0.5 (1 + t) + 0.5 x (1 − t²) √(2/π) (1 + 3 · 0.044715 x²)` with `t = tanh(√(2/π) (x + 0.044715 x³))`.
pub fn gelu_tanh_backward(xs: &Tensor, dy: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) {
        return crate::cuda::elementwise::gelu_tanh_backward(xs, dy);
    }
    const C: f64 = 0.044_715;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let x = xs.to_dtype(DType::F32)?;
    let x2 = x.sqr()?;
    let t = ((&x + (&x * &x2)? * C)? * k)?.tanh()?;
    let left = ((&t + 1.0)? * 0.5)?;
    let right = ((&x * (t.sqr()?.neg()? + 1.0)?)? * ((x2 * (3.0 * C))? + 1.0)?)? * (0.5 * k);
    ((left + right)? * dy.to_dtype(DType::F32)?)?.to_dtype(xs.dtype())
}

/// Rotates `xs` [b, seq_len, heads, head_dim] pairwise (adjacent elements form a complex number) by the angles
/// whose cosines and sines are `cos` and `sin` [b, seq_len, 1, head_dim / 2]. Differentiable off CUDA (built from
/// ops that all have a backward); on CUDA the fused kernel rotates in f32 in one pass.
pub fn rope_apply(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if xs.device().is_cuda() && matches!(xs.dtype(), DType::F32 | DType::BF16) {
        return crate::cuda::rope_apply(xs, cos, sin);
    }
    let (b, l, h, d) = xs.dims4()?;
    let pairs = xs.reshape((b, l, h, d / 2, 2))?;
    let re = pairs.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
    let im = pairs.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
    let cos = cos.to_dtype(xs.dtype())?;
    let sin = sin.to_dtype(xs.dtype())?;
    let out_re = (re.broadcast_mul(&cos)? - im.broadcast_mul(&sin)?)?;
    let out_im = (re.broadcast_mul(&sin)? + im.broadcast_mul(&cos)?)?;
    Tensor::stack(&[out_re, out_im], D::Minus1)?.reshape((b, l, h, d))
}

/// Input gradient of [`rope_apply`]: `dy` rotated by the negative angles.
pub fn rope_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(dy) {
        return crate::cuda::rope::rope_backward(dy, cos, sin);
    }
    rope_apply(dy, cos, &sin.neg()?)
}

/// `rope(rms_norm(x, weight))` with `x` [b, l, heads · d] split into heads first: [b, l, heads, d], the tables as
/// [`rope_apply`] takes them. On CUDA one kernel (no gradient) with the two ops' arithmetic and roundings,
/// elsewhere the two ops.
pub fn rms_norm_rope(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::rms_rope::applies(x) && !tracked(&[x, weight]) {
        return crate::cuda::rms_rope::rms_norm_rope(x, weight, eps, heads, cos, sin);
    }
    let (b, l, cols) = x.dims3()?;
    let normed = crate::norm::rms_norm(x, Some(weight), eps)?;
    rope_apply(&normed.reshape((b, l, heads, cols / heads))?, cos, sin)
}

/// Input gradient of [`rms_norm_rope`] for the rotated heads' gradient `dy` [b, l, heads, d]: `x`'s [b, l,
/// heads · d], outside autograd. On CUDA one kernel, elsewhere [`rope_backward`] then
/// [`crate::norm::rms_norm_backward`].
pub fn rms_norm_rope_backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if crate::cuda::rms_rope::applies(x) {
        return crate::cuda::rms_rope::rms_norm_rope_backward(x, weight, dy, eps, cos, sin);
    }
    let d = rope_backward(dy, cos, sin)?.flatten_from(2)?;
    crate::norm::rms_norm_backward(x, Some(weight), &d, eps)
}

/// A layout seen as `rows` rows of `cols` contiguous values, row `r` starting at `start + r · stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowStrided {
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub start: usize,
}

/// `layout` as rows at one stride — a narrow of the last dimension, heads split out of a fused projection, a
/// row-broadcast — or `None` when its striding is anything else (a transpose of the last dimension, say).
pub fn row_strided(layout: &candle_core::Layout) -> Option<RowStrided> {
    let (dims, strides) = (layout.dims(), layout.stride());
    // The trailing dimensions that are contiguous form the columns.
    let mut cols = 1;
    let mut k = dims.len();
    while k > 0 && (dims[k - 1] == 1 || strides[k - 1] == cols) {
        cols *= dims[k - 1];
        k -= 1;
    }
    // The others must collapse into one row dimension of a single stride.
    let (mut rows, mut stride, mut next) = (1, cols, None);
    for j in (0..k).rev() {
        if dims[j] == 1 {
            continue;
        }
        match next {
            None => stride = strides[j],
            Some(expected) if strides[j] == expected => {}
            Some(_) => return None,
        }
        next = Some(strides[j] * dims[j]);
        rows *= dims[j];
    }
    Some(RowStrided {
        rows,
        cols,
        stride,
        start: layout.start_offset(),
    })
}

/// `xs` densely laid out (as it is when contiguous). On CUDA a row-strided view (see [`row_strided`]) outside
/// autograd is copied by a vectorised kernel: candle's generic strided copy ran at a fifth of the bandwidth in the
/// FLUX profile. A tracked tensor takes candle's (differentiable) copy.
pub fn contiguous(xs: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if on_kernel(xs) && !tracked(&[xs]) {
        return crate::cuda::elementwise::contiguous_rows(xs);
    }
    xs.contiguous()
}

/// [`contiguous`] as a method, for chains of tensor calls.
pub trait Dense {
    /// [`contiguous`] of `self`.
    fn dense(&self) -> Result<Tensor>;
}

impl Dense for Tensor {
    fn dense(&self) -> Result<Tensor> {
        contiguous(self)
    }
}

/// Sums over the tokens of `g · a` and, with `with_sum`, of `g`, for `a` and `g` [b, L, D] (any rank ≥ 2: first
/// dim batch, last dim features), computed in f32 and returned [b, 1, D] f32: the gradients of a per-sample
/// modulation vector (its scale with `a` the normalised input, its gate with `a` the branch, its shift the plain
/// sum). One fused pass on CUDA when `a` and `g` share a dtype (summed in another order: equal within rounding).
pub fn token_sums(a: &Tensor, g: &Tensor, with_sum: bool) -> Result<(Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if on_kernel(a) && a.dtype() == g.dtype() && a.dims() == g.dims() && a.rank() >= 2 {
        return crate::cuda::elementwise::token_sums(a, g, with_sum);
    }
    let (b, d) = (a.dim(0)?, a.dim(D::Minus1)?);
    let g = g.to_dtype(DType::F32)?.reshape((b, (), d))?;
    let ga = (&g * a.to_dtype(DType::F32)?.reshape((b, (), d))?)?.sum_keepdim(1)?;
    let gb = with_sum.then(|| g.sum_keepdim(1)).transpose()?;
    Ok((ga, gb))
}

/// Softmax over the last dimension: candle's fused kernel on the GPU (built with this crate's `cuda` feature;
/// without it candle has only the CPU version, and the encoders' attention failed on a CUDA device) and on the CPU.
pub fn softmax_last_dim(xs: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax_last_dim(xs)
}

/// `xs` on `device`: every move between devices of the engine goes through here. Between two GPUs the tensor
/// goes through host memory, because candle's direct copy (cudarc's `memcpy_peer_async` on the receiving GPU's
/// stream) delivered wrong values on the GPU test machine (`bench/RESULTS.md`, the one-expert-per-GPU entry);
/// both hops are copies whose ordering candle guarantees: device to host waits for the sending GPU's queued
/// work, host to device is ordered on the receiving GPU's stream. On the device `xs` is already on, `xs` itself
/// (no copy); to or from the host, candle's copy.
pub fn to_device(xs: &Tensor, device: &candle_core::Device) -> Result<Tensor> {
    let from = xs.device();
    if from.is_cuda() && device.is_cuda() && !from.same_device(device) {
        return xs.to_device(&candle_core::Device::Cpu)?.to_device(device);
    }
    xs.to_device(device)
}

/// [`to_device`] for several tensors.
pub fn all_to_device(xs: &[Tensor], device: &candle_core::Device) -> Result<Vec<Tensor>> {
    xs.iter().map(|t| to_device(t, device)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn layout_of(t: &Tensor) -> Option<RowStrided> {
        row_strided(t.layout())
    }

    #[test]
    fn row_strided_sees_narrows_and_split_heads() -> Result<()> {
        let x = Tensor::zeros((2, 37, 3 * 1536), DType::F32, &Device::Cpu)?;
        let narrow = x.narrow(2, 1536, 1536)?;
        assert_eq!(
            layout_of(&narrow),
            Some(RowStrided {
                rows: 74,
                cols: 1536,
                stride: 4608,
                start: 1536
            })
        );
        let heads = x
            .reshape((2, 37, 3, 12, 128))?
            .narrow(2, 2, 1)?
            .squeeze(2)?;
        assert_eq!(
            layout_of(&heads),
            Some(RowStrided {
                rows: 74,
                cols: 1536,
                stride: 4608,
                start: 3072
            })
        );
        // Contiguous: one row block of everything.
        assert_eq!(
            layout_of(&x).map(|r| (r.rows, r.cols)),
            Some((1, 2 * 37 * 4608))
        );
        // A transpose of the last dimension, a batch narrow leaving rows of two strides: not rows at one stride.
        assert_eq!(layout_of(&x.transpose(1, 2)?), None);
        assert_eq!(layout_of(&x.narrow(1, 0, 5)?.narrow(2, 0, 8)?), None);
        Ok(())
    }

    #[test]
    fn dense_copies_equal_candles_and_token_sums_sum_over_tokens() -> Result<()> {
        let x = Tensor::arange(0f32, 2.0 * 5.0 * 12.0, &Device::Cpu)?.reshape((2, 5, 12))?;
        let view = x.narrow(2, 4, 4)?;
        let dense = view.dense()?;
        assert!(dense.is_contiguous());
        assert_eq!(
            dense.to_vec3::<f32>()?,
            view.contiguous()?.to_vec3::<f32>()?
        );
        let g = Tensor::ones((2, 5, 4), DType::F32, &Device::Cpu)?;
        let (ga, gb) = token_sums(&dense, &g, true)?;
        assert_eq!(ga.dims(), [2, 1, 4]);
        // Σ over the 5 tokens of x[b, l, 4 + c] = Σ_l (60 b + 12 l + 4 + c).
        let want: Vec<f32> = (0..4)
            .map(|c| (0..5).map(|l| (12 * l + 4 + c) as f32).sum())
            .collect();
        assert_eq!(ga.get(0)?.squeeze(0)?.to_vec1::<f32>()?, want);
        assert_eq!(
            gb.map(|t| t.flatten_all()?.to_vec1::<f32>()).transpose()?,
            Some(vec![5.0; 8])
        );
        Ok(())
    }

    /// The RMSNorm + RoPE pair and its backward equal candle's autograd through the two ops (the CPU path; the
    /// fused CUDA kernels are checked against it by `framesmith-bench check`).
    #[test]
    fn rms_norm_rope_backward_matches_autograd() -> Result<()> {
        use rand::SeedableRng;
        let rng = &mut rand::rngs::StdRng::seed_from_u64(5);
        let dev = Device::Cpu;
        let (b, l, heads, d) = (2, 3, 2, 4);
        let x = candle_core::Var::from_tensor(&crate::init::randn(
            rng,
            (b, l, heads * d),
            0.0,
            1.0,
            &dev,
        )?)?;
        let w = crate::init::randn(rng, heads * d, 1.0, 0.2, &dev)?;
        let angles = crate::init::randn(rng, (b, l, 1, d / 2), 0.0, 2.0, &dev)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let dy = crate::init::randn(rng, (b, l, heads, d), 0.0, 1.0, &dev)?;
        let y = rms_norm_rope(x.as_tensor(), &w, 1e-6, heads, &cos, &sin)?;
        assert_eq!(y.dims(), [b, l, heads, d]);
        let store = (&y * &dy)?.sum_all()?.backward()?;
        let want = store
            .get(x.as_tensor())
            .ok_or_else(|| candle_core::Error::msg("no reference gradient"))?;
        let got = rms_norm_rope_backward(x.as_tensor(), &w, &dy, 1e-6, &cos, &sin)?;
        assert!(crate::testing::rel(&got, want)? < 1e-5);
        Ok(())
    }
}
