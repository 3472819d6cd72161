//! Hand-written backward of a [`QwenImageBlock`]: a forward without an autograd graph that records its tape, and
//! the backward written op by op (gated residuals, modulation, LayerNorm, GELU-tanh MLP, per-head q/k RMSNorm,
//! each stream's RoPE, the joint attention from its saved log-sum-exp with the text padding masked, linears
//! through the frozen base plus LoRA gradients). The numerics follow the tracked forward step by step, so the
//! gradients equal candle's autograd through it. `temb` is a constant here: only the LoRA factors of the
//! modulation linears get gradients through it.

use candle_core::{DType, Result, Tensor};

use super::super::attention::{joint_kv_lens, split_heads, StreamQkv, QK_NORM_EPS};
use super::super::rope::{Rope, RopeTable};
use super::LAYER_NORM_EPS;
use super::{triples, BlockInputs, FeedForward, Modulation, ModulationOut, QwenImageBlock};
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{attention_forward, AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::norm::{layer_norm, layer_norm_backward, rms_norm, rms_norm_backward};
use framesmith_nn::ops::{
    gate_backward, gated_residual, gelu_tanh, gelu_tanh_backward, modulate_backward, modulate_to,
    token_sums,
};

/// A stream's modulation without a graph: the two triples and what the LoRA gradients of its linear need.
struct ModTape {
    input: Tensor,
    tape: LinearTape,
    mods: [ModulationOut; 2],
}

/// The gradients of one (shift, scale, gate) triple, each [b, 1, dim] f32.
struct ModGrad {
    shift: Tensor,
    scale: Tensor,
    gate: Tensor,
}

fn modulation_untracked(m: &Modulation, temb: &Tensor) -> Result<ModTape> {
    let input = temb.detach().silu()?;
    let (out, tape) = m.lin.forward_untracked(&input)?;
    let (first, second) = triples(&out)?;
    Ok(ModTape {
        input,
        tape,
        mods: [first, second],
    })
}

/// The LoRA gradients of the modulation linear for both triples' gradients, appended to `params`.
fn modulation_backward(
    m: &Modulation,
    tape: &ModTape,
    grads: [ModGrad; 2],
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
fn norm_modulate_untracked(
    xs: &Tensor,
    m: &ModulationOut,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let normed = layer_norm(&xs.detach(), None, None, LAYER_NORM_EPS)?;
    Ok((modulate_to(&normed, &m.scale, &m.shift, dtype)?, normed))
}

/// Backward of [`norm_modulate_untracked`]: the input gradient (in `xs`' dtype) and the shift and scale
/// gradients (summed over tokens).
fn norm_modulate_backward(
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

/// Gradients of the gated residual `x + y · gate` for the output gradient `dout`: the branch's (in `y`'s dtype)
/// and the gate's (summed over tokens); the residual's is `dout` itself.
fn gated_backward(dout: &Tensor, y: &Tensor, gate: &Tensor) -> Result<(Tensor, Tensor)> {
    let (d_gate, _) = token_sums(y, dout, false)?;
    Ok((gate_backward(dout, gate, y.dtype())?, d_gate))
}

fn missing(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "Qwen-Image block backward: no input gradient for {what}"
    ))
}

/// One stream's intermediates.
struct StreamTape {
    /// Stream input (residual dtype), its LayerNorm output and the modulated norm (the q, k, v input).
    x: Tensor,
    n1: Tensor,
    h1: Tensor,
    qkv: [LinearTape; 3],
    /// q and k [b, l, heads, head_dim] before their RMSNorm.
    raw_qk: [Tensor; 2],
    /// This stream's rows of the attention output (the output projection's input), and that projection's output.
    attn: Tensor,
    proj: LinearTape,
    y1: Tensor,
    /// Residual after attention, its LayerNorm, the MLP input, `net.0.proj`'s output, `net.2`'s output.
    x1: Tensor,
    n2: Tensor,
    h2: Tensor,
    f0: Tensor,
    fc0: LinearTape,
    fc2: LinearTape,
    y2: Tensor,
    m: ModTape,
}

/// Everything [`QwenImageBlock::backward`] needs.
pub struct QwenImageTape {
    img: StreamTape,
    txt: StreamTape,
    attention: AttentionTape,
    rope: Rope,
    txt_len: usize,
}

impl QwenImageTape {
    /// The block's attention tape (output, LSE and the q, k, v it ran on).
    pub fn attention(&self) -> &AttentionTape {
        &self.attention
    }

    /// The gated branches' outputs a recompute may reuse: the output projection's and `net.2`'s, image stream
    /// then text.
    pub fn projections(&self) -> [&Tensor; 4] {
        [&self.img.y1, &self.img.y2, &self.txt.y1, &self.txt.y2]
    }
}

/// The first half of a stream: modulation, norm, q / k / v, q / k norms and RoPE.
struct StreamHead {
    m: ModTape,
    n1: Tensor,
    h1: Tensor,
    qkv: [LinearTape; 3],
    raw_qk: [Tensor; 2],
    /// q and k normalised and rotated, and v: [b, l, heads, head_dim].
    heads: [Tensor; 3],
}

fn stream_head(
    qkv: &StreamQkv,
    modulation: &Modulation,
    xs: &Tensor,
    inputs: &BlockInputs,
    (rope, head_dim): (&RopeTable, usize),
) -> Result<StreamHead> {
    let m = modulation_untracked(modulation, &inputs.temb)?;
    let (h1, n1) = norm_modulate_untracked(xs, &m.mods[0], inputs.compute_dtype())?;
    let outs = Linear::forward_untracked_shared(&[&qkv.q, &qkv.k, &qkv.v], &h1)?;
    let [(q, q_tape), (k, k_tape), (v, v_tape)] = <[_; 3]>::try_from(outs)
        .map_err(|_| candle_core::Error::Msg("q, k, v: three outputs expected".into()))?;
    let (q, k, v) = (
        split_heads(&q, head_dim)?,
        split_heads(&k, head_dim)?,
        split_heads(&v, head_dim)?,
    );
    let qr = rope.apply(&rms_norm(&q, Some(&qkv.norm_q), QK_NORM_EPS)?)?;
    let kr = rope.apply(&rms_norm(&k, Some(&qkv.norm_k), QK_NORM_EPS)?)?;
    Ok(StreamHead {
        m,
        n1,
        h1,
        qkv: [q_tape, k_tape, v_tape],
        raw_qk: [q, k],
        heads: [qr, kr, v],
    })
}

/// The second half of a stream after the joint attention. `kept`: the output projection's and `net.2`'s outputs
/// from an earlier pass on the same input, which skip those products (their LoRA activations are then recomputed
/// in the backward).
fn stream_tail(
    proj: &Linear,
    mlp: &FeedForward,
    head: StreamHead,
    (xs, attn): (&Tensor, Tensor),
    compute: DType,
    kept: Option<[&Tensor; 2]>,
) -> Result<(Tensor, StreamTape)> {
    let residual = xs.dtype();
    let [m1, m2] = &head.m.mods;
    let (y1, proj_tape) = match kept {
        Some([y1, _]) => (y1.clone(), LinearTape::default()),
        None => proj.forward_untracked(&attn)?,
    };
    let x1 = gated_residual(xs, &y1, &m1.gate, residual)?;
    let (h2, n2) = norm_modulate_untracked(&x1, m2, compute)?;
    let (f0, fc0) = mlp.proj_in.forward_untracked(&h2)?;
    let (y2, fc2) = match kept {
        Some([_, y2]) => (y2.clone(), LinearTape::default()),
        None => mlp.proj_out.forward_untracked(&gelu_tanh(&f0)?)?,
    };
    let out = gated_residual(&x1, &y2, &m2.gate, residual)?;
    let tape = StreamTape {
        x: xs.detach(),
        n1: head.n1,
        h1: head.h1,
        qkv: head.qkv,
        raw_qk: head.raw_qk,
        attn,
        proj: proj_tape,
        y1,
        x1,
        n2,
        h2,
        f0,
        fc0,
        fc2,
        y2,
        m: head.m,
    };
    Ok((out, tape))
}

/// What a stream's backward after the joint attention leaves for the rest of it.
struct TailGrads {
    /// Gradient of the stream's rows of the attention output.
    d_attn: Tensor,
    /// Gradient of the residual after attention (the stream input's gradient so far).
    dx1: Tensor,
    /// Modulation gradients of the MLP half, and of the attention half's gate.
    second: ModGrad,
    d_gate1: Tensor,
}

/// One stream's backward after the joint attention.
fn stream_tail_backward(
    proj: &Linear,
    mlp: &FeedForward,
    t: &StreamTape,
    dout: &Tensor,
    params: &mut Vec<ParamGrad>,
) -> Result<TailGrads> {
    let [m1, m2] = &t.m.mods;
    let (dy2, d_gate2) = gated_backward(dout, &t.y2, &m2.gate)?;
    let g = gelu_tanh(&t.f0)?;
    let (dg, p) = mlp
        .proj_out
        .backward_with(&g, &t.fc2, &dy2, InputGrad::New)?;
    params.extend(p);
    let df0 = gelu_tanh_backward(&t.f0, &dg.ok_or_else(|| missing("net.2"))?)?;
    let (dh2, p) = mlp
        .proj_in
        .backward_with(&t.h2, &t.fc0, &df0, InputGrad::New)?;
    params.extend(p);
    let dh2 = dh2.ok_or_else(|| missing("net.0.proj"))?;
    let (dx1_norm, d_shift2, d_scale2) = norm_modulate_backward(&t.x1, &t.n2, m2, &dh2)?;
    let dx1 = (dout + dx1_norm.to_dtype(dout.dtype())?)?;
    let (dy1, d_gate1) = gated_backward(&dx1, &t.y1, &m1.gate)?;
    let (d_attn, p) = proj.backward_with(&t.attn, &t.proj, &dy1, InputGrad::New)?;
    params.extend(p);
    Ok(TailGrads {
        d_attn: d_attn.ok_or_else(|| missing("the output projection"))?,
        dx1,
        second: ModGrad {
            shift: d_shift2,
            scale: d_scale2,
            gate: d_gate2,
        },
        d_gate1,
    })
}

/// Which stream of a block.
#[derive(Clone, Copy)]
enum Stream {
    Img,
    Txt,
}

impl QwenImageBlock {
    /// The stream's q / k / v with their norms, its modulation, output projection and MLP.
    fn stream(&self, s: Stream) -> (&StreamQkv, &Modulation, &Linear, &FeedForward) {
        match s {
            Stream::Img => (
                &self.attn.img,
                &self.img_mod,
                &self.attn.to_out,
                &self.img_mlp,
            ),
            Stream::Txt => (
                &self.attn.txt,
                &self.txt_mod,
                &self.attn.to_add_out,
                &self.txt_mlp,
            ),
        }
    }

    /// [`QwenImageBlock::forward`] without an autograd graph, keeping the tape for [`Self::backward`]; `kept`:
    /// the joint attention of an earlier pass of this block on the same input (not run again); `kept_out`: that
    /// pass's [`QwenImageTape::projections`], which skip those products.
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptAttention>,
        kept_out: Option<[&Tensor; 4]>,
    ) -> Result<(Tensor, QwenImageTape)> {
        let (t, total) = (inputs.txt_len, xs.dim(1)?);
        let img_len = total - t;
        let xs = xs.detach();
        let (txt, img) = (xs.narrow(1, 0, t)?, xs.narrow(1, t, img_len)?);
        let head_dim = self.attn.head_dim();
        let rope = &inputs.rope;
        let (img_qkv, img_mod, img_proj, img_mlp) = self.stream(Stream::Img);
        let (txt_qkv, txt_mod, txt_proj, txt_mlp) = self.stream(Stream::Txt);
        let img_head = stream_head(img_qkv, img_mod, &img, inputs, (&rope.img, head_dim))?;
        let txt_head = stream_head(txt_qkv, txt_mod, &txt, inputs, (&rope.txt, head_dim))?;
        // Image rows first, as the tracked attention.
        let joint = |i: usize| Tensor::cat(&[&img_head.heads[i], &txt_head.heads[i]], 1);
        let (q, k, v) = (joint(0)?, joint(1)?, joint(2)?);
        let kv_lens = joint_kv_lens(img_len, inputs.txt_lens.as_deref());
        let attention = match kept {
            Some(kept) => kept.tape([&q, &k, &v], kv_lens.as_deref())?,
            None => attention_forward(&q, &k, &v, kv_lens.as_deref())?,
        };
        let out = attention.out().flatten_from(2)?;
        let (img_attn, txt_attn) = (out.narrow(1, 0, img_len)?, out.narrow(1, img_len, t)?);
        let compute = inputs.compute_dtype();
        let (img_out, img_tape) = stream_tail(
            img_proj,
            img_mlp,
            img_head,
            (&img, img_attn),
            compute,
            kept_out.map(|k| [k[0], k[1]]),
        )?;
        let (txt_out, txt_tape) = stream_tail(
            txt_proj,
            txt_mlp,
            txt_head,
            (&txt, txt_attn),
            compute,
            kept_out.map(|k| [k[2], k[3]]),
        )?;
        let tape = QwenImageTape {
            img: img_tape,
            txt: txt_tape,
            attention,
            rope: rope.clone(),
            txt_len: t,
        };
        Ok((Tensor::cat(&[&txt_out, &img_out], 1)?, tape))
    }

    /// The block's backward for the output gradient `grad` [b, txt_len + img_len, dim].
    pub fn backward(&self, tape: QwenImageTape, grad: &Tensor) -> Result<BlockGrads> {
        let (t, total) = (tape.txt_len, grad.dim(1)?);
        let img_len = total - t;
        let mut params = Vec::new();
        let (_, _, img_proj, img_mlp) = self.stream(Stream::Img);
        let (_, _, txt_proj, txt_mlp) = self.stream(Stream::Txt);
        let d_img = grad.narrow(1, t, img_len)?;
        let img = stream_tail_backward(img_proj, img_mlp, &tape.img, &d_img, &mut params)?;
        let d_txt = grad.narrow(1, 0, t)?;
        let txt = stream_tail_backward(txt_proj, txt_mlp, &tape.txt, &d_txt, &mut params)?;
        let d_attn = Tensor::cat(&[&img.d_attn, &txt.d_attn], 1)?;
        let d_attn = d_attn.reshape(tape.attention.out().shape())?;
        let (dq, dk, dv) = tape.attention.backward(&d_attn)?;
        let rows = |d: &Tensor, s: Stream| match s {
            Stream::Img => d.narrow(1, 0, img_len),
            Stream::Txt => d.narrow(1, img_len, t),
        };
        let heads = |s: Stream| -> Result<[Tensor; 3]> {
            Ok([rows(&dq, s)?, rows(&dk, s)?, rows(&dv, s)?])
        };
        let dx_img = self.stream_head_backward(
            Stream::Img,
            (&tape.img, &tape.rope.img),
            heads(Stream::Img)?,
            img,
            &mut params,
        )?;
        let dx_txt = self.stream_head_backward(
            Stream::Txt,
            (&tape.txt, &tape.rope.txt),
            heads(Stream::Txt)?,
            txt,
            &mut params,
        )?;
        let input = Tensor::cat(&[&dx_txt, &dx_img], 1)?;
        Ok(BlockGrads { input, params })
    }

    /// A stream's backward through RoPE, the q / k norms, q / k / v, the first modulated norm and the
    /// modulation: the stream input's gradient.
    fn stream_head_backward(
        &self,
        stream: Stream,
        (st, rope): (&StreamTape, &RopeTable),
        [dq, dk, dv]: [Tensor; 3],
        tail: TailGrads,
        params: &mut Vec<ParamGrad>,
    ) -> Result<Tensor> {
        let (qkv, modulation, _, _) = self.stream(stream);
        let [q, k] = &st.raw_qk;
        let dq = rms_norm_backward(q, Some(&qkv.norm_q), &rope.backward(&dq)?, QK_NORM_EPS)?;
        let dk = rms_norm_backward(k, Some(&qkv.norm_k), &rope.backward(&dk)?, QK_NORM_EPS)?;
        let dys = [
            dq.flatten_from(2)?,
            dk.flatten_from(2)?,
            dv.flatten_from(2)?,
        ];
        let [tq, tk, tv] = &st.qkv;
        let (dh1, p) = Linear::backward_shared(
            &[&qkv.q, &qkv.k, &qkv.v],
            &st.h1,
            &[tq, tk, tv],
            &dys,
            InputGrad::New,
        )?;
        params.extend(p);
        let dh1 = dh1.ok_or_else(|| missing("q, k, v"))?;
        let (dx_norm, d_shift1, d_scale1) =
            norm_modulate_backward(&st.x, &st.n1, &st.m.mods[0], &dh1)?;
        let first = ModGrad {
            shift: d_shift1,
            scale: d_scale1,
            gate: tail.d_gate1,
        };
        modulation_backward(modulation, &st.m, [first, tail.second], params)?;
        tail.dx1 + dx_norm.to_dtype(st.x.dtype())?
    }
}
