//! One block of the Qwen2.5-VL vision tower (`Qwen2_5_VLVisionBlock`): RMSNorm, attention within segments
//! (windows, or whole frames in the full-attention blocks) with the 2-D rotary embedding, RMSNorm, SwiGLU MLP with
//! biases, each with a residual. Fields are named like the checkpoint's keys (`attn.qkv`, `mlp.gate_proj`,
//! `norm1`). Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor, D};

use super::Qwen25VlVisionConfig;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// Bytes of attention scores computed at once; heads are taken in groups that stay under it (a 1024² image's
/// full-attention block would otherwise hold 16 heads × 5476² scores).
const SCORE_BYTES: usize = 512 << 20;

/// Attention segments of a token sequence: contiguous runs that attend only among themselves, gathered into a
/// padded batch [segments, longest] and scattered back.
pub struct Segments {
    /// Token taken for each (segment, slot); padding slots repeat token 0. `None`: the identity (equal runs).
    gather: Option<Tensor>,
    /// Row of each token in the padded batch. `None` with `gather`.
    scatter: Option<Tensor>,
    /// Additive bias [segments, 1, 1, longest] (f32) hiding the padding keys; `None` without padding.
    bias: Option<Tensor>,
    count: usize,
    longest: usize,
}

impl Segments {
    /// The segments between consecutive boundaries of `cu` (cumulative lengths from 0).
    pub fn new(cu: &[usize], device: &Device) -> Result<Self> {
        let lens: Vec<usize> = cu.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
        let (count, longest) = (lens.len(), lens.iter().copied().max().unwrap_or(0));
        if lens.iter().all(|&n| n == longest) {
            return Ok(Self {
                gather: None,
                scatter: None,
                bias: None,
                count,
                longest,
            });
        }
        let mut gather = vec![0u32; count * longest];
        let mut scatter = Vec::with_capacity(cu.last().copied().unwrap_or(0));
        let mut bias = vec![0f32; count * longest];
        for (s, (&start, &n)) in cu.iter().zip(&lens).enumerate() {
            for j in 0..longest {
                if j < n {
                    gather[s * longest + j] = (start + j) as u32;
                    scatter.push((s * longest + j) as u32);
                } else {
                    bias[s * longest + j] = f32::NEG_INFINITY;
                }
            }
        }
        let scatter_len = scatter.len();
        Ok(Self {
            gather: Some(Tensor::from_vec(gather, count * longest, device)?),
            scatter: Some(Tensor::from_vec(scatter, scatter_len, device)?),
            bias: Some(Tensor::from_vec(bias, (count, 1, 1, longest), device)?),
            count,
            longest,
        })
    }

    /// `xs` [n, ...] as [segments × longest, ...].
    fn pack(&self, xs: &Tensor) -> Result<Tensor> {
        match &self.gather {
            Some(g) => xs.contiguous()?.index_select(g, 0),
            None => Ok(xs.clone()),
        }
    }

    /// `xs` [segments × longest, ...] back as [n, ...].
    fn unpack(&self, xs: &Tensor) -> Result<Tensor> {
        match &self.scatter {
            Some(s) => xs.contiguous()?.index_select(s, 0),
            None => Ok(xs.clone()),
        }
    }
}

/// `x·cos + rotate_half(x)·sin` in f32 for `xs` [n, heads, head_dim] and tables [n, head_dim] (f32), returned
/// in `xs`' dtype (`apply_rotary_pos_emb_vision`).
fn rotate(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let x = xs.to_dtype(DType::F32)?;
    let half = x.dim(D::Minus1)? / 2;
    let rotated = Tensor::cat(
        &[
            &x.narrow(D::Minus1, half, half)?.neg()?,
            &x.narrow(D::Minus1, 0, half)?,
        ],
        D::Minus1,
    )?;
    let out =
        (x.broadcast_mul(&cos.unsqueeze(1)?)? + rotated.broadcast_mul(&sin.unsqueeze(1)?)?)?;
    out.to_dtype(xs.dtype())
}

/// `Qwen2_5_VLVisionAttention`.
struct Attention {
    qkv: Linear,
    proj: Linear,
    num_heads: usize,
}

impl Attention {
    /// Attention of `xs` [n, hidden] within `segments`; scores and softmax in f32.
    fn forward(&self, xs: &Tensor, rope: &(Tensor, Tensor), segments: &Segments) -> Result<Tensor> {
        let (n, hidden) = xs.dims2()?;
        let (heads, d) = (self.num_heads, hidden / self.num_heads);
        let qkv = self.qkv.forward(xs)?.reshape((n, 3, heads, d))?;
        let part = |i: usize| qkv.narrow(1, i, 1)?.squeeze(1);
        let q = rotate(&part(0)?, &rope.0, &rope.1)?;
        let k = rotate(&part(1)?, &rope.0, &rope.1)?;
        let (s, l) = (segments.count, segments.longest);
        let batch = |t: &Tensor| -> Result<Tensor> {
            segments
                .pack(t)?
                .reshape((s, l, heads, d))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (batch(&q)?, batch(&k)?, batch(&part(2)?)?);
        let group = (SCORE_BYTES / (s * l * l * 4).max(1)).clamp(1, heads);
        let mut outs = Vec::with_capacity(heads.div_ceil(group));
        for h0 in (0..heads).step_by(group) {
            let g = group.min(heads - h0);
            let (q, k, v) = (
                q.narrow(1, h0, g)?,
                k.narrow(1, h0, g)?,
                v.narrow(1, h0, g)?,
            );
            let mut scores = (q.matmul(&k.t()?)? * (d as f64).powf(-0.5))?.to_dtype(DType::F32)?;
            if let Some(bias) = &segments.bias {
                scores = scores.broadcast_add(bias)?;
            }
            let probs = framesmith_nn::ops::softmax_last_dim(&scores)?.to_dtype(xs.dtype())?;
            outs.push(probs.matmul(&v)?);
        }
        let out = Tensor::cat(&outs, 1)?
            .transpose(1, 2)?
            .reshape((s * l, hidden))?;
        self.proj.forward(&segments.unpack(&out)?)
    }
}

/// `Qwen2_5_VLMLP` with biases: `down(silu(gate(x)) · up(x))`.
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let gated = (self.gate_proj.forward(xs)?.silu()? * self.up_proj.forward(xs)?)?;
        self.down_proj.forward(&gated)
    }
}

/// `Qwen2_5_VLVisionBlock`.
pub struct VisionBlock {
    norm1: Tensor,
    attn: Attention,
    norm2: Tensor,
    mlp: Mlp,
}

/// RMSNorm epsilon of every vision norm.
pub const EPS: f64 = 1e-6;

impl VisionBlock {
    /// Builds block `vb` (`blocks.{i}`) from the checkpoint's names.
    pub fn new(cfg: &Qwen25VlVisionConfig, vb: &Vb) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let mlp = vb.pp("mlp");
        Ok(Self {
            norm1: vb.pp("norm1").get(h, "weight")?,
            attn: Attention {
                qkv: Linear::load(&vb.pp("attn").pp("qkv"), h, 3 * h)?,
                proj: Linear::load(&vb.pp("attn").pp("proj"), h, h)?,
                num_heads: cfg.num_heads,
            },
            norm2: vb.pp("norm2").get(h, "weight")?,
            mlp: Mlp {
                gate_proj: Linear::load(&mlp.pp("gate_proj"), h, i)?,
                up_proj: Linear::load(&mlp.pp("up_proj"), h, i)?,
                down_proj: Linear::load(&mlp.pp("down_proj"), i, h)?,
            },
        })
    }

    /// The block applied to `xs` [n, hidden] (tokens in window order) with the rotary tables (cos, sin)
    /// [n, head_dim] in f32.
    pub fn forward(
        &self,
        xs: &Tensor,
        rope: &(Tensor, Tensor),
        segments: &Segments,
    ) -> Result<Tensor> {
        let h = rms_norm(xs, Some(&self.norm1), EPS)?;
        let xs = (xs + self.attn.forward(&h, rope, segments)?)?;
        let h = rms_norm(&xs, Some(&self.norm2), EPS)?;
        xs + self.mlp.forward(&h)?
    }
}
