//! Hand-written backward of a [`DoubleStreamBlock`]: a forward without a graph that records its tape, and the
//! backward written op by op (gated residuals, modulation, LayerNorm, GELU-tanh MLP, q/k RMSNorm, RoPE, joint
//! attention from its saved log-sum-exp, linears through the frozen base plus LoRA gradients).

use candle_core::{Result, Tensor};

use super::super::block::grad::{
    qkv_backward, qkv_untracked, rope_attention_backward, rope_attention_untracked, rows, QkvTape,
};
use super::super::block::BlockInputs;
use super::super::modulation::ModulationOut;
use super::{DoubleStreamBlock, Mlp};
use crate::modulated::{
    modulation_backward, modulation_untracked, norm_modulate_backward, norm_modulate_untracked,
    ModGrad, ModTape, StreamTail, TailGrads, TailTape,
};
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};

/// One stream's intermediates.
struct StreamTape {
    /// Stream input (residual dtype) and its LayerNorm output.
    x: Tensor,
    n1: Tensor,
    /// Modulated norm (the `qkv` input).
    h1: Tensor,
    qkv: LinearTape,
    heads: QkvTape,
    /// The half after the joint attention.
    tail: TailTape,
    m: ModTape,
}

/// Everything [`DoubleStreamBlock::backward`] needs.
pub struct DoubleTape {
    txt: StreamTape,
    img: StreamTape,
    attention: AttentionTape,
    rope: crate::flux::rope::Rope,
    txt_len: usize,
}

/// The first half of a stream: modulation, norm, `qkv`, q/k norms.
struct StreamHead {
    m: ModTape,
    n1: Tensor,
    h1: Tensor,
    qkv: LinearTape,
    heads: QkvTape,
    qkv_heads: [Tensor; 3],
}

fn stream_head(
    attn: &super::super::attention::SelfAttention,
    modulation: &super::super::modulation::Modulation,
    xs: &Tensor,
    inputs: &BlockInputs,
    heads: usize,
) -> Result<StreamHead> {
    let m = modulation_untracked(&modulation.lin, &inputs.vec)?;
    let (h1, n1) = norm_modulate_untracked(xs, &m.mods[0], inputs.compute_dtype())?;
    let (y, qkv) = attn.qkv.forward_untracked(&h1)?;
    let (qkv_heads, tape) = qkv_untracked(&y, &attn.norm, heads)?;
    Ok(StreamHead {
        m,
        n1,
        h1,
        qkv,
        heads: tape,
        qkv_heads,
    })
}

/// A stream's half after the joint attention: its `proj` and its MLP.
fn tail<'a>(proj: &'a Linear, mlp: &'a Mlp) -> StreamTail<'a> {
    StreamTail {
        proj,
        mlp: [&mlp.fc0, &mlp.fc2],
        names: ["double block", "proj", "mlp.0", "mlp.2"],
    }
}

/// The second half of a stream after the joint attention ([`StreamTail::forward`]).
fn stream_tail(
    (proj, mlp): (&Linear, &Mlp),
    head: StreamHead,
    (xs, attn): (&Tensor, Tensor),
    compute: candle_core::DType,
    kept: Option<[&Tensor; 2]>,
) -> Result<(Tensor, StreamTape)> {
    let mods = [&head.m.mods[0], &head.m.mods[1]];
    let (out, tail) = tail(proj, mlp).forward(mods, (xs, attn), compute, kept)?;
    let tape = StreamTape {
        x: xs.detach(),
        n1: head.n1,
        h1: head.h1,
        qkv: head.qkv,
        heads: head.heads,
        tail,
        m: head.m,
    };
    Ok((out, tape))
}

/// One stream's backward after the joint attention ([`StreamTail::backward`]).
fn stream_tail_backward(
    (proj, mlp): (&Linear, &Mlp),
    t: &StreamTape,
    dout: &Tensor,
    params: &mut Vec<ParamGrad>,
) -> Result<TailGrads> {
    let mods = [&t.m.mods[0], &t.m.mods[1]];
    tail(proj, mlp).backward(mods, &t.tail, dout, params)
}

fn missing(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "double block backward: no input gradient for {what}"
    ))
}

impl DoubleTape {
    /// The block's attention tape (output, LSE and the q, k, v it ran on).
    pub fn attention(&self) -> &AttentionTape {
        &self.attention
    }

    /// The gated branches' outputs a recompute may reuse: `proj`'s and `mlp.2`'s, image stream then text.
    pub fn projections(&self) -> [&Tensor; 4] {
        let ([img1, img2], [txt1, txt2]) =
            (self.img.tail.projections(), self.txt.tail.projections());
        [img1, img2, txt1, txt2]
    }
}

impl DoubleStreamBlock {
    /// [`DoubleStreamBlock::forward`] without an autograd graph, keeping the tape for [`Self::backward`];
    /// `kept`: the joint attention of an earlier pass of this block on the same input (not run again);
    /// `kept_out`: that pass's [`DoubleTape::projections`], which skip those products.
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptAttention>,
        kept_out: Option<[&Tensor; 4]>,
    ) -> Result<(Tensor, DoubleTape)> {
        let (t, total) = (inputs.txt_len, xs.dim(1)?);
        let xs = xs.detach();
        let (txt, img) = (rows(&xs, 0, t)?, rows(&xs, t, total - t)?);
        let heads = self.img_attn.num_heads();
        let img_head = stream_head(&self.img_attn, &self.img_mod, &img, inputs, heads)?;
        let txt_head = stream_head(&self.txt_attn, &self.txt_mod, &txt, inputs, heads)?;
        let joint = |i: usize| Tensor::cat(&[&txt_head.qkv_heads[i], &img_head.qkv_heads[i]], 1);
        let (q, k, v) = (joint(0)?, joint(1)?, joint(2)?);
        let (attn, attention) = rope_attention_untracked([&q, &k, &v], &inputs.rope, kept)?;
        let (txt_attn, img_attn) = (rows(&attn, 0, t)?, rows(&attn, t, total - t)?);
        let compute = inputs.compute_dtype();
        let (img_out, img_tape) = stream_tail(
            (&self.img_attn.proj, &self.img_mlp),
            img_head,
            (&img, img_attn),
            compute,
            kept_out.map(|k| [k[0], k[1]]),
        )?;
        let (txt_out, txt_tape) = stream_tail(
            (&self.txt_attn.proj, &self.txt_mlp),
            txt_head,
            (&txt, txt_attn),
            compute,
            kept_out.map(|k| [k[2], k[3]]),
        )?;
        let tape = DoubleTape {
            txt: txt_tape,
            img: img_tape,
            attention,
            rope: inputs.rope.clone(),
            txt_len: t,
        };
        Ok((Tensor::cat(&[&txt_out, &img_out], 1)?, tape))
    }

    /// The block's backward for the output gradient `grad` [b, txt_len + img_len, dim].
    pub fn backward(&self, tape: DoubleTape, grad: &Tensor) -> Result<BlockGrads> {
        let (t, total) = (tape.txt_len, grad.dim(1)?);
        let mut params = Vec::new();
        let (d_img, d_txt) = (rows(grad, t, total - t)?, rows(grad, 0, t)?);
        let img = stream_tail_backward(
            (&self.img_attn.proj, &self.img_mlp),
            &tape.img,
            &d_img,
            &mut params,
        )?;
        let txt = stream_tail_backward(
            (&self.txt_attn.proj, &self.txt_mlp),
            &tape.txt,
            &d_txt,
            &mut params,
        )?;
        let d_attn = Tensor::cat(&[&txt.d_attn, &img.d_attn], 1)?;
        let d_qkv = rope_attention_backward(&tape.attention, &tape.rope, &d_attn)?;
        let txt_rows = |d: &Tensor| rows(d, 0, t);
        let img_rows = |d: &Tensor| rows(d, t, total - t);
        let d_txt_heads = [
            txt_rows(&d_qkv[0])?,
            txt_rows(&d_qkv[1])?,
            txt_rows(&d_qkv[2])?,
        ];
        let d_img_heads = [
            img_rows(&d_qkv[0])?,
            img_rows(&d_qkv[1])?,
            img_rows(&d_qkv[2])?,
        ];
        let dx_img = self.stream_head_backward(false, &tape.img, d_img_heads, img, &mut params)?;
        let dx_txt = self.stream_head_backward(true, &tape.txt, d_txt_heads, txt, &mut params)?;
        let input = Tensor::cat(&[&dx_txt, &dx_img], 1)?;
        Ok(BlockGrads { input, params })
    }

    /// A stream's backward through `qkv`, its q/k norms, the first modulated norm and the modulation: the
    /// stream input's gradient.
    fn stream_head_backward(
        &self,
        text: bool,
        st: &StreamTape,
        [dq, dk, dv]: [Tensor; 3],
        tail: TailGrads,
        params: &mut Vec<ParamGrad>,
    ) -> Result<Tensor> {
        let (attn, modulation) = if text {
            (&self.txt_attn, &self.txt_mod)
        } else {
            (&self.img_attn, &self.img_mod)
        };
        let d_qkv = qkv_backward(&st.heads, &attn.norm, [&dq, &dk, &dv])?;
        let (dh1, p) = attn
            .qkv
            .backward_with(&st.h1, &st.qkv, &d_qkv, InputGrad::New)?;
        params.extend(p);
        let dh1 = dh1.ok_or_else(|| missing("qkv"))?;
        let m1: &ModulationOut = &st.m.mods[0];
        let (dx_norm, d_shift1, d_scale1) = norm_modulate_backward(&st.x, &st.n1, m1, &dh1)?;
        let first = ModGrad {
            shift: d_shift1,
            scale: d_scale1,
            gate: tail.d_gate1,
        };
        modulation_backward(&modulation.lin, &st.m, &[first, tail.second], params)?;
        tail.dx1 + dx_norm.to_dtype(st.x.dtype())?
    }
}
