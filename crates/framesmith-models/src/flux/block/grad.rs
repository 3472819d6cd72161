//! Pieces of the FLUX.1 blocks' hand-written backward shared by both kinds (DESIGN.md §4.3): the modulation
//! linear, LayerNorm + modulation, the fused `qkv` projection with its q/k RMSNorm, and the joint RoPE attention,
//! each as a forward that builds no autograd graph and records what its backward needs. The numerics follow the
//! tracked forward step by step, so the gradients equal candle's autograd through it. The conditioning vector is a
//! constant here: only the LoRA factors of the modulation linears get gradients through it.

use candle_core::{DType, Result, Tensor, D};

use super::super::attention::{split_qkv, QkNorm, QK_NORM_EPS};
use super::super::modulation::{Modulation, ModulationOut};
use super::super::rope::Rope;
use super::LAYER_NORM_EPS;
use framesmith_nn::attention::{attention_forward, AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, LinearTape, ParamGrad};
use framesmith_nn::norm::{layer_norm, layer_norm_backward, rms_norm_backward};
use framesmith_nn::ops::{gate_backward, modulate_backward, modulate_to, token_sums};

/// A block's modulation without a graph: the triples and what the LoRA gradients of `lin` need.
pub struct ModTape {
    input: Tensor,
    tape: LinearTape,
    pub mods: Vec<ModulationOut>,
}

/// The gradients of one (shift, scale, gate) triple, each [b, 1, dim] f32.
pub struct ModGrad {
    pub shift: Tensor,
    pub scale: Tensor,
    pub gate: Tensor,
}

/// [`Modulation::forward`] without a graph.
pub fn modulation_untracked(m: &Modulation, vec: &Tensor) -> Result<ModTape> {
    let input = vec.detach().silu()?;
    let (out, tape) = m.lin.forward_untracked(&input)?;
    let out = out.to_dtype(DType::F32)?.unsqueeze(1)?;
    let n = out.dim(2)? / vec.dim(1)?;
    let chunks = out.chunk(n, 2)?;
    let mods = chunks
        .chunks_exact(3)
        .map(|c| ModulationOut {
            shift: c[0].clone(),
            scale: c[1].clone(),
            gate: c[2].clone(),
        })
        .collect();
    Ok(ModTape { input, tape, mods })
}

/// The LoRA gradients of the modulation linear for the triples' gradients (in order), appended to `params`.
pub fn modulation_backward(
    m: &Modulation,
    tape: &ModTape,
    grads: &[ModGrad],
    params: &mut Vec<ParamGrad>,
) -> Result<()> {
    if m.lin.adapter().is_none() {
        return Ok(());
    }
    let parts: Vec<&Tensor> = grads
        .iter()
        .flat_map(|g| [&g.shift, &g.scale, &g.gate])
        .collect();
    let d = Tensor::cat(&parts, 2)?.squeeze(1)?;
    let (_, p) = m
        .lin
        .backward_with(&tape.input, &tape.tape, &d, InputGrad::Skip)?;
    params.extend(p);
    Ok(())
}

/// `(1 + scale) · LayerNorm(x) + shift` without a graph: the output (in `dtype`) and the LayerNorm output.
pub fn norm_modulate_untracked(
    xs: &Tensor,
    m: &ModulationOut,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let normed = layer_norm(&xs.detach(), None, None, LAYER_NORM_EPS)?;
    Ok((modulate_to(&normed, &m.scale, &m.shift, dtype)?, normed))
}

/// Backward of [`norm_modulate_untracked`]: the input gradient (in `xs`' dtype) and the shift and scale
/// gradients (summed over tokens).
pub fn norm_modulate_backward(
    xs: &Tensor,
    normed: &Tensor,
    m: &ModulationOut,
    dh: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (d_scale, d_shift) = token_sums(normed, dh, true)?;
    let d_shift =
        d_shift.ok_or_else(|| candle_core::Error::Msg("token_sums: no plain sum".into()))?;
    let dn = modulate_backward(dh, &m.scale, normed.dtype())?;
    let dx = layer_norm_backward(xs, None, &dn, LAYER_NORM_EPS)?;
    Ok((dx, d_shift, d_scale))
}

/// Gradients of the gated residual `x + y · gate` for the output gradient `dout`: the branch gradient (in `y`'s
/// dtype) and the gate's (summed over tokens); the residual's gradient is `dout` itself.
pub fn gated_backward(dout: &Tensor, y: &Tensor, gate: &Tensor) -> Result<(Tensor, Tensor)> {
    let (d_gate, _) = token_sums(y, dout, false)?;
    Ok((gate_backward(dout, gate, y.dtype())?, d_gate))
}

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
