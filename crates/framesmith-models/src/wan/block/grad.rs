//! Hand-written backward of a Wan [`Block`] for the checkpointed step (DESIGN.md §4.3), so no candle autograd
//! runs inside blocks: a forward that builds no graph (LoRA factors used detached) and records the intermediates
//! the backward needs (the "tape"), and a backward written op by op (gated residuals, modulation, LayerNorm with
//! and without affine, q/k RMSNorm, 3D RoPE, attention from its saved log-sum-exp, GELU-tanh, linears through the
//! frozen base plus LoRA gradients). The numerics and dtype casts follow `Block::forward` step by step, so the
//! result equals candle's autograd through it. Element-wise work that is cheap to redo (GELU output, head
//! reshapes) is recomputed rather than kept. Modulation and text context are constants here: the step needs no
//! gradient for them.

mod ops;
#[cfg(test)]
mod tests;

use candle_core::{DType, Result, Tensor};

use super::{split_heads, Block, BlockInputs};
pub use crate::trainable::BlockGrads;
use crate::wan::rope::Rope;
pub use framesmith_nn::attention::KeptBlock;
use framesmith_nn::attention::{attention_forward, AttentionTape};
use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::norm::{rms_norm, rms_norm_backward};
use framesmith_nn::ops::{gated_residual, gelu_tanh, NormAfter};

/// A linear projection followed by the optional full-width RMSNorm (`norm_q`, `norm_k`): what its backward needs.
struct Projection {
    /// The linear's output before the norm and the norm's weight, when there is a norm.
    pre_norm: Option<(Tensor, Tensor)>,
    /// The rotary embedding applied to the heads (self-attention's `q` and `k`), whose gradient the backward
    /// takes.
    rope: Option<Rope>,
    eps: f64,
    tape: LinearTape,
}

/// `lin` on `xs`, the optional RMSNorm, split into heads (`project` of `block.rs`).
fn project(
    lin: &Linear,
    norm: Option<&Tensor>,
    xs: &Tensor,
    heads: usize,
    eps: f64,
) -> Result<(Tensor, Projection)> {
    let (y, tape) = lin.forward_untracked(xs)?;
    normed_heads(y, tape, norm, None, heads, eps)
}

/// [`project`] for several linears on the same input, their LoRAs batched
/// ([`Linear::forward_untracked_shared`]), each output through its optional RMSNorm and rotary embedding.
fn project_shared<const N: usize>(
    lins: [&Linear; N],
    norms: [(Option<&Tensor>, Option<&Rope>); N],
    xs: &Tensor,
    heads: usize,
    eps: f64,
) -> Result<Vec<(Tensor, Projection)>> {
    Linear::forward_untracked_shared(&lins, xs)?
        .into_iter()
        .zip(norms)
        .map(|((y, tape), (norm, rope))| normed_heads(y, tape, norm, rope, heads, eps))
        .collect()
}

/// A projection's output `y` through the optional RMSNorm, split into heads, then rotated by `rope` (RMSNorm
/// and rotation in one kernel on CUDA).
fn normed_heads(
    y: Tensor,
    tape: LinearTape,
    norm: Option<&Tensor>,
    rope: Option<&Rope>,
    heads: usize,
    eps: f64,
) -> Result<(Tensor, Projection)> {
    let out = match (norm, rope) {
        (Some(w), Some(r)) => framesmith_nn::ops::rms_norm_rope(&y, w, eps, heads, &r.cos, &r.sin)?,
        (Some(w), None) => split_heads(&rms_norm(&y, Some(w), eps)?, heads)?,
        (None, Some(r)) => r.apply(&split_heads(&y, heads)?)?,
        (None, None) => split_heads(&y, heads)?,
    };
    let proj = Projection {
        pre_norm: norm.map(|w| (y, w.clone())),
        rope: rope.cloned(),
        eps,
        tape,
    };
    Ok((out, proj))
}

/// The gradient of a projection's linear output from its heads' gradient (back through the rotation and the
/// RMSNorm, where there are any).
fn linear_grad(proj: &Projection, d_heads: &Tensor) -> Result<Tensor> {
    match (&proj.pre_norm, &proj.rope) {
        (Some((pre, w)), Some(r)) => {
            framesmith_nn::ops::rms_norm_rope_backward(pre, w, d_heads, proj.eps, &r.cos, &r.sin)
        }
        (Some((pre, w)), None) => {
            rms_norm_backward(pre, Some(w), &d_heads.flatten_from(2)?, proj.eps)
        }
        (None, Some(r)) => ops::rope_backward(r, d_heads)?.flatten_from(2),
        (None, None) => d_heads.flatten_from(2),
    }
}

/// Backward of [`project`] for the heads' gradient: the input gradient (as `input` says) and the LoRA gradients,
/// appended to `params`.
fn project_backward(
    lin: &Linear,
    xs: &Tensor,
    proj: &Projection,
    d_heads: &Tensor,
    input: InputGrad,
    params: &mut Vec<ParamGrad>,
) -> Result<Option<Tensor>> {
    let (dx, p) = lin.backward_with(xs, &proj.tape, &linear_grad(proj, d_heads)?, input)?;
    params.extend(p);
    Ok(dx)
}

/// Backward of [`project_shared`]: the input gradient summed over the projections (as `input` says) and their
/// LoRA gradients, appended to `params`. Each heads' gradient is dropped once its linear's gradient is formed.
fn project_backward_shared<const N: usize>(
    lins: [&Linear; N],
    xs: &Tensor,
    projs: [&Projection; N],
    d_heads: [Tensor; N],
    input: InputGrad,
    params: &mut Vec<ParamGrad>,
) -> Result<Option<Tensor>> {
    let ds = projs
        .iter()
        .zip(d_heads)
        .map(|(proj, d)| linear_grad(proj, &d))
        .collect::<Result<Vec<_>>>()?;
    let tapes = projs.map(|p| &p.tape);
    let (dx, p) = Linear::backward_shared(&lins, xs, &tapes, &ds, input)?;
    params.extend(p);
    Ok(dx)
}

fn missing(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("block backward: no input gradient for {what}"))
}

struct SelfTape {
    /// Block input (residual dtype).
    x: Tensor,
    /// Modulated norm1 output (the q/k/v input), compute dtype.
    h1: Tensor,
    q: Projection,
    k: Projection,
    v: Projection,
    attn: AttentionTape,
    o: LinearTape,
}

struct ImageTape {
    k: Projection,
    v: Projection,
    attn: AttentionTape,
}

struct CrossTape {
    /// Residual after self-attention (the norm3 input).
    x1: Tensor,
    /// norm3 output (the query input), compute dtype.
    n3: Tensor,
    q: Projection,
    k: Projection,
    v: Projection,
    text: AttentionTape,
    img: Option<ImageTape>,
    /// Input of `cross_attn.o` (text plus image attention, heads flattened).
    ac: Tensor,
    o: LinearTape,
}

struct FfnTape {
    /// Residual after cross-attention (the norm2 input).
    x2: Tensor,
    /// Modulated norm2 output (the `ffn.0` input), compute dtype.
    h2: Tensor,
    /// `ffn.0` output (GELU input).
    f0: Tensor,
    ffn0: LinearTape,
    /// `None` when the forward stopped before `ffn.2` (a recompute): the backward recomputes its LoRA activation.
    ffn2: Option<LinearTape>,
}

/// The block's shared inputs as the backward uses them.
struct Common {
    /// The six modulation vectors (shift, scale, gate of self-attention, then of the FFN), f32 [b, lt, dim].
    chunks: Vec<Tensor>,
    context: Tensor,
    context_img: Option<Tensor>,
    compute: DType,
}

/// Everything [`Block::backward`] needs from the forward (one block's activations), in three parts the backward
/// frees one after the other.
pub struct BlockTape {
    common: Common,
    sa: SelfTape,
    ca: CrossTape,
    ffn: FfnTape,
    /// `self_attn.o`'s output, when the forward was asked to keep it.
    projection: Option<Tensor>,
}

impl BlockTape {
    /// What [`Block::recompute`] may reuse: the self-attention output and LSE, and `self_attn.o`'s output (the
    /// one kept output, `[b, L, dim]` in the compute dtype) when the forward kept it.
    pub fn kept(&self) -> KeptBlock {
        KeptBlock::new(
            self.sa.attn.kept(),
            self.projection.iter().cloned().collect(),
        )
    }
}

impl Block {
    /// [`Block::forward`] without building an autograd graph (the first pass of the checkpointed step); also
    /// returns what selective checkpointing keeps: the self-attention output and LSE, and `self_attn.o`'s output
    /// with `keep_projection`.
    pub fn forward_untracked(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        keep_projection: bool,
    ) -> Result<(Tensor, KeptBlock)> {
        let (tape, out) = self.run(xs, inputs, None, true, keep_projection)?;
        let out = out.ok_or_else(|| candle_core::Error::Msg("block forward: no output".into()))?;
        Ok((out, tape.kept()))
    }

    /// [`Block::forward_untracked`] keeping the whole tape for [`Block::backward`]: no checkpointing, the
    /// backward needs no recompute (costs every intermediate of the block until its backward has run).
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
    ) -> Result<(Tensor, BlockTape)> {
        let (tape, out) = self.run(xs, inputs, None, true, false)?;
        let out = out.ok_or_else(|| candle_core::Error::Msg("block forward: no output".into()))?;
        Ok((out, tape))
    }

    /// Recomputes the block from its input and records the tape for [`Block::backward`]; with `kept` (from this
    /// block's [`Block::forward_untracked`] on the same input) the self-attention kernel is skipped, and the
    /// `self_attn.o` product where its output was kept. Stops before `ffn.2`, whose output the backward does not
    /// need.
    pub fn recompute(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<BlockTape> {
        Ok(self.run(xs, inputs, kept, false, false)?.0)
    }

    fn run(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptBlock>,
        with_out: bool,
        keep_projection: bool,
    ) -> Result<(BlockTape, Option<Tensor>)> {
        let compute = inputs.context.dtype();
        let x = xs.detach();
        let residual = x.dtype();
        let e = self
            .modulation
            .unsqueeze(0)?
            .broadcast_add(&inputs.e0.detach())?;
        let chunks = (0..6)
            .map(|i| e.narrow(2, i, 1)?.squeeze(2)?.contiguous())
            .collect::<Result<Vec<_>>>()?;

        let (y1, sa) = self.self_attention_tape(x, &chunks, inputs, kept)?;
        let projection = keep_projection.then(|| y1.clone());
        // Each residual update and the LayerNorm that reads it are one pass.
        let (x1, n3) = match &self.norm3 {
            Some((w, b)) => ops::residual_layer_norm(
                &sa.x,
                &y1,
                Some(&chunks[2]),
                NormAfter::Affine(Some(w), Some(b)),
                self.eps,
                compute,
            )?,
            None => {
                let x1 = gated_residual(&sa.x, &y1, &chunks[2], residual)?;
                let n3 = ops::cast(&x1, compute)?;
                (x1, n3)
            }
        };
        drop(y1);
        let (y2, ca) = self.cross_attention_tape(x1, n3, inputs)?;
        let (x2, h2) = ops::residual_layer_norm(
            &ca.x1,
            &y2,
            None,
            NormAfter::Modulated {
                scale: &chunks[4],
                shift: &chunks[3],
            },
            self.eps,
            compute,
        )?;
        drop(y2);

        let (f0, ffn0) = self.ffn0.forward_untracked(&h2)?;
        let (out, ffn2) = if with_out {
            let (y3, t) = self.ffn2.forward_untracked(&gelu_tanh(&f0)?)?;
            (
                Some(gated_residual(&x2, &y3, &chunks[5], residual)?),
                Some(t),
            )
        } else {
            (None, None)
        };
        let common = Common {
            chunks,
            context: inputs.context.detach(),
            context_img: inputs.context_img.as_ref().map(Tensor::detach),
            compute,
        };
        let ffn = FfnTape {
            x2,
            h2,
            f0,
            ffn0,
            ffn2,
        };
        let tape = BlockTape {
            common,
            sa,
            ca,
            ffn,
            projection,
        };
        Ok((tape, out))
    }

    fn self_attention_tape(
        &self,
        x: Tensor,
        chunks: &[Tensor],
        inputs: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<(Tensor, SelfTape)> {
        let sa = &self.self_attn;
        let (heads, eps) = (sa.num_heads, sa.eps);
        let h1 =
            ops::layer_norm_modulate(&x, &chunks[1], &chunks[0], self.eps, inputs.context.dtype())?;
        let mut qkv = project_shared(
            [&sa.q, &sa.k, &sa.v],
            [
                (sa.norm_q.as_ref(), Some(&inputs.rope)),
                (sa.norm_k.as_ref(), Some(&inputs.rope)),
                (None, None),
            ],
            &h1,
            heads,
            eps,
        )?
        .into_iter();
        let mut next = || qkv.next().ok_or_else(|| missing("self_attn.q/k/v"));
        let ((q, qp), (k, kp), (v, vp)) = (next()?, next()?, next()?);
        let lens = Some(inputs.seq_lens.as_slice());
        let attn = match kept {
            Some(kept) => kept.attention().tape([&q, &k, &v], lens)?,
            None => attention_forward(&q, &k, &v, lens)?,
        };
        // A kept output of `o` is the product this recompute would make; its LoRA activation, which the
        // backward needs, is then recomputed there (an empty tape).
        let (y, o) = match kept.and_then(|k| k.outputs().first()) {
            Some(y) => (y.clone(), LinearTape::kept(y)),
            None => sa.o.forward_untracked(&attn.out().flatten_from(2)?)?,
        };
        let tape = SelfTape {
            x,
            h1,
            q: qp,
            k: kp,
            v: vp,
            attn,
            o,
        };
        Ok((y, tape))
    }

    /// The cross-attention on `n3` (the residual `x1` after `norm3`, in the compute dtype).
    fn cross_attention_tape(
        &self,
        x1: Tensor,
        n3: Tensor,
        inputs: &BlockInputs,
    ) -> Result<(Tensor, CrossTape)> {
        let ca = &self.cross_attn;
        let (heads, eps) = (ca.num_heads, ca.eps);
        let context = inputs.context.detach();
        let (q, qp) = project(&ca.q, ca.norm_q.as_ref(), &n3, heads, eps)?;
        let (k, kp) = project(&ca.k, ca.norm_k.as_ref(), &context, heads, eps)?;
        let (v, vp) = project(&ca.v, None, &context, heads, eps)?;
        let text = attention_forward(&q, &k, &v, None)?;
        let mut ac = text.out().flatten_from(2)?;
        let img = match (&ca.k_img, &ca.v_img, inputs.context_img.as_ref()) {
            (Some(k_img), Some(v_img), Some(img)) => {
                let img = img.detach();
                let (k, kp) = project(k_img, ca.norm_k_img.as_ref(), &img, heads, eps)?;
                let (v, vp) = project(v_img, None, &img, heads, eps)?;
                let attn = attention_forward(&q, &k, &v, None)?;
                ac = (ac + attn.out().flatten_from(2)?)?;
                Some(ImageTape { k: kp, v: vp, attn })
            }
            _ => None,
        };
        let (y, o) = ca.o.forward_untracked(&ac)?;
        let tape = CrossTape {
            x1,
            n3,
            q: qp,
            k: kp,
            v: vp,
            text,
            img,
            ac,
            o,
        };
        Ok((y, tape))
    }

    /// Back-propagates `grad_out` (the gradient of the block output) through the block recorded in `tape`:
    /// the input gradient and the LoRA gradients of the block's linears. Each part of the tape is freed as soon
    /// as the backward is past it.
    pub fn backward(&self, tape: BlockTape, grad_out: &Tensor) -> Result<BlockGrads> {
        let BlockTape {
            common,
            sa,
            ca,
            ffn,
            projection: _,
        } = tape;
        let dout = ops::cast(&grad_out.detach(), sa.x.dtype())?;
        let mut params = Vec::new();
        let dx2 = self.ffn_backward(ffn, &common, &dout, &mut params)?;
        drop(dout);
        let dx1 = self.cross_backward(ca, &common, &dx2, &mut params)?;
        drop(dx2);
        let input = self.self_attention_backward(sa, &common, &dx1, &mut params)?;
        Ok(BlockGrads { input, params })
    }

    /// FFN and its gated residual: `dout` → gradient of `x2`.
    fn ffn_backward(
        &self,
        t: FfnTape,
        c: &Common,
        dout: &Tensor,
        params: &mut Vec<ParamGrad>,
    ) -> Result<Tensor> {
        let dy3 = ops::gate_backward(dout, &c.chunks[5], c.compute)?;
        let g = gelu_tanh(&t.f0)?;
        let empty = LinearTape::default();
        let (dg, p) = self
            .ffn2
            .backward(&g, t.ffn2.as_ref().unwrap_or(&empty), &dy3, true)?;
        params.extend(p);
        drop((g, dy3));
        let df0 = ops::gelu_tanh_backward(&t.f0, &dg.ok_or_else(|| missing("ffn.2"))?)?;
        drop(t.f0);
        let (dh2, p) = self.ffn0.backward(&t.h2, &t.ffn0, &df0, true)?;
        params.extend(p);
        drop((df0, t.h2));
        ops::layer_norm_backward_add(
            &t.x2,
            None,
            &dh2.ok_or_else(|| missing("ffn.0"))?,
            Some(&c.chunks[4]),
            dout,
            self.eps,
        )
    }

    /// Cross-attention and its plain residual: gradient of `x2` → gradient of `x1`. The context gets no gradient;
    /// the LoRAs of `k`, `v` (and `k_img`, `v_img`) do.
    fn cross_backward(
        &self,
        t: CrossTape,
        c: &Common,
        dx2: &Tensor,
        params: &mut Vec<ParamGrad>,
    ) -> Result<Tensor> {
        let ca = &self.cross_attn;
        let (dac, p) =
            ca.o.backward(&t.ac, &t.o, &ops::cast(dx2, c.compute)?, true)?;
        params.extend(p);
        let dac = dac
            .ok_or_else(|| missing("cross_attn.o"))?
            .reshape(t.text.out().shape())?;
        let (mut dq, dk, dv) = t.text.backward(&dac)?;
        project_backward(&ca.k, &c.context, &t.k, &dk, InputGrad::Skip, params)?;
        project_backward(&ca.v, &c.context, &t.v, &dv, InputGrad::Skip, params)?;
        if let (Some(img), Some(k_img), Some(v_img), Some(ctx)) =
            (&t.img, &ca.k_img, &ca.v_img, &c.context_img)
        {
            let (dq_img, dk, dv) = img.attn.backward(&dac)?;
            dq = (dq + dq_img)?;
            project_backward(k_img, ctx, &img.k, &dk, InputGrad::Skip, params)?;
            project_backward(v_img, ctx, &img.v, &dv, InputGrad::Skip, params)?;
        }
        drop(dac);
        let dn3 = project_backward(&ca.q, &t.n3, &t.q, &dq, InputGrad::New, params)?
            .ok_or_else(|| missing("cross_attn.q"))?;
        match &self.norm3 {
            Some((w, _)) => ops::layer_norm_backward_add(&t.x1, Some(w), &dn3, None, dx2, self.eps),
            None => dx2 + ops::cast(&dn3, t.x1.dtype())?,
        }
    }

    /// Self-attention and its gated residual: gradient of `x1` → gradient of the block input.
    fn self_attention_backward(
        &self,
        t: SelfTape,
        c: &Common,
        dx1: &Tensor,
        params: &mut Vec<ParamGrad>,
    ) -> Result<Tensor> {
        let sa = &self.self_attn;
        let dy1 = ops::gate_backward(dx1, &c.chunks[2], c.compute)?;
        let a = t.attn.out().flatten_from(2)?;
        let (da, p) = sa.o.backward(&a, &t.o, &dy1, true)?;
        params.extend(p);
        drop((a, dy1));
        let da = da
            .ok_or_else(|| missing("self_attn.o"))?
            .reshape(t.attn.out().shape())?;
        let (dq, dk, dv) = t.attn.backward(&da)?;
        drop((da, t.attn));
        let dh1 = project_backward_shared(
            [&sa.q, &sa.k, &sa.v],
            &t.h1,
            [&t.q, &t.k, &t.v],
            [dq, dk, dv],
            InputGrad::New,
            params,
        )?
        .ok_or_else(|| missing("self_attn.q/k/v"))?;
        ops::layer_norm_backward_add(&t.x, None, &dh1, Some(&c.chunks[1]), dx1, self.eps)
    }
}
