//! Scaled dot-product attention for the Wan DiT, `[b, l, heads, head_dim]` layout, with per-sample key lengths
//! (keys at or beyond a sample's length are masked; every query row is computed, as flash-attention varlen does).
//! [`attention`] is the portable tiled op (DESIGN.md §4.5): flash-attention style forward and backward built from
//! candle ops on tiles, so it runs on every device and never materialises the score matrix. With the `cudnn`
//! feature, bf16 CUDA inputs run cuDNN's fused attention instead ([`crate::cuda::attention`]).

mod lse;
mod op;
pub mod plans;
#[cfg(test)]
mod tests;
mod tiled;

use std::sync::Arc;

use candle_core::{bail, DType, Result, Tensor, D};

pub use lse::{attention_forward, AttentionTape, KeptAttention, KeptBlock};
use op::TiledAttention;
use tiled::{PeakElems, Problem, Tiles};

/// Attention of `q` [b, lq, h, d] over `k`, `v` [b, lk, h, d], scale 1/sqrt(d). `kv_lens[i]` keys of sample i are
/// attended (`None`: all; lengths above `lk` are clamped). A sample with no keys gets a zero output and zero
/// gradients. `kv_lens` holds one length per sample, else this is an error. Differentiable; computed in f32 and returned in `q`'s dtype. Memory is O(tokens × tile).
/// On CUDA with the `cudnn` feature, bf16 inputs with a head dim up to 128 run cuDNN's fused kernels (also
/// differentiable), self-attention in FP8 on a device where [`crate::device::set_fp8_attention`] turned FP8
/// attention on (for the shapes cuDNN's FP8 kernels take there); everything else runs [`portable_attention`].
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Tensor> {
    #[cfg(feature = "cudnn")]
    if crate::cuda::attention::runs_fused(q) && k.dtype() == DType::BF16 && v.dtype() == DType::BF16
    {
        if runs_fp8(q, k, kv_lens.is_some()) {
            return crate::cuda::attention_fp8::attention(q, k, v, kv_lens);
        }
        return crate::cuda::attention::attention(q, k, v, kv_lens);
    }
    portable_attention(q, k, v, kv_lens)
}

/// Whether attention of `q` over `k` runs cuDNN's FP8 kernels: self-attention only (the keys are the queries' own
/// sequence, a joint text-and-image one included) on a device with FP8 attention on, for the shapes its kernels
/// take. Cross-attention over a separate key sequence (a short text) stays in bf16: there the quantisation passes
/// cost more than the shorter product saves (bench/RESULTS.md, session 34).
#[cfg(feature = "cudnn")]
pub(crate) fn runs_fp8(q: &Tensor, k: &Tensor, padded: bool) -> bool {
    let same_sequence = matches!((q.dim(1), k.dim(1)), (Ok(lq), Ok(lk)) if lq == lk);
    same_sequence && crate::cuda::attention_fp8::ready(q, k, padded)
}

/// FP8 attention's calls so far in this process (forward and backward passes counted apart): how many ran in FP8,
/// and how many ran in bf16 on a device with FP8 attention on because cuDNN refused their shape. Zeros without the
/// `cudnn` feature.
pub fn fp8_calls() -> (u64, u64) {
    #[cfg(feature = "cudnn")]
    return crate::cuda::attention_fp8::calls();
    #[cfg(not(feature = "cudnn"))]
    (0, 0)
}

/// "FP8 attention: 120 passes in FP8, 4 in bf16 (shapes cuDNN's FP8 kernels refuse)" for [`fp8_calls`], `None`
/// when FP8 attention has not been asked for.
pub fn fp8_calls_line() -> Option<String> {
    fp8_calls_text(fp8_calls())
}

fn fp8_calls_text((fp8, bf16): (u64, u64)) -> Option<String> {
    if fp8 + bf16 == 0 {
        return None;
    }
    let mut text = format!("FP8 attention: {fp8} passes in FP8");
    if bf16 > 0 {
        text.push_str(&format!(
            ", {bf16} in bf16 (shapes cuDNN's FP8 kernels refuse)"
        ));
    }
    Some(text)
}

/// The portable tiled attention on any device (the CPU path of [`attention`] and the fallback of the fused one).
pub fn portable_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<Tensor> {
    tiled_attention(q, k, v, kv_lens, None, Arc::default())
}

/// [`attention`] with explicit tiles (`None`: chosen per device) and a tracker of the largest tile-loop tensor.
fn tiled_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
    tiles: Option<Tiles>,
    peak: Arc<PeakElems>,
) -> Result<Tensor> {
    let pb = problem(q, k, v, kv_lens)?;
    if q.elem_count() == 0 {
        // Nothing to attend from; no gradient flows through an empty output anyway.
        return q.zeros_like();
    }
    q.apply_op3(k, v, TiledAttention::new(pb, tiles, peak))
}

/// Checks shapes and dtypes and clamps the key lengths.
fn problem(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Problem> {
    let (b, lq, h, d) = q.dims4()?;
    let (kb, lk, kh, kd) = k.dims4()?;
    if (kb, kh, kd) != (b, h, d) || v.dims() != k.dims() {
        bail!(
            "attention: q {:?}, k {:?} and v {:?} must be [b, l, h, d] with equal b, h, d and k, v equal",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    for (name, xs) in [("q", q), ("k", k), ("v", v)] {
        if !xs.dtype().is_float() {
            bail!(
                "attention: {name} must be a float tensor, got {:?}",
                xs.dtype()
            );
        }
    }
    let lens = match kv_lens {
        Some(lens) if lens.len() != b => {
            bail!("attention: {} kv_lens for a batch of {b}", lens.len())
        }
        Some(lens) => lens.iter().map(|&l| l.min(lk)).collect(),
        None => vec![lk; b],
    };
    Ok(Problem {
        b,
        h,
        lq,
        lk,
        d,
        lens,
    })
}

/// Reference attention that materialises the score matrix. For tests and tiny shapes only.
pub fn naive_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<Tensor> {
    let dtype = q.dtype();
    let (b, lq, h, d) = q.dims4()?;
    let lk = k.dim(1)?;
    let q = q.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let k = k.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let v = v.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let scores = match kv_lens {
        Some(lens) => {
            let mut mask = vec![0f32; b * lk];
            for (i, &len) in lens.iter().enumerate().take(b) {
                for j in len.min(lk)..lk {
                    mask[i * lk + j] = f32::NEG_INFINITY;
                }
            }
            let mask = Tensor::from_vec(mask, (b, 1, 1, lk), q.device())?;
            scores.broadcast_add(&mask)?
        }
        None => scores,
    };
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let out = p.matmul(&v)?;
    debug_assert_eq!(out.dims(), &[b, h, lq, d]);
    out.transpose(1, 2)?.contiguous()?.to_dtype(dtype)
}
