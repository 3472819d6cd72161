//! Hand-written backward of a [`SingleStreamBlock`]: a forward without a graph that records its tape, and the
//! backward written op by op (gated residual, `linear2` over [attention, GELU-tanh MLP], joint RoPE attention from
//! its saved log-sum-exp, q/k RMSNorm, the fused `linear1`, modulation and LayerNorm).

use candle_core::{Result, Tensor, D};

use super::super::block::grad::{
    qkv_backward, qkv_untracked, rope_attention_backward, rope_attention_untracked, split_last,
    QkvTape,
};
use super::super::block::BlockInputs;
use super::super::rope::Rope;
use super::SingleStreamBlock;
use crate::modulated::{
    gated_backward, modulation_backward, modulation_untracked, norm_modulate_backward,
    norm_modulate_untracked, ModGrad, ModTape,
};
use crate::trainable::BlockGrads;
use framesmith_nn::attention::{AttentionTape, KeptAttention};
use framesmith_nn::linear::{InputGrad, LinearTape};
use framesmith_nn::ops::{gated_residual, gelu_tanh, gelu_tanh_backward, Dense};

/// Everything [`SingleStreamBlock::backward`] needs.
pub struct SingleTape {
    x: Tensor,
    normed: Tensor,
    /// Modulated norm (the `linear1` input).
    x_mod: Tensor,
    linear1: LinearTape,
    heads: QkvTape,
    /// The MLP half of `linear1`'s output (GELU input).
    mlp: Tensor,
    attention: AttentionTape,
    /// `linear2`'s input and output.
    cat: Tensor,
    linear2: LinearTape,
    out: Tensor,
    m: ModTape,
    rope: Rope,
}

impl SingleTape {
    /// The block's attention tape (output, LSE and the q, k, v it ran on).
    pub fn attention(&self) -> &AttentionTape {
        &self.attention
    }

    /// `linear2`'s output (the gated branch), which a recompute may reuse.
    pub fn projection(&self) -> &Tensor {
        &self.out
    }
}

impl SingleStreamBlock {
    /// [`SingleStreamBlock::forward`] without an autograd graph, keeping the tape for [`Self::backward`];
    /// `kept`: the attention of an earlier pass of this block on the same input (not run again); `kept_out`:
    /// that pass's `linear2` output ([`SingleTape::projection`]), which skips the product (its LoRA activation is
    /// then recomputed in the backward).
    pub fn forward_with_tape(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        kept: Option<&KeptAttention>,
        kept_out: Option<&Tensor>,
    ) -> Result<(Tensor, SingleTape)> {
        let x = xs.detach();
        let m = modulation_untracked(&self.modulation.lin, &inputs.vec)?;
        let (x_mod, normed) = norm_modulate_untracked(&x, &m.mods[0], inputs.compute_dtype())?;
        let (h, linear1) = self.linear1.forward_untracked(&x_mod)?;
        let (qkv, mlp) = split_last(&h, 3 * self.hidden_size)?;
        let ([q, k, v], heads) = qkv_untracked(&qkv, &self.norm, self.num_heads)?;
        let (attn, attention) = rope_attention_untracked([&q, &k, &v], &inputs.rope, kept)?;
        let cat = Tensor::cat(&[&attn, &gelu_tanh(&mlp)?], 2)?;
        let (out, linear2) = match kept_out {
            Some(out) => (out.clone(), LinearTape::kept(out)),
            None => self.linear2.forward_untracked(&cat)?,
        };
        let y = gated_residual(&x, &out, &m.mods[0].gate, x.dtype())?;
        let tape = SingleTape {
            x,
            normed,
            x_mod,
            linear1,
            heads,
            mlp,
            attention,
            cat,
            linear2,
            out,
            m,
            rope: inputs.rope.clone(),
        };
        Ok((y, tape))
    }

    /// The block's backward for the output gradient `grad` [b, txt_len + img_len, dim].
    pub fn backward(&self, tape: SingleTape, grad: &Tensor) -> Result<BlockGrads> {
        let mut params = Vec::new();
        let m = &tape.m.mods[0];
        let (d_out, d_gate) = gated_backward(grad, &tape.out, &m.gate)?;
        let (d_cat, p) =
            self.linear2
                .backward_with(&tape.cat, &tape.linear2, &d_out, InputGrad::New)?;
        params.extend(p);
        let d_cat = d_cat.ok_or_else(|| missing("linear2"))?;
        let (d_attn, d_gelu) = split_last(&d_cat, self.hidden_size)?;
        let d_mlp = gelu_tanh_backward(&tape.mlp, &d_gelu.dense()?)?;
        let [dq, dk, dv] = rope_attention_backward(&tape.attention, &tape.rope, &d_attn.dense()?)?;
        let d_qkv = qkv_backward(&tape.heads, &self.norm, [&dq, &dk, &dv])?;
        let d_h = Tensor::cat(&[&d_qkv, &d_mlp.to_dtype(d_qkv.dtype())?], D::Minus1)?;
        let (d_xmod, p) =
            self.linear1
                .backward_with(&tape.x_mod, &tape.linear1, &d_h, InputGrad::New)?;
        params.extend(p);
        let d_xmod = d_xmod.ok_or_else(|| missing("linear1"))?;
        let (dx_norm, d_shift, d_scale) =
            norm_modulate_backward(&tape.x, &tape.normed, m, &d_xmod)?;
        let grads = ModGrad {
            shift: d_shift,
            scale: d_scale,
            gate: d_gate,
        };
        modulation_backward(&self.modulation.lin, &tape.m, &[grads], &mut params)?;
        let input = (grad + dx_norm.to_dtype(grad.dtype())?)?;
        Ok(BlockGrads { input, params })
    }
}

fn missing(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "single block backward: no input gradient for {what}"
    ))
}
