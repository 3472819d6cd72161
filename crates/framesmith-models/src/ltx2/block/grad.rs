//! Hand-written backward of an [`Ltx2Block`] (the video stream, and in a joint pass the audio stream and the two
//! audio-video cross-attentions): a forward without an autograd graph that records its tape, and the backward
//! written op by op (gated residuals, the modulated RMSNorms, the GELU-tanh
//! feed-forward, each attention's output projection, LTX-2.3's head gates, the attention from its saved
//! log-sum-exp with the text padding masked, RoPE, the q / k RMSNorms over the width, the q / k / v linears
//! through the frozen base plus LoRA gradients; the audio-video cross-attentions' keys and values pass their
//! gradient on to the other stream). The numerics follow the tracked forward step by step, so the gradients
//! equal candle's autograd through it. The AdaLN rows and the text contexts are constants here: the blocks'
//! LoRAs are the only trainable tensors.

use candle_core::{Result, Tensor};

use super::{
    ada_norm, gated, head_gates, unpack_joint, Attention, AudioInputs, AvModulation, BlockInputs,
    Ltx2Block, Modulation, Ropes, StreamCall, StreamRef,
};
use crate::ltx2::rope::RopeTable;
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{attention_forward, AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::norm::rms_norm_backward;
use framesmith_nn::offload::Stashable;
use framesmith_nn::ops::{
    gate_backward, gelu_tanh, gelu_tanh_backward, head_gate, head_gate_backward, modulate_backward,
    modulate_to, residual_layer_norm, rms_norm_backward_add, sigmoid_gates_backward, NormAfter,
};

fn missing(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "LTX-2 block backward: no input gradient for {what}"
    ))
}

/// One attention's intermediates.
struct AttnTape {
    /// The query input (and the keys' and values' for the self-attention).
    x: Tensor,
    /// The keys' and values' input of a cross-attention.
    context: Option<Tensor>,
    /// Whether the context's gradient is wanted (the audio-video cross-attentions; not for the text).
    context_grad: bool,
    qkv: [LinearTape; 3],
    /// q and k [b, l, dim] before their RMSNorms.
    raw_qk: [Tensor; 2],
    /// v [b, l, dim] before the split into heads.
    v: Tensor,
    attention: AttentionTape,
    /// The gate linear's tape and the gates [b, l, heads] (LTX-2.3).
    gate: Option<(LinearTape, Tensor)>,
    /// The output projection's input and tape.
    out_in: Tensor,
    out: LinearTape,
}

/// What an attention's forward reads besides the module and its query input.
struct AttnCall<'a> {
    context: Option<&'a Tensor>,
    rope: Option<Ropes<'a>>,
    lens: Option<&'a [usize]>,
    kept: Option<&'a KeptAttention>,
    /// A cross-attention's keys (before their RMSNorm) and values from an earlier pass on the same context: not
    /// projected again.
    kv: Option<&'a [Tensor; 2]>,
    context_grad: bool,
}

fn three<T>(v: Vec<T>) -> Result<[T; 3]> {
    <[T; 3]>::try_from(v)
        .map_err(|_| candle_core::Error::Msg("q, k, v: three outputs expected".into()))
}

fn attn_forward(attn: &Attention, x: &Tensor, call: AttnCall) -> Result<(Tensor, AttnTape)> {
    let x = x.detach();
    let [(q, tq), (k, tk), (v, tv)] = match (call.context, call.kv) {
        (None, _) => three(Linear::forward_untracked_shared(
            &[&attn.to_q, &attn.to_k, &attn.to_v],
            &x,
        )?)?,
        // The tapes of kept outputs: the backward recomputes the low-rank activations (a [text, rank] product).
        (Some(_), Some([k, v])) => [
            attn.to_q.forward_untracked(&x)?,
            (k.clone(), LinearTape::kept(k)),
            (v.clone(), LinearTape::kept(v)),
        ],
        (Some(c), None) => {
            let q = attn.to_q.forward_untracked(&x)?;
            let mut kv =
                Linear::forward_untracked_shared(&[&attn.to_k, &attn.to_v], c)?.into_iter();
            match (kv.next(), kv.next()) {
                (Some(k), Some(v)) => [q, k, v],
                _ => candle_core::bail!("k, v: two outputs expected"),
            }
        }
    };
    let (qh, kh) = attn.normed_qk(&q, &k, call.rope)?;
    let vh = attn.split(&v)?;
    let attention = match call.kept {
        Some(kept) => kept.tape([&qh, &kh, &vh], call.lens)?,
        None => attention_forward(&qh, &kh, &vh, call.lens)?,
    };
    let mut o = attention.out().clone();
    let gate = match &attn.to_gate_logits {
        Some(lin) => {
            let (logits, tape) = lin.forward_untracked(&x)?;
            let g = head_gates(&logits)?;
            o = head_gate(&o, &g)?;
            Some((tape, g))
        }
        None => None,
    };
    let out_in = o.flatten_from(2)?;
    let (y, out) = attn.to_out.forward_untracked(&out_in)?;
    let tape = AttnTape {
        x,
        context: call.context.map(Tensor::detach),
        context_grad: call.context_grad,
        qkv: [tq, tk, tv],
        raw_qk: [q, k],
        v,
        attention,
        gate,
        out_in,
        out,
    };
    Ok((y, tape))
}

/// The gradients of the query input and (where wanted) of the context for the output gradient `dy`; the LoRA
/// gradients go to `params`.
fn attn_backward(
    attn: &Attention,
    t: &AttnTape,
    rope: Option<Ropes>,
    dy: &Tensor,
    params: &mut Vec<ParamGrad>,
) -> Result<(Tensor, Option<Tensor>)> {
    let (d_in, p) = attn.to_out.backward(&t.out_in, &t.out, dy, true)?;
    params.extend(p);
    let d_o = d_in
        .ok_or_else(|| missing("to_out"))?
        .reshape(t.attention.out().shape())?;
    let mut dx_gate = None;
    let d_att = match (&attn.to_gate_logits, &t.gate) {
        (Some(lin), Some((tape, g))) => {
            let (d_att, dg) = head_gate_backward(&d_o, t.attention.out(), g)?;
            // g = 2σ(z): dg/dz = 2σ(1 − σ) = g · (1 − g/2).
            let dz = sigmoid_gates_backward(&dg, g)?;
            let (dx, p) = lin.backward(&t.x, tape, &dz, true)?;
            params.extend(p);
            dx_gate = dx;
            d_att
        }
        _ => d_o,
    };
    let (dq, dk, dv) = t.attention.backward(&d_att)?;
    let [q, k] = &t.raw_qk;
    let eps = attn.eps;
    let (dq, dk) = match rope {
        Some((rq, rk)) => (
            rq.norm_backward(q, &attn.q_norm, &dq, eps)?,
            rk.norm_backward(k, &attn.k_norm, &dk, eps)?,
        ),
        None => (
            rms_norm_backward(q, Some(&attn.q_norm), &dq.flatten_from(2)?, eps)?,
            rms_norm_backward(k, Some(&attn.k_norm), &dk.flatten_from(2)?, eps)?,
        ),
    };
    let dv = dv.flatten_from(2)?;
    let [tq, tk, tv] = &t.qkv;
    // The gates' share of the input gradient is the sum the q (k, v) products accumulate onto.
    let input = match dx_gate {
        Some(g) => InputGrad::Add(g),
        None => InputGrad::New,
    };
    let (dx, dcontext) = match &t.context {
        None => {
            let (dx, p) = Linear::backward_shared(
                &[&attn.to_q, &attn.to_k, &attn.to_v],
                &t.x,
                &[tq, tk, tv],
                &[dq, dk, dv],
                input,
            )?;
            params.extend(p);
            (dx, None)
        }
        Some(c) => {
            let (dx, p) = attn.to_q.backward_with(&t.x, tq, &dq, input)?;
            params.extend(p);
            let wanted = if t.context_grad {
                InputGrad::New
            } else {
                InputGrad::Skip
            };
            let (dc, p) = Linear::backward_shared(
                &[&attn.to_k, &attn.to_v],
                c,
                &[tk, tv],
                &[dk, dv],
                wanted,
            )?;
            params.extend(p);
            if t.context_grad && dc.is_none() {
                return Err(missing("k, v"));
            }
            (dx, dc)
        }
    };
    Ok((dx.ok_or_else(|| missing("q, k, v"))?, dcontext))
}

/// A stream's self-attention and text cross-attention: their input, the residual after the self-attention and
/// after the cross-attention, and the attentions' tapes.
struct AttnHalf {
    x: [Tensor; 3],
    attn1: AttnTape,
    attn2: AttnTape,
}

/// A stream's feed-forward: its residual input, the modulated input, its first linear's output (before the GELU),
/// and the linears' tapes (`net.2`'s is empty after a recompute, which stops before `net.2`: its output is not
/// needed; the backward recomputes the GELU and the LoRA activation where `net.2` has an adapter).
struct FfHalf {
    x: Tensor,
    ff: [Tensor; 2],
    tapes: [LinearTape; 2],
}

/// One stream's tape.
struct StreamTape {
    m: Modulation,
    rope: RopeTable,
    attn: AttnHalf,
    ff: FfHalf,
}

/// A joint pass's audio stream and audio-video cross-attentions.
struct JointTape {
    audio: StreamTape,
    av: AvModulation,
    a2v: AttnTape,
    v2a: AttnTape,
    /// The cross-attentions' RoPE tables of the video and the audio tokens.
    cross_ropes: [RopeTable; 2],
}

/// Everything [`Ltx2Block::backward`] needs.
pub struct Ltx2Tape {
    video: StreamTape,
    joint: Option<JointTape>,
}

impl Ltx2Tape {
    /// What the block keeps for its recompute: the video text keys and values, and with `attention` the video
    /// self-attention's output and LSE.
    pub fn kept(&self, attention: bool) -> Ltx2Kept {
        let text = &self.video.attn.attn2;
        Ltx2Kept {
            text: [text.raw_qk[1].clone(), text.v.clone()],
            attention: attention.then(|| self.video.attn.attn1.attention.kept()),
        }
    }
}

/// What an LTX-2 block keeps from its first forward for the recompute: the video text cross-attention's keys
/// (before their RMSNorm) and values under every checkpointing that recomputes (a short context, 1,024 tokens a
/// sample: the recompute then projects the queries only), and with selective checkpointing the video
/// self-attention's output and LSE.
pub struct Ltx2Kept {
    text: [Tensor; 2],
    attention: Option<KeptAttention>,
}

impl Ltx2Kept {
    /// The kept self-attention (selective checkpointing).
    pub fn attention(&self) -> Option<&KeptAttention> {
        self.attention.as_ref()
    }
}

impl Stashable for Ltx2Kept {
    fn into_tensors(self) -> Vec<Tensor> {
        let mut out = self.text.to_vec();
        if let Some(a) = self.attention {
            out.extend(a.into_tensors());
        }
        out
    }

    fn from_tensors(mut tensors: Vec<Tensor>) -> Result<Self> {
        if tensors.len() != 2 && tensors.len() != 4 {
            candle_core::bail!(
                "an LTX-2 block keeps its text keys and values and maybe an attention, not {} tensors",
                tensors.len()
            );
        }
        let rest = tensors.split_off(2);
        let attention = if rest.is_empty() {
            None
        } else {
            Some(KeptAttention::from_tensors(rest)?)
        };
        let text = <[Tensor; 2]>::try_from(tensors)
            .map_err(|_| candle_core::Error::Msg("text keys and values expected".into()))?;
        Ok(Self { text, attention })
    }
}

/// A stream's self-attention and text cross-attention on `x0` without a graph, with their tape (reusing what
/// `kept` holds from an earlier pass); with `with_ff` (the feed-forward follows directly: no audio-video
/// cross-attentions between), also the feed-forward's modulated input, formed in the pass that writes the
/// residual. Each residual update and the RMSNorm that reads it are one pass on CUDA.
fn attn_half(
    s: StreamRef,
    x0: &Tensor,
    m: &Modulation,
    call: StreamCall,
    (kept, eps, with_ff): (Option<&Ltx2Kept>, f64, bool),
) -> Result<(AttnHalf, Option<Tensor>)> {
    let x0 = x0.detach();
    let dtype = x0.dtype();
    let h = ada_norm(&x0, &m.rows[1], &m.rows[0], eps)?;
    let self_call = AttnCall {
        context: None,
        rope: Some((call.rope, call.rope)),
        lens: None,
        kept: kept.and_then(Ltx2Kept::attention),
        kv: None,
        context_grad: false,
    };
    let (y, attn1) = attn_forward(s.attn1, &h, self_call)?;
    // The cross-attention's queries: the residual's RMSNorm, modulated with LTX-2.3's cross-attention AdaLN.
    let query_mod = m.context.as_ref().map(|_| (&m.rows[7], &m.rows[6]));
    let (x1, q_in) = residual_layer_norm(
        &x0,
        &y,
        Some(&m.rows[2]),
        NormAfter::Rms(query_mod),
        eps,
        dtype,
    )?;
    drop(y);
    let ctx = match &m.context {
        Some([shift_kv, scale_kv]) => {
            modulate_to(&call.context.detach(), scale_kv, shift_kv, dtype)?
        }
        None => call.context.detach(),
    };
    let text = AttnCall {
        kv: kept.map(|k| &k.text),
        ..text_call(&ctx, call.lens)
    };
    let (y, attn2) = attn_forward(s.attn2, &q_in, text)?;
    let gate = m.context.as_ref().map(|_| &m.rows[8]);
    let (x2, h3) = if with_ff {
        let ff_mod = NormAfter::Rms(Some((&m.rows[4], &m.rows[3])));
        let (x2, h3) = residual_layer_norm(&x1, &y, gate, ff_mod, eps, dtype)?;
        (x2, Some(h3))
    } else {
        let x2 = match gate {
            Some(g) => gated(&x1, &y, g)?,
            None => (&x1 + y)?,
        };
        (x2, None)
    };
    let half = AttnHalf {
        x: [x0, x1, x2],
        attn1,
        attn2,
    };
    Ok((half, h3))
}

/// A stream's feed-forward on `x` without a graph (`h3` its modulated input when already formed): its output
/// (with `with_out`) and its tape.
fn ff_half(
    s: StreamRef,
    (x, h3): (&Tensor, Option<Tensor>),
    m: &Modulation,
    with_out: bool,
    eps: f64,
) -> Result<(Option<Tensor>, FfHalf)> {
    let h3 = match h3 {
        Some(h3) => h3,
        None => ada_norm(x, &m.rows[4], &m.rows[3], eps)?,
    };
    let (f1, t1) = s.ff.proj_in.forward_untracked(&h3)?;
    let (out, t2) = if with_out {
        let (y3, t2) = s.ff.proj_out.forward_untracked(&gelu_tanh(&f1)?)?;
        (Some(gated(x, &y3, &m.rows[5])?), t2)
    } else {
        (None, LinearTape::default())
    };
    let tape = FfHalf {
        x: x.clone(),
        ff: [h3, f1],
        tapes: [t1, t2],
    };
    Ok((out, tape))
}

/// The gradient of the feed-forward's residual input for the output gradient `grad`.
fn ff_backward(
    s: StreamRef,
    t: &FfHalf,
    m: &Modulation,
    grad: &Tensor,
    (eps, params): (f64, &mut Vec<ParamGrad>),
) -> Result<Tensor> {
    let [h3, f1] = &t.ff;
    let [t1, t2] = &t.tapes;
    let dy3 = gate_backward(grad, &m.rows[5], f1.dtype())?;
    // `net.2`'s input, the GELU's output, for its adapter's gradients; a layer without an adapter reads only its
    // input's shape and dtype (its input gradient is `dy3` through the frozen weight), which `f1` shares.
    let a = match s.ff.proj_out.adapter() {
        Some(_) => gelu_tanh(f1)?,
        None => f1.clone(),
    };
    let (da, p) = s.ff.proj_out.backward(&a, t2, &dy3, true)?;
    drop(a);
    params.extend(p);
    let df1 = gelu_tanh_backward(f1, &da.ok_or_else(|| missing("net.2"))?)?;
    let (dh3, p) = s.ff.proj_in.backward(h3, t1, &df1, true)?;
    params.extend(p);
    let dh3 = dh3.ok_or_else(|| missing("net.0.proj"))?;
    rms_norm_backward_add(&t.x, &dh3, Some(&m.rows[4]), grad, eps)
}

/// The gradient of a stream's input for the gradient `dx2` of its residual after the text cross-attention.
fn attn_half_backward(
    s: StreamRef,
    t: &AttnHalf,
    (m, rope): (&Modulation, &RopeTable),
    dx2: &Tensor,
    (eps, params): (f64, &mut Vec<ParamGrad>),
) -> Result<Tensor> {
    let [x0, x1, _] = &t.x;
    // Text cross-attention (its queries modulated with LTX-2.3's cross-attention AdaLN).
    let dx1 = match &m.context {
        Some(_) => {
            let dy2 = gate_backward(dx2, &m.rows[8], x1.dtype())?;
            let (dq_in, _) = attn_backward(s.attn2, &t.attn2, None, &dy2, params)?;
            rms_norm_backward_add(x1, &dq_in, Some(&m.rows[7]), dx2, eps)?
        }
        None => {
            let (dnormed, _) = attn_backward(s.attn2, &t.attn2, None, dx2, params)?;
            rms_norm_backward_add(x1, &dnormed, None, dx2, eps)?
        }
    };
    // Self-attention.
    let dy1 = gate_backward(&dx1, &m.rows[2], x0.dtype())?;
    let (dh, _) = attn_backward(s.attn1, &t.attn1, Some((rope, rope)), &dy1, params)?;
    rms_norm_backward_add(x0, &dh, Some(&m.rows[1]), &dx1, eps)
}

/// The text cross-attention's call over `context` (a constant) with `lens` valid tokens.
fn text_call<'a>(context: &'a Tensor, lens: Option<&'a [usize]>) -> AttnCall<'a> {
    AttnCall {
        context: Some(context),
        rope: None,
        lens,
        kept: None,
        kv: None,
        context_grad: false,
    }
}

/// The cross-attention call of queries over the other stream's `context`, its gradient wanted.
fn av_call<'a>(context: &'a Tensor, rope: Ropes<'a>) -> AttnCall<'a> {
    AttnCall {
        context: Some(context),
        rope: Some(rope),
        lens: None,
        kept: None,
        kv: None,
        context_grad: true,
    }
}

impl Ltx2Block {
    /// [`Ltx2Block::forward`] without an autograd graph, keeping the tape for [`Self::backward`].
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
    ) -> Result<(Tensor, Ltx2Tape)> {
        match self.run(xs, inputs, None, true)? {
            (Some(out), tape) => Ok((out, tape)),
            (None, _) => candle_core::bail!("LTX-2 block forward: no output"),
        }
    }

    /// The tape of the block on `xs` for [`Self::backward`], stopping before `ff.net.2` (the block's output is
    /// not needed); `kept`: what an earlier pass on the same input kept (not computed again).
    pub fn recompute(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&Ltx2Kept>,
    ) -> Result<Ltx2Tape> {
        Ok(self.run(xs, inputs, kept, false)?.1)
    }

    fn run(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&Ltx2Kept>,
        with_out: bool,
    ) -> Result<(Option<Tensor>, Ltx2Tape)> {
        let eps = self.eps;
        let m = self.modulation(inputs)?;
        let video_call = StreamCall {
            rope: &inputs.rope,
            context: &inputs.context,
            lens: inputs.context_lens.as_deref(),
        };
        let Some((stream, ai)) = self.joint(inputs)? else {
            let (attn, h3) = attn_half(self.video(), xs, &m, video_call, (kept, eps, true))?;
            let (out, ff) = ff_half(self.video(), (&attn.x[2], h3), &m, with_out, eps)?;
            let video = StreamTape {
                m,
                rope: inputs.rope.detach(),
                attn,
                ff,
            };
            return Ok((out, Ltx2Tape { video, joint: None }));
        };
        let (ma, av) = self.audio_modulation(stream, inputs, ai)?;
        let (vx, ax) = ai.unpack(&xs.detach())?;
        let audio_call = StreamCall {
            rope: &ai.rope,
            context: &ai.context,
            lens: inputs.context_lens.as_deref(),
        };
        let (vattn, _) = attn_half(self.video(), &vx, &m, video_call, (kept, eps, false))?;
        let (aattn, _) = attn_half(stream.stream(), &ax, &ma, audio_call, (None, eps, false))?;
        let (v2, a2) = (&vattn.x[2], &aattn.x[2]);
        let (mv, mav) = (&av.video, &av.audio);
        let (vrope, arope) = (ai.video_cross_rope.detach(), ai.audio_cross_rope.detach());
        let vq = ada_norm(v2, &mv[0], &mv[1], eps)?;
        let ak = ada_norm(a2, &mav[0], &mav[1], eps)?;
        let (y, a2v) = attn_forward(&stream.audio_to_video, &vq, av_call(&ak, (&vrope, &arope)))?;
        let aq = ada_norm(a2, &mav[2], &mav[3], eps)?;
        let vk = ada_norm(v2, &mv[2], &mv[3], eps)?;
        let (ya, v2a) = attn_forward(&stream.video_to_audio, &aq, av_call(&vk, (&arope, &vrope)))?;
        let v3 = gated(v2, &y, &mv[4])?;
        let a3 = gated(a2, &ya, &mav[4])?;
        let (vout, vff) = ff_half(self.video(), (&v3, None), &m, with_out, eps)?;
        let (aout, aff) = ff_half(stream.stream(), (&a3, None), &ma, with_out, eps)?;
        let out = match (vout, aout) {
            (Some(v), Some(a)) => Some(AudioInputs::pack(&v, &a)?),
            _ => None,
        };
        let tape = Ltx2Tape {
            video: StreamTape {
                m,
                rope: inputs.rope.detach(),
                attn: vattn,
                ff: vff,
            },
            joint: Some(JointTape {
                audio: StreamTape {
                    m: ma,
                    rope: ai.rope.detach(),
                    attn: aattn,
                    ff: aff,
                },
                av,
                a2v,
                v2a,
                cross_ropes: [vrope, arope],
            }),
        };
        Ok((out, tape))
    }

    /// The block's backward for the output gradient `grad` (shaped as the block's input).
    pub fn backward(&self, tape: Ltx2Tape, grad: &Tensor) -> Result<BlockGrads> {
        let eps = self.eps;
        let mut params = Vec::new();
        let v = &tape.video;
        let Some(joint) = &tape.joint else {
            let dx2 = ff_backward(self.video(), &v.ff, &v.m, grad, (eps, &mut params))?;
            let input = attn_half_backward(
                self.video(),
                &v.attn,
                (&v.m, &v.rope),
                &dx2,
                (eps, &mut params),
            )?;
            return Ok(BlockGrads { input, params });
        };
        let Some(stream) = &self.audio else {
            candle_core::bail!(
                "LTX-2 block backward: a joint tape for a block without its audio stream"
            );
        };
        let a = &joint.audio;
        let shapes = |t: &Tensor| -> Result<(usize, usize)> { Ok((t.dim(1)?, t.dim(2)?)) };
        let (gv, ga) = unpack_joint(grad, shapes(&v.attn.x[0])?, shapes(&a.attn.x[0])?)?;
        let dv3 = ff_backward(self.video(), &v.ff, &v.m, &gv, (eps, &mut params))?;
        let da3 = ff_backward(stream.stream(), &a.ff, &a.m, &ga, (eps, &mut params))?;
        // The audio-video cross-attentions.
        let (mv, ma) = (&joint.av.video, &joint.av.audio);
        let [vrope, arope] = &joint.cross_ropes;
        let (v2, a2) = (&v.attn.x[2], &a.attn.x[2]);
        let dy = gate_backward(&dv3, &mv[4], v2.dtype())?;
        let (dvq, dak) = attn_backward(
            &stream.audio_to_video,
            &joint.a2v,
            Some((vrope, arope)),
            &dy,
            &mut params,
        )?;
        let dy = gate_backward(&da3, &ma[4], a2.dtype())?;
        let (daq, dvk) = attn_backward(
            &stream.video_to_audio,
            &joint.v2a,
            Some((arope, vrope)),
            &dy,
            &mut params,
        )?;
        let (dak, dvk) = (
            dak.ok_or_else(|| missing("audio_to_video_attn k, v"))?,
            dvk.ok_or_else(|| missing("video_to_audio_attn k, v"))?,
        );
        // Both sides of each stream read its residual through one RMSNorm: the modulations' gradients add.
        let dv_mod = (modulate_backward(&dvq, &mv[0], v2.dtype())?
            + modulate_backward(&dvk, &mv[2], v2.dtype())?)?;
        let da_mod = (modulate_backward(&dak, &ma[0], a2.dtype())?
            + modulate_backward(&daq, &ma[2], a2.dtype())?)?;
        let dv2 = rms_norm_backward_add(v2, &dv_mod, None, &dv3, eps)?;
        let da2 = rms_norm_backward_add(a2, &da_mod, None, &da3, eps)?;
        let dv0 = attn_half_backward(
            self.video(),
            &v.attn,
            (&v.m, &v.rope),
            &dv2,
            (eps, &mut params),
        )?;
        let da0 = attn_half_backward(
            stream.stream(),
            &a.attn,
            (&a.m, &a.rope),
            &da2,
            (eps, &mut params),
        )?;
        Ok(BlockGrads {
            input: AudioInputs::pack(&dv0, &da0)?,
            params,
        })
    }
}
