//! Hand-written backward of a [`DualStreamBlock`]: a forward without an autograd graph that records its tape, and
//! the backward written op by op (gated residuals, modulation, LayerNorm, GELU-tanh MLP, per-head q/k RMSNorm,
//! each stream's RoPE, the joint attention from its saved log-sum-exp with the text padding masked, linears
//! through the frozen base plus LoRA gradients). The numerics follow the tracked forward step by step, so the
//! gradients equal candle's autograd through it. `temb` is a constant here: only the LoRA factors of the
//! modulation linears get gradients through it. The modulation, the modulated norms and each stream's half after
//! the joint attention are the MMDiT families' one ([`crate::modulated`]).

use candle_core::{DType, Result, Tensor};

use super::super::attention::{joint_kv_lens, split_heads, StreamQkv, QK_NORM_EPS};
use super::super::rope::{Rope, RopeTable};
use super::{BlockInputs, DualStreamBlock, FeedForward, Modulation};
use crate::modulated::{
    modulation_backward, modulation_untracked, norm_modulate_backward, norm_modulate_untracked,
    ModGrad, ModTape, StreamTail, TailGrads, TailTape,
};
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{attention_forward, AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::norm::{rms_norm, rms_norm_backward};

fn missing(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "dual-stream block backward: no input gradient for {what}"
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
    /// The half after the joint attention.
    tail: TailTape,
    m: ModTape,
}

/// Everything [`DualStreamBlock::backward`] needs.
pub struct DualStreamTape {
    img: StreamTape,
    txt: StreamTape,
    attention: AttentionTape,
    rope: Rope,
    txt_len: usize,
}

impl DualStreamTape {
    /// The block's attention tape (output, LSE and the q, k, v it ran on).
    pub fn attention(&self) -> &AttentionTape {
        &self.attention
    }

    /// The gated branches' outputs a recompute may reuse: the output projection's and `net.2`'s, image stream
    /// then text.
    pub fn projections(&self) -> [&Tensor; 4] {
        let ([img1, img2], [txt1, txt2]) =
            (self.img.tail.projections(), self.txt.tail.projections());
        [img1, img2, txt1, txt2]
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
    let m = modulation_untracked(&modulation.lin, &inputs.temb)?;
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

/// A stream's half after the joint attention: its output projection and its MLP.
fn tail<'a>(proj: &'a Linear, mlp: &'a FeedForward) -> StreamTail<'a> {
    StreamTail {
        proj,
        mlp: [&mlp.proj_in, &mlp.proj_out],
        names: [
            "dual-stream block",
            "the output projection",
            "net.0.proj",
            "net.2",
        ],
    }
}

/// The second half of a stream after the joint attention ([`StreamTail::forward`]).
fn stream_tail(
    (proj, mlp): (&Linear, &FeedForward),
    head: StreamHead,
    (xs, attn): (&Tensor, Tensor),
    compute: DType,
    kept: Option<[&Tensor; 2]>,
) -> Result<(Tensor, StreamTape)> {
    let mods = [&head.m.mods[0], &head.m.mods[1]];
    let (out, tail) = tail(proj, mlp).forward(mods, (xs, attn), compute, kept)?;
    let tape = StreamTape {
        x: xs.detach(),
        n1: head.n1,
        h1: head.h1,
        qkv: head.qkv,
        raw_qk: head.raw_qk,
        tail,
        m: head.m,
    };
    Ok((out, tape))
}

/// One stream's backward after the joint attention ([`StreamTail::backward`]).
fn stream_tail_backward(
    (proj, mlp): (&Linear, &FeedForward),
    t: &StreamTape,
    dout: &Tensor,
    params: &mut Vec<ParamGrad>,
) -> Result<TailGrads> {
    let mods = [&t.m.mods[0], &t.m.mods[1]];
    tail(proj, mlp).backward(mods, &t.tail, dout, params)
}

/// Which stream of a block.
#[derive(Clone, Copy)]
enum Stream {
    Img,
    Txt,
}

impl DualStreamBlock {
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

    /// [`DualStreamBlock::forward`] without an autograd graph, keeping the tape for [`Self::backward`]; `kept`:
    /// the joint attention of an earlier pass of this block on the same input (not run again); `kept_out`: that
    /// pass's [`DualStreamTape::projections`], which skip those products.
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptAttention>,
        kept_out: Option<[&Tensor; 4]>,
    ) -> Result<(Tensor, DualStreamTape)> {
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
            (img_proj, img_mlp),
            img_head,
            (&img, img_attn),
            compute,
            kept_out.map(|k| [k[0], k[1]]),
        )?;
        let (txt_out, txt_tape) = stream_tail(
            (txt_proj, txt_mlp),
            txt_head,
            (&txt, txt_attn),
            compute,
            kept_out.map(|k| [k[2], k[3]]),
        )?;
        let tape = DualStreamTape {
            img: img_tape,
            txt: txt_tape,
            attention,
            rope: rope.clone(),
            txt_len: t,
        };
        Ok((Tensor::cat(&[&txt_out, &img_out], 1)?, tape))
    }

    /// The block's backward for the output gradient `grad` [b, txt_len + img_len, dim].
    pub fn backward(&self, tape: DualStreamTape, grad: &Tensor) -> Result<BlockGrads> {
        let (t, total) = (tape.txt_len, grad.dim(1)?);
        let img_len = total - t;
        let mut params = Vec::new();
        let (_, _, img_proj, img_mlp) = self.stream(Stream::Img);
        let (_, _, txt_proj, txt_mlp) = self.stream(Stream::Txt);
        let d_img = grad.narrow(1, t, img_len)?;
        let img = stream_tail_backward((img_proj, img_mlp), &tape.img, &d_img, &mut params)?;
        let d_txt = grad.narrow(1, 0, t)?;
        let txt = stream_tail_backward((txt_proj, txt_mlp), &tape.txt, &d_txt, &mut params)?;
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
        modulation_backward(&modulation.lin, &st.m, &[first, tail.second], params)?;
        tail.dx1 + dx_norm.to_dtype(st.x.dtype())?
    }
}
