//! The adaptive-LayerNorm modulation that the MMDiT families' blocks share (FLUX.1's double- and single-stream
//! blocks, Qwen-Image's blocks): a linear of `silu(c)` split into (shift, scale, gate) triples, the modulated norm
//! `(1 + scale) · LayerNorm(x) + shift` (parameter-free, eps 1e-6) and the gated residual `x + y · gate`, and a
//! dual-stream block's half after the joint attention (gated output projection, modulated norm, GELU-tanh MLP,
//! gated residual). Each comes as a forward that builds no autograd graph and records what its hand-written
//! backward needs, and as that backward; the numerics follow the tracked forward step by step, so the gradients
//! equal candle's autograd through it. The conditioning vector is a constant here: only the LoRA factors of the
//! modulation linear get gradients through it. A family keeps its modules and key names; the math is here.

use candle_core::{DType, Result, Tensor};

use framesmith_nn::linear::{InputGrad, Linear, LinearTape, ParamGrad};
use framesmith_nn::norm::{layer_norm, layer_norm_backward};
use framesmith_nn::ops::{
    gate_backward, gated_residual, gelu_tanh, gelu_tanh_backward, modulate_backward, modulate_to,
    token_sums,
};

/// Epsilon of the blocks' LayerNorms (no affine parameters).
pub const LAYER_NORM_EPS: f64 = 1e-6;

/// One (shift, scale, gate) triple, each [b, 1, dim] f32.
#[derive(Clone, Debug)]
pub struct ModulationOut {
    pub shift: Tensor,
    pub scale: Tensor,
    pub gate: Tensor,
}

/// The `count` (shift, scale, gate) triples of a modulation linear's output [b, 3·count·dim], in f32 as
/// [b, 1, dim] each.
pub fn triples(out: &Tensor, count: usize) -> Result<Vec<ModulationOut>> {
    let out = out.to_dtype(DType::F32)?.unsqueeze(1)?;
    let chunks = out.chunk(3 * count, 2)?;
    Ok(chunks
        .chunks_exact(3)
        .map(|c| ModulationOut {
            shift: c[0].clone(),
            scale: c[1].clone(),
            gate: c[2].clone(),
        })
        .collect())
}

/// `(1 + scale) · LayerNorm(xs) + shift` in f32, returned in `dtype`.
pub fn norm_modulate(xs: &Tensor, m: &ModulationOut, dtype: DType) -> Result<Tensor> {
    modulate_to(
        &layer_norm(xs, None, None, LAYER_NORM_EPS)?,
        &m.scale,
        &m.shift,
        dtype,
    )
}

/// A block's modulation without a graph: the triples and what the LoRA gradients of its linear need.
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

/// The modulation `lin(silu(c))` of the conditioning `c` [b, dim] without a graph: as many triples as `lin`
/// makes (its output is 3·count·dim wide).
pub fn modulation_untracked(lin: &Linear, c: &Tensor) -> Result<ModTape> {
    let input = c.detach().silu()?;
    let (out, tape) = lin.forward_untracked(&input)?;
    let count = out.dim(1)? / (3 * c.dim(1)?);
    let mods = triples(&out, count)?;
    Ok(ModTape { input, tape, mods })
}

/// The LoRA gradients of the modulation linear `lin` for the triples' gradients (in order), appended to `params`.
pub fn modulation_backward(
    lin: &Linear,
    tape: &ModTape,
    grads: &[ModGrad],
    params: &mut Vec<ParamGrad>,
) -> Result<()> {
    if lin.adapter().is_none() {
        return Ok(());
    }
    let parts: Vec<&Tensor> = grads
        .iter()
        .flat_map(|g| [&g.shift, &g.scale, &g.gate])
        .collect();
    let d = Tensor::cat(&parts, 2)?.squeeze(1)?;
    let (_, p) = lin.backward_with(&tape.input, &tape.tape, &d, InputGrad::Skip)?;
    params.extend(p);
    Ok(())
}

/// [`norm_modulate`] without a graph: the output (in `dtype`) and the LayerNorm output.
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

/// A dual-stream block's stream after the joint attention: its output projection and its GELU-tanh MLP, with the
/// names of their checkpoint keys for messages.
pub struct StreamTail<'a> {
    /// The output projection (the attention output's linear).
    pub proj: &'a Linear,
    /// The MLP's first and second linears.
    pub mlp: [&'a Linear; 2],
    /// The block's name and the three linears' key names (projection, MLP in, MLP out), for messages.
    pub names: [&'static str; 4],
}

/// What a stream's half after the joint attention keeps for its backward.
pub struct TailTape {
    /// This stream's rows of the attention output (the projection's input), and the projection's output.
    attn: Tensor,
    proj: LinearTape,
    y1: Tensor,
    /// Residual after attention, its LayerNorm, the MLP input, the first MLP linear's output, the second's.
    x1: Tensor,
    n2: Tensor,
    h2: Tensor,
    f0: Tensor,
    fc0: LinearTape,
    fc2: LinearTape,
    y2: Tensor,
}

impl TailTape {
    /// The gated branches' outputs a recompute may reuse: the projection's and the MLP's.
    pub fn projections(&self) -> [&Tensor; 2] {
        [&self.y1, &self.y2]
    }
}

/// What a stream's backward after the joint attention leaves for the rest of it.
pub struct TailGrads {
    /// Gradient of the stream's rows of the attention output.
    pub d_attn: Tensor,
    /// Gradient of the residual after attention (the stream input's gradient so far).
    pub dx1: Tensor,
    /// Modulation gradients of the MLP half, and of the attention half's gate.
    pub second: ModGrad,
    pub d_gate1: Tensor,
}

impl StreamTail<'_> {
    /// The stream's half after the joint attention for its input `xs` (residual dtype) and its rows `attn` of the
    /// attention output, modulated by `[m1, m2]`; linears run in `compute`. `kept`: the projection's and the
    /// MLP's outputs from an earlier pass on the same input, which skip those products (their LoRA activations
    /// are then recomputed in the backward).
    pub fn forward(
        &self,
        [m1, m2]: [&ModulationOut; 2],
        (xs, attn): (&Tensor, Tensor),
        compute: DType,
        kept: Option<[&Tensor; 2]>,
    ) -> Result<(Tensor, TailTape)> {
        let residual = xs.dtype();
        let [fc0_lin, fc2_lin] = self.mlp;
        let (y1, proj) = match kept {
            Some([y1, _]) => (y1.clone(), LinearTape::kept(y1)),
            None => self.proj.forward_untracked(&attn)?,
        };
        let x1 = gated_residual(xs, &y1, &m1.gate, residual)?;
        let (h2, n2) = norm_modulate_untracked(&x1, m2, compute)?;
        let (f0, fc0) = fc0_lin.forward_untracked(&h2)?;
        let (y2, fc2) = match kept {
            Some([_, y2]) => (y2.clone(), LinearTape::kept(y2)),
            None => fc2_lin.forward_untracked(&gelu_tanh(&f0)?)?,
        };
        let out = gated_residual(&x1, &y2, &m2.gate, residual)?;
        let tape = TailTape {
            attn,
            proj,
            y1,
            x1,
            n2,
            h2,
            f0,
            fc0,
            fc2,
            y2,
        };
        Ok((out, tape))
    }

    /// Backward of [`StreamTail::forward`] for the stream's output gradient `dout`, its LoRA gradients appended to
    /// `params`.
    pub fn backward(
        &self,
        [m1, m2]: [&ModulationOut; 2],
        t: &TailTape,
        dout: &Tensor,
        params: &mut Vec<ParamGrad>,
    ) -> Result<TailGrads> {
        let [fc0_lin, fc2_lin] = self.mlp;
        let (dy2, d_gate2) = gated_backward(dout, &t.y2, &m2.gate)?;
        let g = gelu_tanh(&t.f0)?;
        let (dg, p) = fc2_lin.backward_with(&g, &t.fc2, &dy2, InputGrad::New)?;
        params.extend(p);
        let dg = dg.ok_or_else(|| self.missing(3))?;
        let df0 = gelu_tanh_backward(&t.f0, &dg)?;
        let (dh2, p) = fc0_lin.backward_with(&t.h2, &t.fc0, &df0, InputGrad::New)?;
        params.extend(p);
        let dh2 = dh2.ok_or_else(|| self.missing(2))?;
        let (dx1_norm, d_shift2, d_scale2) = norm_modulate_backward(&t.x1, &t.n2, m2, &dh2)?;
        let dx1 = (dout + dx1_norm.to_dtype(dout.dtype())?)?;
        let (dy1, d_gate1) = gated_backward(&dx1, &t.y1, &m1.gate)?;
        let (d_attn, p) = self
            .proj
            .backward_with(&t.attn, &t.proj, &dy1, InputGrad::New)?;
        params.extend(p);
        let second = ModGrad {
            shift: d_shift2,
            scale: d_scale2,
            gate: d_gate2,
        };
        Ok(TailGrads {
            d_attn: d_attn.ok_or_else(|| self.missing(1))?,
            dx1,
            second,
            d_gate1,
        })
    }

    /// The error of a linear (`names[i]`) that returned no input gradient.
    fn missing(&self, i: usize) -> candle_core::Error {
        candle_core::Error::Msg(format!(
            "{} backward: no input gradient for {}",
            self.names[0], self.names[i]
        ))
    }
}
