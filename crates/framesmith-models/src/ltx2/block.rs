//! The video stream of an LTX-2 block (`transformer_blocks.N`, ltx-core's `BasicAVTransformerBlock`) as
//! text-to-video runs it: AdaLN rows (the block's `scale_shift_table` plus the shared timestep embedding) modulate
//! parameter-free RMSNorms before the RoPE self-attention (`attn1`) and the GELU-tanh feed-forward (`ff`), each
//! added back through its gate; the text cross-attention (`attn2`) reads the RMSNorm of the residual, plain
//! (LTX-2) or modulated on both sides and gated (LTX-2.3's cross-attention AdaLN). Every attention normalises q
//! and k with an RMSNorm over the whole width (`q_norm`, `k_norm`), and LTX-2.3 gates each head's output by
//! `2·sigmoid(to_gate_logits(x))`.
//!
//! Without audio the official block skips both audio-video cross-attentions (`audio_to_video_attn` and the
//! reverse: `run_a2v` needs audio tokens) and the audio stream, so their weights are not read here and nothing
//! is computed for them; the video stream's result is exact.

use candle_core::{DType, Result, Tensor, D};

use super::config::Ltx2Config;
use super::rope::RopeTable;
use framesmith_nn::attention::attention;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::ops::{gated_residual, gelu_tanh, modulate_to};
use framesmith_nn::vb::Vb;

pub mod grad;

/// What every block of one forward pass shares.
#[derive(Clone)]
pub struct BlockInputs {
    /// The AdaLN rows of each sample, [b, 1, coefficient · dim].
    pub timestep: Tensor,
    /// The prompt AdaLN's rows [b, 1, 2 · dim] (LTX-2.3 with `use_prompt_adaln_single`).
    pub prompt_timestep: Option<Tensor>,
    /// The self-attention's RoPE tables.
    pub rope: RopeTable,
    /// The text context [b, text_len, dim] (after the caption projection).
    pub context: Tensor,
    /// Valid text tokens per sample (the rest is padding, masked as keys); `None`: all are valid.
    pub context_lens: Option<Vec<usize>>,
}

/// An attention (`attn1`, `attn2`): q, k, v, output projection, q / k RMSNorms over the width, optional gates.
#[derive(Clone)]
pub struct Attention {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    /// `to_out.0`.
    pub to_out: Linear,
    /// `q_norm.weight` [dim].
    pub q_norm: Tensor,
    /// `k_norm.weight` [dim].
    pub k_norm: Tensor,
    /// `to_gate_logits` [heads, dim] (LTX-2.3).
    pub to_gate_logits: Option<Linear>,
    pub heads: usize,
    pub eps: f64,
}

impl Attention {
    /// Reads the attention of width `dim` (keys and values from `context_dim`) under `vb`.
    pub fn load(vb: &Vb, cfg: &Ltx2Config, context_dim: usize) -> Result<Self> {
        let dim = cfg.inner_dim();
        let gate = if cfg.apply_gated_attention {
            Some(Linear::load(
                &vb.pp("to_gate_logits"),
                dim,
                cfg.num_attention_heads,
            )?)
        } else {
            None
        };
        Ok(Self {
            to_q: Linear::load(&vb.pp("to_q"), dim, dim)?,
            to_k: Linear::load(&vb.pp("to_k"), context_dim, dim)?,
            to_v: Linear::load(&vb.pp("to_v"), context_dim, dim)?,
            to_out: Linear::load(&vb.pp("to_out").pp(0), dim, dim)?,
            q_norm: vb.pp("q_norm").get(dim, "weight")?,
            k_norm: vb.pp("k_norm").get(dim, "weight")?,
            to_gate_logits: gate,
            heads: cfg.num_attention_heads,
            eps: cfg.norm_eps,
        })
    }

    /// Attention of `xs` [b, l, dim] over `context` [b, s, ctx] (RoPE on q and k when `rope`); `context_lens`
    /// valid keys per sample.
    pub fn forward(
        &self,
        xs: &Tensor,
        context: &Tensor,
        rope: Option<&RopeTable>,
        context_lens: Option<&[usize]>,
    ) -> Result<Tensor> {
        let q = self.split(&rms_norm(
            &self.to_q.forward(xs)?,
            Some(&self.q_norm),
            self.eps,
        )?)?;
        let k = self.split(&rms_norm(
            &self.to_k.forward(context)?,
            Some(&self.k_norm),
            self.eps,
        )?)?;
        let v = self.split(&self.to_v.forward(context)?)?;
        let (q, k) = match rope {
            Some(rope) => (rope.apply(&q)?, rope.apply(&k)?),
            None => (q, k),
        };
        let mut out = attention(&q, &k, &v, context_lens)?;
        if let Some(gate) = &self.to_gate_logits {
            out = gate_heads(&out, &head_gates(&gate.forward(xs)?)?)?;
        }
        self.to_out.forward(&out.flatten_from(2)?)
    }

    /// `xs` [b, l, heads · d] as [b, l, heads, d].
    pub fn split(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, l, width) = xs.dims3()?;
        xs.reshape((b, l, self.heads, width / self.heads))
    }
}

/// The per-head gates `2·sigmoid(logits)` of LTX-2.3's gated attention.
pub fn head_gates(logits: &Tensor) -> Result<Tensor> {
    (logits.neg()?.exp()? + 1.0)?.recip()? * 2.0
}

/// Each head of `xs` [b, l, heads, d] times its gate of `gates` [b, l, heads] (differentiable). The gates are
/// spread over the head width by a rank-1 product, then multiply in one dense pass: candle's broadcast
/// multiply computes a strided index per value and ran at a tenth of a dense pass on the GPU.
pub fn gate_heads(xs: &Tensor, gates: &Tensor) -> Result<Tensor> {
    xs.mul(&per_value(gates, xs.dim(D::Minus1)?)?)
}

/// `gates` [b, l, heads] repeated over `d` values: [b, l, heads, d], dense (`gates · 1ᵀ`, exact in any dtype).
fn per_value(gates: &Tensor, d: usize) -> Result<Tensor> {
    let (b, l, heads) = gates.dims3()?;
    let ones = Tensor::ones((1, d), gates.dtype(), gates.device())?;
    gates
        .reshape((b * l * heads, 1))?
        .matmul(&ones)?
        .reshape((b, l, heads, d))
}

/// The sums over each head's values of `xs` [b, l, heads, d]: [b, l, heads], as a product with a ones vector
/// (f32 accumulation, a matrix-vector product instead of candle's slower last-dimension sum).
pub fn head_sums(xs: &Tensor) -> Result<Tensor> {
    let (b, l, heads, d) = xs.dims4()?;
    let ones = Tensor::ones((d, 1), xs.dtype(), xs.device())?;
    xs.reshape((b * l * heads, d))?
        .matmul(&ones)?
        .reshape((b, l, heads))
}

/// `ff`: `net.0.proj` → GELU-tanh → `net.2`.
#[derive(Clone)]
pub struct FeedForward {
    pub proj_in: Linear,
    pub proj_out: Linear,
}

impl FeedForward {
    pub fn load(vb: &Vb, dim: usize) -> Result<Self> {
        let net = vb.pp("net");
        Ok(Self {
            proj_in: Linear::load(&net.pp(0).pp("proj"), dim, 4 * dim)?,
            proj_out: Linear::load(&net.pp(2), 4 * dim, dim)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.proj_out
            .forward(&gelu_tanh(&self.proj_in.forward(xs)?)?)
    }
}

/// The modulation vectors of one block and pass, [b, 1, dim] f32 each (the values ltx-core forms in the compute
/// dtype, held in f32 for the fused element-wise ops), in the order of the AdaLN rows: shift, scale and gate of
/// the self-attention, of the feed-forward and (LTX-2.3) of the cross-attention's queries; and the
/// cross-attention context's shift and scale.
#[derive(Clone)]
pub struct Modulation {
    pub rows: Vec<Tensor>,
    pub context: Option<[Tensor; 2]>,
}

impl Modulation {
    fn row(&self, i: usize) -> &Tensor {
        &self.rows[i]
    }
}

/// `rms_norm(x) · (1 + scale) + shift`, the modulation in f32 (one fused pass on CUDA), in `xs`' dtype.
pub fn ada_norm(xs: &Tensor, scale: &Tensor, shift: &Tensor, eps: f64) -> Result<Tensor> {
    modulate_to(&rms_norm(xs, None, eps)?, scale, shift, xs.dtype())
}

/// The residual `xs + y · gate` in `xs`' dtype (the gate f32; one fused pass on CUDA).
pub fn gated(xs: &Tensor, y: &Tensor, gate: &Tensor) -> Result<Tensor> {
    gated_residual(xs, y, gate, xs.dtype())
}

/// `transformer_blocks.N`, the video stream.
#[derive(Clone)]
pub struct Ltx2Block {
    pub attn1: Attention,
    pub attn2: Attention,
    pub ff: FeedForward,
    /// `scale_shift_table` [coefficient, dim].
    pub scale_shift_table: Tensor,
    /// `prompt_scale_shift_table` [2, dim] (LTX-2.3).
    pub prompt_scale_shift_table: Option<Tensor>,
    pub eps: f64,
}

impl Ltx2Block {
    /// Reads the video stream of `transformer_blocks.N` under `vb`.
    pub fn load(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        let dim = cfg.inner_dim();
        let prompt = if cfg.cross_attention_adaln {
            Some(vb.get((2, dim), "prompt_scale_shift_table")?)
        } else {
            None
        };
        Ok(Self {
            attn1: Attention::load(&vb.pp("attn1"), cfg, dim)?,
            attn2: Attention::load(&vb.pp("attn2"), cfg, cfg.cross_attention_dim)?,
            ff: FeedForward::load(&vb.pp("ff"), dim)?,
            scale_shift_table: vb.get((cfg.adaln_coefficient(), dim), "scale_shift_table")?,
            prompt_scale_shift_table: prompt,
            eps: cfg.norm_eps,
        })
    }

    /// The block's linears by their path under the block (ltx-core's names), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = Vec::new();
        for (name, attn) in [("attn1", &mut self.attn1), ("attn2", &mut self.attn2)] {
            out.push((format!("{name}.to_q"), &mut attn.to_q));
            out.push((format!("{name}.to_k"), &mut attn.to_k));
            out.push((format!("{name}.to_v"), &mut attn.to_v));
            out.push((format!("{name}.to_out.0"), &mut attn.to_out));
            if let Some(gate) = attn.to_gate_logits.as_mut() {
                out.push((format!("{name}.to_gate_logits"), gate));
            }
        }
        out.push(("ff.net.0.proj".into(), &mut self.ff.proj_in));
        out.push(("ff.net.2".into(), &mut self.ff.proj_out));
        out
    }

    /// The modulation vectors for this pass: each row formed in the compute dtype (as ltx-core adds the table
    /// to the timestep's rows), then held in f32, [b, 1, dim]. All rows in one sum and one cast.
    pub fn modulation(&self, inputs: &BlockInputs) -> Result<Modulation> {
        let dtype = inputs.context.dtype();
        let b = inputs.context.dim(0)?;
        let table = self.scale_shift_table.to_dtype(dtype)?;
        let (k, dim) = table.dims2()?;
        let f32_row = |t: Tensor| {
            t.broadcast_as((b, 1, dim))?
                .to_dtype(DType::F32)?
                .contiguous()
        };
        let all = inputs
            .timestep
            .to_dtype(dtype)?
            .reshape((b, k, dim))?
            .broadcast_add(&table.unsqueeze(0)?)?
            .to_dtype(DType::F32)?;
        let rows = (0..k)
            .map(|i| all.narrow(1, i, 1)?.contiguous())
            .collect::<Result<Vec<_>>>()?;
        let context = match &self.prompt_scale_shift_table {
            Some(p) => {
                let p = p.to_dtype(dtype)?;
                let row = |i: usize| -> Result<Tensor> {
                    let base = p.get(i)?.reshape((1, 1, dim))?;
                    f32_row(match &inputs.prompt_timestep {
                        Some(t) => t
                            .narrow(2, i * dim, dim)?
                            .to_dtype(dtype)?
                            .broadcast_add(&base)?,
                        None => base,
                    })
                };
                Some([row(0)?, row(1)?])
            }
            None => None,
        };
        Ok(Modulation { rows, context })
    }

    /// Runs the block on the video tokens `xs` [b, l, dim] (differentiable).
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        let m = self.modulation(inputs)?;
        let h = ada_norm(xs, m.row(1), m.row(0), self.eps)?;
        let y = self.attn1.forward(&h, &h, Some(&inputs.rope), None)?;
        let xs = gated(xs, &y, m.row(2))?;
        let normed = rms_norm(&xs, None, self.eps)?;
        let lens = inputs.context_lens.as_deref();
        let xs = match &m.context {
            Some([shift_kv, scale_kv]) => {
                let q_in = modulate_to(&normed, m.row(7), m.row(6), normed.dtype())?;
                let ctx = modulate_to(&inputs.context, scale_kv, shift_kv, normed.dtype())?;
                let y = self.attn2.forward(&q_in, &ctx, None, lens)?;
                gated(&xs, &y, m.row(8))?
            }
            None => (&xs + self.attn2.forward(&normed, &inputs.context, None, lens)?)?,
        };
        let h = ada_norm(&xs, m.row(4), m.row(3), self.eps)?;
        gated(&xs, &self.ff.forward(&h)?, m.row(5))
    }
}
