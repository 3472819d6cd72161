//! Pieces of the FLUX.1 blocks' hand-written backward shared by both kinds (DESIGN.md §4.3): the fused `qkv`
//! projection with its q/k RMSNorm and the joint RoPE attention, each as a forward that builds no autograd graph
//! and records what its backward needs. The numerics follow the tracked forward step by step, so the gradients
//! equal candle's autograd through it. The modulation and the modulated norm are the MMDiT families' one
//! ([`crate::modulated`]).

use candle_core::{Result, Tensor, D};

use super::super::attention::{split_qkv, QkNorm, QK_NORM_EPS};
use super::super::rope::Rope;
use framesmith_nn::attention::{attention_forward, AttentionTape, KeptAttention};
use framesmith_nn::norm::rms_norm_backward;

/// q, k, v from a fused projection's output, q and k normalised: what their backward needs.
pub struct QkvTape {
    q: Tensor,
    k: Tensor,
}

/// Splits a fused `qkv` output [b, l, 3·dim] into heads and normalises q and k, without a graph.
pub fn qkv_untracked(qkv: &Tensor, norm: &QkNorm, heads: usize) -> Result<([Tensor; 3], QkvTape)> {
    let (q, k, v) = split_qkv(qkv, heads)?;
    let (qn, kn) = norm.forward(&q, &k, &v)?;
    Ok(([qn, kn, v], QkvTape { q, k }))
}

/// Backward of [`qkv_untracked`]: the fused projection's output gradient [b, l, 3·dim].
pub fn qkv_backward(tape: &QkvTape, norm: &QkNorm, [dq, dk, dv]: [&Tensor; 3]) -> Result<Tensor> {
    let dq = rms_norm_backward(&tape.q, Some(&norm.query_norm), dq, QK_NORM_EPS)?;
    let dk = rms_norm_backward(&tape.k, Some(&norm.key_norm), dk, QK_NORM_EPS)?;
    let dq = dq.to_dtype(dv.dtype())?;
    let dk = dk.to_dtype(dv.dtype())?;
    Tensor::stack(&[&dq, &dk, dv], 2)?.flatten_from(2)
}

/// RoPE and attention of every token over every token without a graph: the output [b, l, heads·head_dim]
/// and the attention's tape. With `kept` (this block's attention from an earlier pass on the same q, k, v) the
/// attention kernel is skipped.
pub fn rope_attention_untracked(
    [q, k, v]: [&Tensor; 3],
    rope: &Rope,
    kept: Option<&KeptAttention>,
) -> Result<(Tensor, AttentionTape)> {
    let (q, k) = (rope.apply(q)?, rope.apply(k)?);
    let tape = match kept {
        Some(kept) => kept.tape([&q, &k, v], None)?,
        None => attention_forward(&q, &k, v, None)?,
    };
    Ok((tape.out().flatten_from(2)?, tape))
}

/// Backward of [`rope_attention_untracked`] for the output gradient [b, l, heads·head_dim]: dq, dk, dv
/// [b, l, heads, head_dim] before RoPE.
pub fn rope_attention_backward(
    tape: &AttentionTape,
    rope: &Rope,
    d_out: &Tensor,
) -> Result<[Tensor; 3]> {
    let d = d_out.reshape(tape.out().shape())?;
    let (dq, dk, dv) = tape.backward(&d)?;
    Ok([rope.backward(&dq)?, rope.backward(&dk)?, dv])
}

/// Rows `[start, start + len)` of a [b, l, …] tensor.
pub fn rows(xs: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    xs.narrow(1, start, len)
}

/// The last-dimension split of `xs` at `at`.
pub fn split_last(xs: &Tensor, at: usize) -> Result<(Tensor, Tensor)> {
    let width = xs.dim(D::Minus1)?;
    Ok((
        xs.narrow(D::Minus1, 0, at)?,
        xs.narrow(D::Minus1, at, width - at)?,
    ))
}
