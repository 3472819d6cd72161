//! Hand-written backward of an [`Ltx2Block`]'s video stream: a forward without an autograd graph that records
//! its tape, and the backward written op by op (gated residuals, the modulated RMSNorms, the GELU-tanh
//! feed-forward, each attention's output projection, LTX-2.3's head gates, the attention from its saved
//! log-sum-exp with the text padding masked, RoPE, the q / k RMSNorms over the width, the q / k / v linears
//! through the frozen base plus LoRA gradients). The numerics follow the tracked forward step by step, so the
//! gradients equal candle's autograd through it. The AdaLN rows and the text context are constants here: the
//! blocks' LoRAs are the only trainable tensors.

use candle_core::{Result, Tensor};

use super::{
    ada_norm, gate_heads, gated, head_gates, head_sums, Attention, BlockInputs, Ltx2Block,
    Modulation,
};
use crate::ltx2::rope::RopeTable;
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{attention_forward, AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::norm::{rms_norm, rms_norm_backward};
use framesmith_nn::ops::{
    gate_backward, gelu_tanh, gelu_tanh_backward, modulate_backward, modulate_to,
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
    /// The keys' and values' input of a cross-attention (a constant: no gradient is taken for it).
    context: Option<Tensor>,
    qkv: [LinearTape; 3],
    /// q and k [b, l, dim] before their RMSNorms.
    raw_qk: [Tensor; 2],
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
    rope: Option<&'a RopeTable>,
    lens: Option<&'a [usize]>,
    kept: Option<&'a KeptAttention>,
}

fn three<T>(v: Vec<T>) -> Result<[T; 3]> {
    <[T; 3]>::try_from(v)
        .map_err(|_| candle_core::Error::Msg("q, k, v: three outputs expected".into()))
}

fn attn_forward(attn: &Attention, x: &Tensor, call: AttnCall) -> Result<(Tensor, AttnTape)> {
    let x = x.detach();
    let [(q, tq), (k, tk), (v, tv)] = match call.context {
        None => three(Linear::forward_untracked_shared(
            &[&attn.to_q, &attn.to_k, &attn.to_v],
            &x,
        )?)?,
        Some(c) => {
            let q = attn.to_q.forward_untracked(&x)?;
            let mut kv =
                Linear::forward_untracked_shared(&[&attn.to_k, &attn.to_v], c)?.into_iter();
            match (kv.next(), kv.next()) {
                (Some(k), Some(v)) => [q, k, v],
                _ => candle_core::bail!("k, v: two outputs expected"),
            }
        }
    };
    let qh = attn.split(&rms_norm(&q, Some(&attn.q_norm), attn.eps)?)?;
    let kh = attn.split(&rms_norm(&k, Some(&attn.k_norm), attn.eps)?)?;
    let vh = attn.split(&v)?;
    let (qh, kh) = match call.rope {
        Some(rope) => (rope.apply(&qh)?, rope.apply(&kh)?),
        None => (qh, kh),
    };
    let attention = match call.kept {
        Some(kept) => kept.tape([&qh, &kh, &vh], call.lens)?,
        None => attention_forward(&qh, &kh, &vh, call.lens)?,
    };
    let mut o = attention.out().clone();
    let gate = match &attn.to_gate_logits {
        Some(lin) => {
            let (logits, tape) = lin.forward_untracked(&x)?;
            let g = head_gates(&logits)?;
            o = gate_heads(&o, &g)?;
            Some((tape, g))
        }
        None => None,
    };
    let out_in = o.flatten_from(2)?;
    let (y, out) = attn.to_out.forward_untracked(&out_in)?;
    let tape = AttnTape {
        x,
        context: call.context.map(Tensor::detach),
        qkv: [tq, tk, tv],
        raw_qk: [q, k],
        attention,
        gate,
        out_in,
        out,
    };
    Ok((y, tape))
}

/// The gradient of the query input for the output gradient `dy`; the LoRA gradients go to `params`.
fn attn_backward(
    attn: &Attention,
    t: &AttnTape,
    rope: Option<&RopeTable>,
    dy: &Tensor,
    params: &mut Vec<ParamGrad>,
) -> Result<Tensor> {
    let (d_in, p) = attn.to_out.backward(&t.out_in, &t.out, dy, true)?;
    params.extend(p);
    let d_o = d_in
        .ok_or_else(|| missing("to_out"))?
        .reshape(t.attention.out().shape())?;
    let mut dx_gate = None;
    let d_att = match (&attn.to_gate_logits, &t.gate) {
        (Some(lin), Some((tape, g))) => {
            // g = 2σ(z): dg/dz = 2σ(1 − σ) = g · (1 − g/2).
            let dg = head_sums(&(&d_o * t.attention.out())?)?;
            let dz = ((dg * g)? * (1.0 - (g * 0.5)?)?)?;
            let (dx, p) = lin.backward(&t.x, tape, &dz, true)?;
            params.extend(p);
            dx_gate = dx;
            gate_heads(&d_o, g)?
        }
        _ => d_o,
    };
    let (dq, dk, dv) = t.attention.backward(&d_att)?;
    let (dq, dk) = match rope {
        Some(rope) => (rope.backward(&dq)?, rope.backward(&dk)?),
        None => (dq, dk),
    };
    let [q, k] = &t.raw_qk;
    let dq = rms_norm_backward(q, Some(&attn.q_norm), &dq.flatten_from(2)?, attn.eps)?;
    let dk = rms_norm_backward(k, Some(&attn.k_norm), &dk.flatten_from(2)?, attn.eps)?;
    let dv = dv.flatten_from(2)?;
    let [tq, tk, tv] = &t.qkv;
    let dx = match &t.context {
        None => {
            let (dx, p) = Linear::backward_shared(
                &[&attn.to_q, &attn.to_k, &attn.to_v],
                &t.x,
                &[tq, tk, tv],
                &[dq, dk, dv],
                InputGrad::New,
            )?;
            params.extend(p);
            dx
        }
        Some(c) => {
            let (dx, p) = attn.to_q.backward(&t.x, tq, &dq, true)?;
            params.extend(p);
            let (_, p) = Linear::backward_shared(
                &[&attn.to_k, &attn.to_v],
                c,
                &[tk, tv],
                &[dk, dv],
                InputGrad::Skip,
            )?;
            params.extend(p);
            dx
        }
    };
    let dx = dx.ok_or_else(|| missing("q, k, v"))?;
    match dx_gate {
        Some(g) => dx + g,
        None => Ok(dx),
    }
}

/// Everything [`Ltx2Block::backward`] needs.
pub struct Ltx2Tape {
    m: Modulation,
    rope: RopeTable,
    /// The block input and the residual after each attention.
    x: [Tensor; 3],
    attn1: AttnTape,
    attn2: AttnTape,
    /// The feed-forward's input, its first linear's output (before the GELU), the GELU's output.
    ff: [Tensor; 3],
    /// The feed-forward linears' tapes; `net.2`'s is empty after a recompute, which stops before `net.2` (its
    /// output is not needed; the backward recomputes its LoRA activation).
    ff_tapes: [LinearTape; 2],
}

impl Ltx2Tape {
    /// The self-attention's output and LSE, to keep for a recompute.
    pub fn kept(&self) -> KeptAttention {
        self.attn1.attention.kept()
    }
}

/// The input gradient of `rms_norm(x) · (1 + scale) + shift`.
fn ada_norm_backward(xs: &Tensor, scale: &Tensor, dy: &Tensor, eps: f64) -> Result<Tensor> {
    rms_norm_backward(xs, None, &modulate_backward(dy, scale, xs.dtype())?, eps)
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
    /// not needed); `kept`: the self-attention of an earlier pass on the same input (not run again).
    pub fn recompute(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptAttention>,
    ) -> Result<Ltx2Tape> {
        Ok(self.run(xs, inputs, kept, false)?.1)
    }

    fn run(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptAttention>,
        with_out: bool,
    ) -> Result<(Option<Tensor>, Ltx2Tape)> {
        let x0 = xs.detach();
        let m = self.modulation(inputs)?;
        let eps = self.eps;
        let h = ada_norm(&x0, &m.rows[1], &m.rows[0], eps)?;
        let call = AttnCall {
            context: None,
            rope: Some(&inputs.rope),
            lens: None,
            kept,
        };
        let (y, attn1) = attn_forward(&self.attn1, &h, call)?;
        let x1 = gated(&x0, &y, &m.rows[2])?;
        let normed = rms_norm(&x1, None, eps)?;
        let lens = inputs.context_lens.as_deref();
        let (x2, attn2) = match &m.context {
            Some([shift_kv, scale_kv]) => {
                let q_in = modulate_to(&normed, &m.rows[7], &m.rows[6], normed.dtype())?;
                let ctx =
                    modulate_to(&inputs.context.detach(), scale_kv, shift_kv, normed.dtype())?;
                let call = AttnCall {
                    context: Some(&ctx),
                    rope: None,
                    lens,
                    kept: None,
                };
                let (y, tape) = attn_forward(&self.attn2, &q_in, call)?;
                (gated(&x1, &y, &m.rows[8])?, tape)
            }
            None => {
                let ctx = inputs.context.detach();
                let call = AttnCall {
                    context: Some(&ctx),
                    rope: None,
                    lens,
                    kept: None,
                };
                let (y, tape) = attn_forward(&self.attn2, &normed, call)?;
                ((&x1 + y)?, tape)
            }
        };
        let h3 = ada_norm(&x2, &m.rows[4], &m.rows[3], eps)?;
        let (f1, t1) = self.ff.proj_in.forward_untracked(&h3)?;
        let a = gelu_tanh(&f1)?;
        let (out, t2) = if with_out {
            let (y3, t2) = self.ff.proj_out.forward_untracked(&a)?;
            (Some(gated(&x2, &y3, &m.rows[5])?), t2)
        } else {
            (None, LinearTape::default())
        };
        let tape = Ltx2Tape {
            m,
            rope: inputs.rope.detach(),
            x: [x0, x1, x2],
            attn1,
            attn2,
            ff: [h3, f1, a],
            ff_tapes: [t1, t2],
        };
        Ok((out, tape))
    }

    /// The block's backward for the output gradient `grad` [b, tokens, dim].
    pub fn backward(&self, tape: Ltx2Tape, grad: &Tensor) -> Result<BlockGrads> {
        let (m, eps) = (&tape.m, self.eps);
        let [x0, x1, x2] = &tape.x;
        let mut params = Vec::new();
        // Feed-forward.
        let [h3, f1, a] = &tape.ff;
        let [t1, t2] = &tape.ff_tapes;
        let dy3 = gate_backward(grad, &m.rows[5], f1.dtype())?;
        let (da, p) = self.ff.proj_out.backward(a, t2, &dy3, true)?;
        params.extend(p);
        let df1 = gelu_tanh_backward(f1, &da.ok_or_else(|| missing("net.2"))?)?;
        let (dh3, p) = self.ff.proj_in.backward(h3, t1, &df1, true)?;
        params.extend(p);
        let dh3 = dh3.ok_or_else(|| missing("net.0.proj"))?;
        let dx2 = (grad + ada_norm_backward(x2, &m.rows[4], &dh3, eps)?)?;
        // Text cross-attention.
        let dnormed = match &m.context {
            Some(_) => {
                let dy2 = gate_backward(&dx2, &m.rows[8], x1.dtype())?;
                let dq_in = attn_backward(&self.attn2, &tape.attn2, None, &dy2, &mut params)?;
                modulate_backward(&dq_in, &m.rows[7], x1.dtype())?
            }
            None => attn_backward(&self.attn2, &tape.attn2, None, &dx2, &mut params)?,
        };
        let dx1 = (&dx2 + rms_norm_backward(x1, None, &dnormed, eps)?)?;
        // Self-attention.
        let dy1 = gate_backward(&dx1, &m.rows[2], x0.dtype())?;
        let dh = attn_backward(
            &self.attn1,
            &tape.attn1,
            Some(&tape.rope),
            &dy1,
            &mut params,
        )?;
        let input = (&dx1 + ada_norm_backward(x0, &m.rows[1], &dh, eps)?)?;
        Ok(BlockGrads { input, params })
    }
}
