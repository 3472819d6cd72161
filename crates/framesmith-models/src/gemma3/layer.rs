//! One decoder layer of Gemma 3's language model (`Gemma3DecoderLayer` of transformers) and what it needs: the
//! `(1 + w)` RMSNorm computed in f32, rotary tables per layer type (the local base on sliding layers, the global base
//! with linear position scaling on full ones), the causal + padding mask with the sliding window, grouped-query
//! attention with q / k RMSNorms over the head width and scores scaled by `query_pre_attn_scalar^-0.5`, and the
//! GELU-tanh gated MLP; the layer normalises before and after both its attention and its MLP (four norms). Fields
//! are named like the checkpoint's keys (`self_attn.q_proj`, `mlp.gate_proj`, `pre_feedforward_layernorm`).
//! Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor, D};

use super::config::{Gemma3TextConfig, LayerType, RopeParams};
use crate::qwen25vl::layer::linear_to_device;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::ops::{gelu_tanh, softmax_last_dim};
use framesmith_nn::vb::Vb;

/// `Gemma3RMSNorm`: `x · rsqrt(mean(x²) + eps) · (1 + w)` in f32, returned in `xs`' dtype.
#[derive(Clone)]
pub struct GemmaRmsNorm {
    /// `1 + weight`, f32.
    scale: Tensor,
    eps: f64,
}

impl GemmaRmsNorm {
    /// Reads `weight` [dim] under `vb` (kept in f32, as the official norm computes with it).
    pub fn load(vb: &Vb, dim: usize, eps: f64) -> Result<Self> {
        let weight = vb.with_dtype(DType::F32).get(dim, "weight")?;
        Ok(Self {
            scale: (weight + 1.0)?,
            eps,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        rms_norm(&xs.to_dtype(DType::F32)?, Some(&self.scale), self.eps)?.to_dtype(xs.dtype())
    }

    fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            scale: self.scale.to_device(device)?,
            eps: self.eps,
        })
    }
}

/// The cosine and sine tables [1, 1, l, head_dim] of positions 0..l for one layer type, in the compute dtype.
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// transformers' `Gemma3RotaryEmbedding` for `params`: `inv_freq = 1 / θ^(2i/d)` in f32 (divided by the
    /// linear factor), angles `pos · inv_freq` in f32, `cat(freqs, freqs)`.
    pub fn new(
        params: RopeParams,
        head_dim: usize,
        l: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let d = head_dim;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| {
                1.0 / (params.theta as f32).powf((2 * i) as f32 / d as f32)
                    / params.linear_factor as f32
            })
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, d / 2), device)?;
        let pos = Tensor::arange(0u32, l as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((l, 1))?;
        let freqs = pos.broadcast_mul(&inv_freq)?;
        let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?.reshape((1, 1, l, d))?;
        Ok(Self {
            cos: emb.cos()?.to_dtype(dtype)?,
            sin: emb.sin()?.to_dtype(dtype)?,
        })
    }

    /// `x·cos + rotate_half(x)·sin` for `xs` [b, heads, l, head_dim].
    fn apply(&self, xs: &Tensor) -> Result<Tensor> {
        let half = xs.dim(D::Minus1)? / 2;
        let x1 = xs.narrow(D::Minus1, 0, half)?;
        let x2 = xs.narrow(D::Minus1, half, half)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        xs.broadcast_mul(&self.cos)? + rotated.broadcast_mul(&self.sin)?
    }
}

/// The additive attention bias [b, 1, 1, l, l] in f32: 0 where query i may see key j (j ≤ i, key j a token of
/// `mask` [b, l], and with `window` also i − j < window), a large negative value elsewhere. Finite, so a padding
/// query with no visible key averages every key instead of giving NaN (padding is dropped by the callers).
pub fn attention_bias(mask: &Tensor, window: Option<usize>) -> Result<Tensor> {
    let (b, l) = mask.dims2()?;
    let keep = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let mut bias = vec![0f32; b * l * l];
    for (s, row) in keep.iter().enumerate() {
        for i in 0..l {
            for (j, &k) in row.iter().enumerate() {
                let outside = window.is_some_and(|w| i >= j + w);
                if j > i || k == 0.0 || outside {
                    bias[(s * l + i) * l + j] = -1e30;
                }
            }
        }
    }
    Tensor::from_vec(bias, (b, 1, 1, l, l), mask.device())
}

/// `Gemma3Attention`.
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: GemmaRmsNorm,
    k_norm: GemmaRmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    scaling: f64,
}

impl Attention {
    fn new(cfg: &Gemma3TextConfig, vb: &Vb) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        Ok(Self {
            q_proj: Linear::load(&vb.pp("q_proj"), h, q)?,
            k_proj: Linear::load(&vb.pp("k_proj"), h, kv)?,
            v_proj: Linear::load(&vb.pp("v_proj"), h, kv)?,
            o_proj: Linear::load(&vb.pp("o_proj"), q, h)?,
            q_norm: GemmaRmsNorm::load(&vb.pp("q_norm"), d, cfg.rms_norm_eps)?,
            k_norm: GemmaRmsNorm::load(&vb.pp("k_norm"), d, cfg.rms_norm_eps)?,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: d,
            scaling: cfg.query_pre_attn_scalar.powf(-0.5),
        })
    }

    /// Self-attention of `xs` [b, l, hidden]; scores and softmax in f32. The query heads sharing a key/value head
    /// are stacked along the sequence, so keys and values are never repeated.
    fn forward(&self, xs: &Tensor, rope: &Rope, bias: &Tensor) -> Result<Tensor> {
        let (b, l, _) = xs.dims3()?;
        let (kvh, d) = (self.num_kv_heads, self.head_dim);
        let group = self.num_heads / kvh;
        let heads = |t: Tensor, n: usize, norm: &GemmaRmsNorm| -> Result<Tensor> {
            norm.forward(&t.reshape((b, l, n, d))?)?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = rope.apply(&heads(
            self.q_proj.forward(xs)?,
            self.num_heads,
            &self.q_norm,
        )?)?;
        let k = rope.apply(&heads(self.k_proj.forward(xs)?, kvh, &self.k_norm)?)?;
        let v = self
            .v_proj
            .forward(xs)?
            .reshape((b, l, kvh, d))?
            .transpose(1, 2)?
            .contiguous()?;
        let q = q.reshape((b, kvh, group * l, d))?;
        let scores = (q.matmul(&k.t()?)? * self.scaling)?
            .to_dtype(DType::F32)?
            .reshape((b, kvh, group, l, l))?
            .broadcast_add(bias)?;
        let probs =
            softmax_last_dim(&scores)?
                .to_dtype(xs.dtype())?
                .reshape((b, kvh, group * l, l))?;
        let out = probs
            .matmul(&v)?
            .reshape((b, self.num_heads, l, d))?
            .transpose(1, 2)?
            .reshape((b, l, self.num_heads * d))?;
        self.o_proj.forward(&out)
    }

    fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            q_proj: linear_to_device(&self.q_proj, device)?,
            k_proj: linear_to_device(&self.k_proj, device)?,
            v_proj: linear_to_device(&self.v_proj, device)?,
            o_proj: linear_to_device(&self.o_proj, device)?,
            q_norm: self.q_norm.to_device(device)?,
            k_norm: self.k_norm.to_device(device)?,
            ..*self
        })
    }
}

/// `Gemma3MLP`: `down(gelu_tanh(gate(x)) · up(x))`.
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn new(cfg: &Gemma3TextConfig, vb: &Vb) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: Linear::load(&vb.pp("gate_proj"), h, i)?,
            up_proj: Linear::load(&vb.pp("up_proj"), h, i)?,
            down_proj: Linear::load(&vb.pp("down_proj"), i, h)?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let gated = (gelu_tanh(&self.gate_proj.forward(xs)?)? * self.up_proj.forward(xs)?)?;
        self.down_proj.forward(&gated)
    }

    fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            gate_proj: linear_to_device(&self.gate_proj, device)?,
            up_proj: linear_to_device(&self.up_proj, device)?,
            down_proj: linear_to_device(&self.down_proj, device)?,
        })
    }
}

/// `Gemma3DecoderLayer`.
pub struct DecoderLayer {
    input_layernorm: GemmaRmsNorm,
    self_attn: Attention,
    post_attention_layernorm: GemmaRmsNorm,
    pre_feedforward_layernorm: GemmaRmsNorm,
    mlp: Mlp,
    post_feedforward_layernorm: GemmaRmsNorm,
    /// Sliding or full attention.
    pub kind: LayerType,
}

impl DecoderLayer {
    /// Builds layer `vb` (`layers.{i}`) of type `kind` from the checkpoint's names.
    pub fn new(cfg: &Gemma3TextConfig, vb: &Vb, kind: LayerType) -> Result<Self> {
        let norm = |name: &str| GemmaRmsNorm::load(&vb.pp(name), cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_layernorm: norm("input_layernorm")?,
            self_attn: Attention::new(cfg, &vb.pp("self_attn"))?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            mlp: Mlp::new(cfg, &vb.pp("mlp"))?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
            kind,
        })
    }

    /// The layer applied to `xs` [b, l, hidden] with its type's `rope` and `bias` ([`attention_bias`]).
    pub fn forward(&self, xs: &Tensor, rope: &Rope, bias: &Tensor) -> Result<Tensor> {
        let h = self.input_layernorm.forward(xs)?;
        let h = self.self_attn.forward(&h, rope, bias)?;
        let xs = (xs + self.post_attention_layernorm.forward(&h)?)?;
        let h = self.pre_feedforward_layernorm.forward(&xs)?;
        let h = self.mlp.forward(&h)?;
        xs + self.post_feedforward_layernorm.forward(&h)?
    }

    /// A copy of the layer on `device` (a streamed layer's trip from host memory to the accelerator).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            input_layernorm: self.input_layernorm.to_device(device)?,
            self_attn: self.self_attn.to_device(device)?,
            post_attention_layernorm: self.post_attention_layernorm.to_device(device)?,
            pre_feedforward_layernorm: self.pre_feedforward_layernorm.to_device(device)?,
            mlp: self.mlp.to_device(device)?,
            post_feedforward_layernorm: self.post_feedforward_layernorm.to_device(device)?,
            kind: self.kind,
        })
    }
}
