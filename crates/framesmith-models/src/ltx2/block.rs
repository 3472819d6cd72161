//! An LTX-2 block (`transformer_blocks.N`, ltx-core's `BasicAVTransformerBlock`). Each stream (video, and audio
//! at its own width) runs the same steps: AdaLN rows (the block's `scale_shift_table` plus the shared timestep
//! embedding) modulate parameter-free RMSNorms before the RoPE self-attention (`attn1`) and the GELU-tanh
//! feed-forward (`ff`), each added back through its gate; the text cross-attention (`attn2`) reads the RMSNorm
//! of the residual, plain (LTX-2) or modulated on both sides and gated (LTX-2.3's cross-attention AdaLN). Every
//! attention normalises q and k with an RMSNorm over the whole width (`q_norm`, `k_norm`), and LTX-2.3 gates each
//! head's output by `2·sigmoid(to_gate_logits(x))`.
//!
//! In a joint audio-video pass, between the text cross-attentions and the feed-forwards, video queries attend to
//! audio (`audio_to_video_attn`) and audio queries to video (`video_to_audio_attn`), both reading the streams as
//! they were before either: each side modulated by its `scale_shift_table_a2v_ca_*` rows plus the AdaLN of its own
//! σ, RoPE over the time positions only, the output gated by a row of the other stream's σ. The block's input
//! is then both streams' tokens packed into one tensor ([`AudioInputs::pack`]).
//!
//! Without audio the official block skips both audio-video cross-attentions (`run_a2v` needs audio tokens) and
//! the audio stream, so their weights are not read (unless the model was read for joint training) and nothing is
//! computed for them; the video stream's result is exact.

use candle_core::{DType, Result, Tensor};

use super::config::Ltx2Config;
use super::rope::RopeTable;
use framesmith_nn::attention::attention;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::ops::{
    gated_residual, gelu_tanh, head_gate, modulate_to, rms_norm_modulate, sigmoid_gates,
};
use framesmith_nn::vb::Vb;

pub mod grad;
mod rows;

pub use rows::{BlockTables, PassRows};

/// What every block of one forward pass shares.
#[derive(Clone)]
pub struct BlockInputs {
    /// The AdaLN rows of each sample, [b, 1, coefficient · dim]; with per-token timesteps ([`BlockInputs::pick`])
    /// the rows of each of the sample's timesteps, [b, n, coefficient · dim].
    pub timestep: Tensor,
    /// Per-token timesteps (first-frame conditioning): the row of `timestep` (and of the video's audio-video
    /// scale and shift rows) each video token takes, u32 [b · tokens] indexing the b · n rows; `None`: every token
    /// of a sample at the sample's one timestep.
    pub pick: Option<Tensor>,
    /// The prompt AdaLN's rows [b, 1, 2 · dim] (LTX-2.3 with `use_prompt_adaln_single`).
    pub prompt_timestep: Option<Tensor>,
    /// The self-attention's RoPE tables.
    pub rope: RopeTable,
    /// The text context [b, text_len, dim] (after the caption projection).
    pub context: Tensor,
    /// Valid text tokens per sample (the rest is padding, masked as keys); `None`: all are valid.
    pub context_lens: Option<Vec<usize>>,
    /// The audio stream's inputs of a joint audio-video pass; `None`: text-to-video, nothing is computed for
    /// audio.
    pub audio: Option<AudioInputs>,
    /// Every block's video modulation rows for this pass, formed at once (per-sample timesteps only); `None`:
    /// each block forms its own.
    pub rows: Option<PassRows>,
}

impl BlockInputs {
    /// Rows [b, n, width] of the video's timesteps as the tokens take them: [b, tokens, width] with per-token
    /// timesteps ([`BlockInputs::pick`]), as they are ([b, 1, width]) without.
    pub fn per_token(&self, rows: &Tensor) -> Result<Tensor> {
        match &self.pick {
            Some(pick) => pick_rows(rows, pick),
            None => Ok(rows.clone()),
        }
    }
}

/// `rows` [b, n, width] as [b, tokens, width], token j of sample i taking row `pick[i · tokens + j]` of the
/// b · n rows (u32 [b · tokens]).
pub fn pick_rows(rows: &Tensor, pick: &Tensor) -> Result<Tensor> {
    let (b, n, width) = rows.dims3()?;
    let tokens = pick.elem_count() / b.max(1);
    rows.reshape((b * n, width))?
        .index_select(pick, 0)?
        .reshape((b, tokens, width))
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

/// The sizes of one attention: query and context widths, heads and their width.
#[derive(Clone, Copy, Debug)]
pub struct AttnSizes {
    pub query: usize,
    pub context: usize,
    pub heads: usize,
    pub head_dim: usize,
}

/// The RoPE tables of an attention's queries and keys (the same table for a self-attention).
pub type Ropes<'a> = (&'a RopeTable, &'a RopeTable);

impl Attention {
    /// Reads a video-width attention (keys and values from `context_dim`) under `vb`.
    pub fn load(vb: &Vb, cfg: &Ltx2Config, context_dim: usize) -> Result<Self> {
        let sizes = AttnSizes {
            query: cfg.inner_dim(),
            context: context_dim,
            heads: cfg.num_attention_heads,
            head_dim: cfg.attention_head_dim,
        };
        Self::load_sized(vb, sizes, cfg)
    }

    /// Reads the attention of `sizes` under `vb` (gated as `cfg` says).
    pub fn load_sized(vb: &Vb, sizes: AttnSizes, cfg: &Ltx2Config) -> Result<Self> {
        let inner = sizes.heads * sizes.head_dim;
        let gate = if cfg.apply_gated_attention {
            Some(Linear::load(
                &vb.pp("to_gate_logits"),
                sizes.query,
                sizes.heads,
            )?)
        } else {
            None
        };
        Ok(Self {
            to_q: Linear::load(&vb.pp("to_q"), sizes.query, inner)?,
            to_k: Linear::load(&vb.pp("to_k"), sizes.context, inner)?,
            to_v: Linear::load(&vb.pp("to_v"), sizes.context, inner)?,
            to_out: Linear::load(&vb.pp("to_out").pp(0), inner, sizes.query)?,
            q_norm: vb.pp("q_norm").get(inner, "weight")?,
            k_norm: vb.pp("k_norm").get(inner, "weight")?,
            to_gate_logits: gate,
            heads: sizes.heads,
            eps: cfg.norm_eps,
        })
    }

    /// Attention of `xs` [b, l, dim] over `context` [b, s, ctx] (RoPE on q and k when `rope`: the queries' and
    /// the keys' tables); `context_lens` valid keys per sample.
    pub fn forward(
        &self,
        xs: &Tensor,
        context: &Tensor,
        rope: Option<Ropes>,
        context_lens: Option<&[usize]>,
    ) -> Result<Tensor> {
        let (q, k) = self.normed_qk(&self.to_q.forward(xs)?, &self.to_k.forward(context)?, rope)?;
        let v = self.split(&self.to_v.forward(context)?)?;
        let mut out = attention(&q, &k, &v, context_lens)?;
        if let Some(gate) = &self.to_gate_logits {
            out = head_gate(&out, &head_gates(&gate.forward(xs)?)?)?;
        }
        self.to_out.forward(&out.flatten_from(2)?)
    }

    /// The projections `q` and `k` [b, l, heads · d] through their RMSNorms, as heads [b, l, heads, d], rotated
    /// by `rope` when given (RMSNorm and rotation one kernel on CUDA outside autograd).
    pub fn normed_qk(
        &self,
        q: &Tensor,
        k: &Tensor,
        rope: Option<Ropes>,
    ) -> Result<(Tensor, Tensor)> {
        let (eps, heads) = (self.eps, self.heads);
        match rope {
            Some((rq, rk)) => Ok((
                rq.norm_apply(q, &self.q_norm, eps, heads)?,
                rk.norm_apply(k, &self.k_norm, eps, heads)?,
            )),
            None => Ok((
                self.split(&rms_norm(q, Some(&self.q_norm), eps)?)?,
                self.split(&rms_norm(k, Some(&self.k_norm), eps)?)?,
            )),
        }
    }

    /// `xs` [b, l, heads · d] as [b, l, heads, d].
    pub fn split(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, l, width) = xs.dims3()?;
        xs.reshape((b, l, self.heads, width / self.heads))
    }
}

/// The per-head gates `2·sigmoid(logits)` of LTX-2.3's gated attention (one pass on CUDA outside autograd).
pub fn head_gates(logits: &Tensor) -> Result<Tensor> {
    sigmoid_gates(logits)
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

/// The modulation vectors of one block and pass, [b, 1, dim] f32 each ([b, tokens, dim] with per-token timesteps;
/// the values ltx-core forms in the compute dtype, held in f32 for the fused element-wise ops), in the order of the AdaLN rows: shift, scale and gate of
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

/// `rms_norm(x) · (1 + scale) + shift`, the modulation in f32 (norm and modulation one fused pass on CUDA
/// outside autograd), in `xs`' dtype.
pub fn ada_norm(xs: &Tensor, scale: &Tensor, shift: &Tensor, eps: f64) -> Result<Tensor> {
    rms_norm_modulate(xs, scale, shift, eps, xs.dtype())
}

/// The residual `xs + y · gate` in `xs`' dtype (the gate f32; one fused pass on CUDA).
pub fn gated(xs: &Tensor, y: &Tensor, gate: &Tensor) -> Result<Tensor> {
    gated_residual(xs, y, gate, xs.dtype())
}

/// The audio stream of `transformer_blocks.N` and its two audio-video cross-attentions, read for joint
/// audio-video training only.
#[derive(Clone)]
pub struct AudioStream {
    /// `audio_attn1`, `audio_attn2`, `audio_ff` at the audio width.
    pub attn1: Attention,
    pub attn2: Attention,
    pub ff: FeedForward,
    /// `audio_scale_shift_table` [coefficient, audio dim].
    pub scale_shift_table: Tensor,
    /// `audio_prompt_scale_shift_table` [2, audio dim] (LTX-2.3).
    pub prompt_scale_shift_table: Option<Tensor>,
    /// `audio_to_video_attn`: video queries over audio keys and values (audio heads).
    pub audio_to_video: Attention,
    /// `video_to_audio_attn`: audio queries over video keys and values.
    pub video_to_audio: Attention,
    /// `scale_shift_table_a2v_ca_video` [5, dim] and `scale_shift_table_a2v_ca_audio` [5, audio dim]: the
    /// cross-attentions' scale and shift of audio-to-video, of video-to-audio, and the gate.
    pub av_table_video: Tensor,
    pub av_table_audio: Tensor,
}

impl AudioStream {
    /// Reads the audio stream and the audio-video cross-attentions of a block under `vb`.
    pub fn load(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        let (dim, adim) = (cfg.inner_dim(), cfg.audio_inner_dim());
        let audio = |context: usize| AttnSizes {
            query: adim,
            context,
            heads: cfg.audio_num_attention_heads,
            head_dim: cfg.audio_attention_head_dim,
        };
        let prompt = if cfg.cross_attention_adaln {
            Some(vb.get((2, adim), "audio_prompt_scale_shift_table")?)
        } else {
            None
        };
        let a2v = AttnSizes {
            query: dim,
            ..audio(adim)
        };
        Ok(Self {
            attn1: Attention::load_sized(&vb.pp("audio_attn1"), audio(adim), cfg)?,
            attn2: Attention::load_sized(
                &vb.pp("audio_attn2"),
                audio(cfg.audio_cross_attention_dim),
                cfg,
            )?,
            ff: FeedForward::load(&vb.pp("audio_ff"), adim)?,
            scale_shift_table: vb
                .get((cfg.adaln_coefficient(), adim), "audio_scale_shift_table")?,
            prompt_scale_shift_table: prompt,
            audio_to_video: Attention::load_sized(&vb.pp("audio_to_video_attn"), a2v, cfg)?,
            video_to_audio: Attention::load_sized(&vb.pp("video_to_audio_attn"), audio(dim), cfg)?,
            av_table_video: vb.get((5, dim), "scale_shift_table_a2v_ca_video")?,
            av_table_audio: vb.get((5, adim), "scale_shift_table_a2v_ca_audio")?,
        })
    }

    /// The linears by their path under the block (ltx-core's names), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = attention_linears([
            ("audio_attn1", &mut self.attn1),
            ("audio_attn2", &mut self.attn2),
            ("audio_to_video_attn", &mut self.audio_to_video),
            ("video_to_audio_attn", &mut self.video_to_audio),
        ]);
        out.push(("audio_ff.net.0.proj".into(), &mut self.ff.proj_in));
        out.push(("audio_ff.net.2".into(), &mut self.ff.proj_out));
        out
    }
}

fn attention_linears<'a, const N: usize>(
    attns: [(&str, &'a mut Attention); N],
) -> Vec<(String, &'a mut Linear)> {
    let mut out = Vec::new();
    for (name, attn) in attns {
        out.push((format!("{name}.to_q"), &mut attn.to_q));
        out.push((format!("{name}.to_k"), &mut attn.to_k));
        out.push((format!("{name}.to_v"), &mut attn.to_v));
        out.push((format!("{name}.to_out.0"), &mut attn.to_out));
        if let Some(gate) = attn.to_gate_logits.as_mut() {
            out.push((format!("{name}.to_gate_logits"), gate));
        }
    }
    out
}

/// What the audio stream of every block of one forward pass shares (joint audio-video passes only).
#[derive(Clone)]
pub struct AudioInputs {
    /// The audio AdaLN rows [b, 1, coefficient · audio dim].
    pub timestep: Tensor,
    /// The audio prompt AdaLN's rows [b, 1, 2 · audio dim] (LTX-2.3).
    pub prompt_timestep: Option<Tensor>,
    /// The audio self-attention's RoPE tables.
    pub rope: RopeTable,
    /// The audio text context [b, text_len, audio dim] (after the audio caption projection); its valid tokens are
    /// the video context's.
    pub context: Tensor,
    /// The cross-attentions' RoPE tables of the video and the audio tokens (time only).
    pub video_cross_rope: RopeTable,
    pub audio_cross_rope: RopeTable,
    /// The cross-attentions' scale and shift rows of each stream [b, 1, 4 · width] (its own timesteps: per token
    /// for the video with [`BlockInputs::pick`], [b, n, 4 · dim]) and its gate row [b, 1, width] (the other
    /// stream's σ).
    pub video_cross: Tensor,
    pub video_gate: Tensor,
    pub audio_cross: Tensor,
    pub audio_gate: Tensor,
    /// (tokens, width) of each stream: the joint block input is both streams' tokens flattened and joined per
    /// sample, [b, video tokens · dim + audio tokens · audio dim].
    pub video_shape: (usize, usize),
    pub audio_shape: (usize, usize),
}

impl AudioInputs {
    /// The joint block input of video tokens [b, l, dim] and audio tokens [b, la, audio dim].
    pub fn pack(video: &Tensor, audio: &Tensor) -> Result<Tensor> {
        Tensor::cat(&[video.flatten_from(1)?, audio.flatten_from(1)?], 1)
    }

    /// The video and audio tokens of a joint block input (or of its gradient).
    pub fn unpack(&self, xs: &Tensor) -> Result<(Tensor, Tensor)> {
        unpack_joint(xs, self.video_shape, self.audio_shape)
    }

    /// Without an autograd history.
    pub fn detach(&self) -> Self {
        Self {
            timestep: self.timestep.detach(),
            prompt_timestep: self.prompt_timestep.as_ref().map(Tensor::detach),
            rope: self.rope.detach(),
            context: self.context.detach(),
            video_cross_rope: self.video_cross_rope.detach(),
            audio_cross_rope: self.audio_cross_rope.detach(),
            video_cross: self.video_cross.detach(),
            video_gate: self.video_gate.detach(),
            audio_cross: self.audio_cross.detach(),
            audio_gate: self.audio_gate.detach(),
            video_shape: self.video_shape,
            audio_shape: self.audio_shape,
        }
    }
}

/// The video tokens [b, lv, dv] and audio tokens [b, la, da] of a joint block input [b, lv·dv + la·da] (or of its
/// gradient).
pub fn unpack_joint(
    xs: &Tensor,
    (lv, dv): (usize, usize),
    (la, da): (usize, usize),
) -> Result<(Tensor, Tensor)> {
    let b = xs.dim(0)?;
    if xs.dims() != [b, lv * dv + la * da] {
        candle_core::bail!(
            "LTX-2 joint block: input {:?}, expected [b, {lv}·{dv} + {la}·{da}]",
            xs.dims()
        );
    }
    let video = xs.narrow(1, 0, lv * dv)?.reshape((b, lv, dv))?;
    let audio = xs.narrow(1, lv * dv, la * da)?.reshape((b, la, da))?;
    Ok((video, audio))
}

/// One stream's modules as a block runs them.
#[derive(Clone, Copy)]
pub(crate) struct StreamRef<'a> {
    pub attn1: &'a Attention,
    pub attn2: &'a Attention,
    pub ff: &'a FeedForward,
}

/// One stream's per-pass inputs.
#[derive(Clone, Copy)]
pub(crate) struct StreamCall<'a> {
    pub rope: &'a RopeTable,
    pub context: &'a Tensor,
    pub lens: Option<&'a [usize]>,
}

/// The modulation rows of a stream: `table` [k, dim] plus `timestep` [b, 1, k · dim], each formed in `dtype`
/// (the compute dtype, as ltx-core adds the table to the timestep's rows), then held in f32; and the text
/// context's shift and scale from `prompt` (the prompt table [2, dim] and its optional timestep rows).
fn modulation_of(
    (table, timestep, pick): (&Tensor, &Tensor, Option<&Tensor>),
    prompt: Option<(&Tensor, Option<&Tensor>)>,
    b: usize,
    dtype: DType,
) -> Result<Modulation> {
    let table = table.to_dtype(dtype)?;
    let dim = table.dim(1)?;
    let rows = table_rows(&table, timestep, b, dtype, pick)?;
    let context = match prompt {
        Some((p, prompt_timestep)) => {
            let p = p.to_dtype(dtype)?;
            let row = |i: usize| -> Result<Tensor> {
                let base = p.get(i)?.reshape((1, 1, dim))?;
                let t = match prompt_timestep {
                    Some(t) => t
                        .narrow(2, i * dim, dim)?
                        .to_dtype(dtype)?
                        .broadcast_add(&base)?,
                    None => base,
                };
                t.broadcast_as((b, 1, dim))?
                    .to_dtype(DType::F32)?
                    .contiguous()
            };
            Some([row(0)?, row(1)?])
        }
        None => None,
    };
    Ok(Modulation { rows, context })
}

/// `table` [k, dim] (in `dtype`) plus `timestep` [b, 1, k · dim] as k rows [b, 1, dim] f32, in one sum and one
/// cast. With `pick` (per-token timesteps), `timestep` holds n rows per sample [b, n, k · dim] and each row
/// comes out per token, [b, tokens, dim], the row of each token chosen by `pick` (u32 [b · tokens] over the
/// b · n rows): the values ltx-core forms from every token's own timestep embedding.
fn table_rows(
    table: &Tensor,
    timestep: &Tensor,
    b: usize,
    dtype: DType,
    pick: Option<&Tensor>,
) -> Result<Vec<Tensor>> {
    let (k, dim) = table.dims2()?;
    let Some(pick) = pick else {
        let all = timestep
            .to_dtype(dtype)?
            .reshape((b, k, dim))?
            .broadcast_add(&table.unsqueeze(0)?)?
            .to_dtype(DType::F32)?;
        return (0..k).map(|i| all.narrow(1, i, 1)?.contiguous()).collect();
    };
    let n = timestep.dim(1)?;
    let all = timestep
        .to_dtype(dtype)?
        .reshape((b * n, k, dim))?
        .broadcast_add(&table.unsqueeze(0)?)?
        .to_dtype(DType::F32)?;
    (0..k)
        .map(|i| pick_rows(&all.narrow(1, i, 1)?.reshape((b, n, dim))?, pick))
        .collect()
}

/// The audio-video cross-attentions' rows of one stream: `table` [5, dim]'s first four rows plus `cross`
/// [b, 1, 4 · dim] (scale and shift of audio-to-video, then of video-to-audio; per token with `pick`, as
/// [`table_rows`] says), its last plus `gate` [b, 1, dim] (one per sample).
fn av_rows(
    (table, cross, gate): (&Tensor, &Tensor, &Tensor),
    pick: Option<&Tensor>,
    b: usize,
    dtype: DType,
) -> Result<Vec<Tensor>> {
    let table = table.to_dtype(dtype)?;
    let mut rows = table_rows(&table.narrow(0, 0, 4)?, cross, b, dtype, pick)?;
    rows.extend(table_rows(&table.narrow(0, 4, 1)?, gate, b, dtype, None)?);
    Ok(rows)
}

/// The joint pass's audio-video rows: `video` and `audio` [5] each (a2v scale, a2v shift, v2a scale, v2a shift,
/// gate).
#[derive(Clone)]
pub struct AvModulation {
    pub video: Vec<Tensor>,
    pub audio: Vec<Tensor>,
}

/// A stream's self-attention and text cross-attention on `xs` (differentiable).
fn attn_part(
    s: StreamRef,
    xs: &Tensor,
    m: &Modulation,
    call: StreamCall,
    eps: f64,
) -> Result<Tensor> {
    let h = ada_norm(xs, m.row(1), m.row(0), eps)?;
    let y = s
        .attn1
        .forward(&h, &h, Some((call.rope, call.rope)), None)?;
    let xs = gated(xs, &y, m.row(2))?;
    let normed = rms_norm(&xs, None, eps)?;
    match &m.context {
        Some([shift_kv, scale_kv]) => {
            let q_in = modulate_to(&normed, m.row(7), m.row(6), normed.dtype())?;
            let ctx = modulate_to(call.context, scale_kv, shift_kv, normed.dtype())?;
            let y = s.attn2.forward(&q_in, &ctx, None, call.lens)?;
            gated(&xs, &y, m.row(8))
        }
        None => &xs + s.attn2.forward(&normed, call.context, None, call.lens)?,
    }
}

/// A stream's feed-forward on `xs` (differentiable).
fn ff_part(s: StreamRef, xs: &Tensor, m: &Modulation, eps: f64) -> Result<Tensor> {
    let h = ada_norm(xs, m.row(4), m.row(3), eps)?;
    gated(xs, &s.ff.forward(&h)?, m.row(5))
}

/// `transformer_blocks.N`: the video stream, and the audio stream with the audio-video cross-attentions when read
/// for joint training.
#[derive(Clone)]
pub struct Ltx2Block {
    pub attn1: Attention,
    pub attn2: Attention,
    pub ff: FeedForward,
    /// `scale_shift_table` [coefficient, dim].
    pub scale_shift_table: Tensor,
    /// `prompt_scale_shift_table` [2, dim] (LTX-2.3).
    pub prompt_scale_shift_table: Option<Tensor>,
    /// The audio stream (joint audio-video models only).
    pub audio: Option<AudioStream>,
    pub eps: f64,
    /// The block's place in its transformer (its rows in [`BlockInputs::rows`]); `None` for a block read alone.
    pub index: Option<usize>,
}

impl Ltx2Block {
    /// Reads the video stream of `transformer_blocks.N` under `vb`.
    pub fn load(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        Self::load_streams(vb, cfg, false)
    }

    /// Reads the video stream and, with `audio`, the audio stream and the audio-video cross-attentions.
    pub fn load_streams(vb: &Vb, cfg: &Ltx2Config, audio: bool) -> Result<Self> {
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
            audio: if audio {
                Some(AudioStream::load(vb, cfg)?)
            } else {
                None
            },
            eps: cfg.norm_eps,
            index: None,
        })
    }

    /// The block's linears by their path under the block (ltx-core's names), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = attention_linears([("attn1", &mut self.attn1), ("attn2", &mut self.attn2)]);
        out.push(("ff.net.0.proj".into(), &mut self.ff.proj_in));
        out.push(("ff.net.2".into(), &mut self.ff.proj_out));
        if let Some(audio) = self.audio.as_mut() {
            out.extend(audio.linears_mut());
        }
        out
    }

    pub(crate) fn video(&self) -> StreamRef<'_> {
        StreamRef {
            attn1: &self.attn1,
            attn2: &self.attn2,
            ff: &self.ff,
        }
    }

    /// The audio stream and the pass's audio inputs of a joint pass; `None` for a video-only pass; an error
    /// when audio tokens reach a block read without its audio stream.
    pub(crate) fn joint<'a>(
        &'a self,
        inputs: &'a BlockInputs,
    ) -> Result<Option<(&'a AudioStream, &'a AudioInputs)>> {
        match (&self.audio, &inputs.audio) {
            (Some(stream), Some(ai)) => Ok(Some((stream, ai))),
            (None, Some(_)) => candle_core::bail!(
                "LTX-2: audio latents given to a transformer read without its audio stream (load it with audio)"
            ),
            _ => Ok(None),
        }
    }

    /// The video stream's modulation vectors for this pass (the pass's rows of this block when formed at once).
    pub fn modulation(&self, inputs: &BlockInputs) -> Result<Modulation> {
        if let (Some(rows), Some(i), None) = (&inputs.rows, self.index, &inputs.pick) {
            if let Some(m) = rows.modulation(i)? {
                return Ok(m);
            }
        }
        let dtype = inputs.context.dtype();
        let b = inputs.context.dim(0)?;
        let prompt = self
            .prompt_scale_shift_table
            .as_ref()
            .map(|p| (p, inputs.prompt_timestep.as_ref()));
        let own = (
            &self.scale_shift_table,
            &inputs.timestep,
            inputs.pick.as_ref(),
        );
        modulation_of(own, prompt, b, dtype)
    }

    /// The audio stream's modulation vectors and the audio-video rows for this joint pass.
    pub(crate) fn audio_modulation(
        &self,
        stream: &AudioStream,
        inputs: &BlockInputs,
        ai: &AudioInputs,
    ) -> Result<(Modulation, AvModulation)> {
        let dtype = inputs.context.dtype();
        let b = inputs.context.dim(0)?;
        let prompt = stream
            .prompt_scale_shift_table
            .as_ref()
            .map(|p| (p, ai.prompt_timestep.as_ref()));
        let own = (&stream.scale_shift_table, &ai.timestep, None);
        let m = modulation_of(own, prompt, b, dtype)?;
        let video = (&stream.av_table_video, &ai.video_cross, &ai.video_gate);
        let audio = (&stream.av_table_audio, &ai.audio_cross, &ai.audio_gate);
        let av = AvModulation {
            video: av_rows(video, inputs.pick.as_ref(), b, dtype)?,
            audio: av_rows(audio, None, b, dtype)?,
        };
        Ok((m, av))
    }

    /// Runs the block on its input `xs` (differentiable): video tokens [b, l, dim], or in a joint pass both
    /// streams' tokens packed ([`AudioInputs::pack`]).
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        let m = self.modulation(inputs)?;
        let video_call = StreamCall {
            rope: &inputs.rope,
            context: &inputs.context,
            lens: inputs.context_lens.as_deref(),
        };
        let Some((stream, ai)) = self.joint(inputs)? else {
            let xs = attn_part(self.video(), xs, &m, video_call, self.eps)?;
            return ff_part(self.video(), &xs, &m, self.eps);
        };
        let (ma, av) = self.audio_modulation(stream, inputs, ai)?;
        let audio_ref = stream.stream();
        let (vx, ax) = ai.unpack(xs)?;
        let audio_call = StreamCall {
            rope: &ai.rope,
            context: &ai.context,
            lens: inputs.context_lens.as_deref(),
        };
        let vx = attn_part(self.video(), &vx, &m, video_call, self.eps)?;
        let ax = attn_part(audio_ref, &ax, &ma, audio_call, self.eps)?;
        let (mv, mav) = (&av.video, &av.audio);
        // Both directions read the streams as they are before either cross-attention.
        let vq = ada_norm(&vx, &mv[0], &mv[1], self.eps)?;
        let ak = ada_norm(&ax, &mav[0], &mav[1], self.eps)?;
        let ropes = (&ai.video_cross_rope, &ai.audio_cross_rope);
        let y = stream.audio_to_video.forward(&vq, &ak, Some(ropes), None)?;
        let aq = ada_norm(&ax, &mav[2], &mav[3], self.eps)?;
        let vk = ada_norm(&vx, &mv[2], &mv[3], self.eps)?;
        let ropes = (&ai.audio_cross_rope, &ai.video_cross_rope);
        let ya = stream.video_to_audio.forward(&aq, &vk, Some(ropes), None)?;
        let vx = gated(&vx, &y, &mv[4])?;
        let ax = gated(&ax, &ya, &mav[4])?;
        let vx = ff_part(self.video(), &vx, &m, self.eps)?;
        let ax = ff_part(audio_ref, &ax, &ma, self.eps)?;
        AudioInputs::pack(&vx, &ax)
    }
}

impl AudioStream {
    pub(crate) fn stream(&self) -> StreamRef<'_> {
        StreamRef {
            attn1: &self.attn1,
            attn2: &self.attn2,
            ff: &self.ff,
        }
    }
}
