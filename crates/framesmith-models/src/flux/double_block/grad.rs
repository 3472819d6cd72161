//! Hand-written backward of a [`DoubleStreamBlock`]: a forward without a graph that records its tape, and the
//! backward written op by op (gated residuals, modulation, LayerNorm, GELU-tanh MLP, q/k RMSNorm, RoPE, joint
//! attention from its saved log-sum-exp, linears through the frozen base plus LoRA gradients).

use candle_core::{DType, Result, Tensor};

use super::super::block::grad::{
    gated_backward, modulation_backward, modulation_untracked, norm_modulate_backward,
    norm_modulate_untracked, qkv_backward, qkv_untracked, rope_attention_backward,
    rope_attention_untracked, rows, ModGrad, ModTape, QkvTape,
};
use super::super::block::BlockInputs;
use super::super::modulation::ModulationOut;
use super::{DoubleStreamBlock, Mlp};
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::ops::{gated_residual, gelu_tanh, gelu_tanh_backward};

/// One stream's intermediates.
struct StreamTape {
    /// Stream input (residual dtype) and its LayerNorm output.
    x: Tensor,
    n1: Tensor,
    /// Modulated norm (the `qkv` input).
    h1: Tensor,
    qkv: LinearTape,
    heads: QkvTape,
    /// This stream's rows of the attention output (the `proj` input), `proj`'s output.
    attn: Tensor,
    proj: LinearTape,
    y1: Tensor,
    /// Residual after attention, its LayerNorm, the MLP input, `mlp.0`'s output, `mlp.2`'s output.
    x1: Tensor,
    n2: Tensor,
    h2: Tensor,
    f0: Tensor,
    fc0: LinearTape,
    fc2: LinearTape,
    y2: Tensor,
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
    let m = modulation_untracked(modulation, &inputs.vec)?;
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

/// The second half of a stream after the joint attention.
/// `kept`: `proj`'s and `mlp.2`'s outputs from an earlier pass on the same input, which skip those products (their
/// LoRA activations are then recomputed in the backward).
fn stream_tail(
    proj: &Linear,
    mlp: &Mlp,
    head: StreamHead,
    (xs, attn): (&Tensor, Tensor),
    compute: DType,
    kept: Option<[&Tensor; 2]>,
) -> Result<(Tensor, StreamTape)> {
    let residual = xs.dtype();
    let [m1, m2] = [&head.m.mods[0], &head.m.mods[1]];
    let (y1, proj_tape) = match kept {
        Some([y1, _]) => (y1.clone(), LinearTape::default()),
        None => proj.forward_untracked(&attn)?,
    };
    let x1 = gated_residual(xs, &y1, &m1.gate, residual)?;
    let (h2, n2) = norm_modulate_untracked(&x1, m2, compute)?;
    let (f0, fc0) = mlp.fc0.forward_untracked(&h2)?;
    let (y2, fc2) = match kept {
        Some([_, y2]) => (y2.clone(), LinearTape::default()),
        None => mlp.fc2.forward_untracked(&gelu_tanh(&f0)?)?,
    };
    let out = gated_residual(&x1, &y2, &m2.gate, residual)?;
    let tape = StreamTape {
        x: xs.detach(),
        n1: head.n1,
        h1: head.h1,
        qkv: head.qkv,
        heads: head.heads,
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
    mlp: &Mlp,
    t: &StreamTape,
    dout: &Tensor,
    params: &mut Vec<ParamGrad>,
) -> Result<TailGrads> {
    let [m1, m2] = [&t.m.mods[0], &t.m.mods[1]];
    let (dy2, d_gate2) = gated_backward(dout, &t.y2, &m2.gate)?;
    let g = gelu_tanh(&t.f0)?;
    let (dg, p) = mlp.fc2.backward_with(&g, &t.fc2, &dy2, InputGrad::New)?;
    params.extend(p);
    let dg = dg.ok_or_else(|| missing("mlp.2"))?;
    let df0 = gelu_tanh_backward(&t.f0, &dg)?;
    let (dh2, p) = mlp.fc0.backward_with(&t.h2, &t.fc0, &df0, InputGrad::New)?;
    params.extend(p);
    let dh2 = dh2.ok_or_else(|| missing("mlp.0"))?;
    let (dx1_norm, d_shift2, d_scale2) = norm_modulate_backward(&t.x1, &t.n2, m2, &dh2)?;
    let dx1 = (dout + dx1_norm.to_dtype(dout.dtype())?)?;
    let (dy1, d_gate1) = gated_backward(&dx1, &t.y1, &m1.gate)?;
    let (d_attn, p) = proj.backward_with(&t.attn, &t.proj, &dy1, InputGrad::New)?;
    params.extend(p);
    let second = ModGrad {
        shift: d_shift2,
        scale: d_scale2,
        gate: d_gate2,
    };
    Ok(TailGrads {
        d_attn: d_attn.ok_or_else(|| missing("proj"))?,
        dx1,
        second,
        d_gate1,
    })
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
        [&self.img.y1, &self.img.y2, &self.txt.y1, &self.txt.y2]
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
            &self.img_attn.proj,
            &self.img_mlp,
            img_head,
            (&img, img_attn),
            compute,
            kept_out.map(|k| [k[0], k[1]]),
        )?;
        let (txt_out, txt_tape) = stream_tail(
            &self.txt_attn.proj,
            &self.txt_mlp,
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
            &self.img_attn.proj,
            &self.img_mlp,
            &tape.img,
            &d_img,
            &mut params,
        )?;
        let txt = stream_tail_backward(
            &self.txt_attn.proj,
            &self.txt_mlp,
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
        modulation_backward(modulation, &st.m, &[first, tail.second], params)?;
        tail.dx1 + dx_norm.to_dtype(st.x.dtype())?
    }
}
