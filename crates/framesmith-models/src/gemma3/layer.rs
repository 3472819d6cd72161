//! One decoder layer of Gemma 3's language model (`Gemma3DecoderLayer` of transformers) and what differs in it
//! from the shared parts of `crate::decoder`: the `(1 + w)` RMSNorm computed in f32, rotary tables per layer type
//! (the local base on sliding layers, the global base with linear position scaling on full ones), q / k RMSNorms
//! over the head width and scores scaled by `query_pre_attn_scalar^-0.5`, the GELU-tanh gated MLP, and norms
//! before and after both its attention and its MLP (four norms). Fields
//! are named like the checkpoint's keys (`self_attn.q_proj`, `mlp.gate_proj`, `pre_feedforward_layernorm`).
//! Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor};

use super::config::{Gemma3TextConfig, LayerType, RopeParams};
pub use crate::decoder::{attention_bias, Rope};
use crate::decoder::{Activation, Attention, AttentionShape, GatedMlp, HeadNorm};
use framesmith_nn::norm::rms_norm;
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

/// The rotary tables of positions 0..l for one layer type: transformers' `Gemma3RotaryEmbedding` for `params`,
/// `inv_freq = 1 / θ^(2i/d)` in f32 (divided by the linear factor), angles `pos · inv_freq` in f32,
/// `cat(freqs, freqs)`.
pub fn rope(
    params: RopeParams,
    head_dim: usize,
    l: usize,
    dtype: DType,
    device: &Device,
) -> Result<Rope> {
    let d = head_dim;
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|i| {
            1.0 / (params.theta as f32).powf((2 * i) as f32 / d as f32)
                / params.linear_factor as f32
        })
        .collect();
    Rope::sequential(inv_freq, l, dtype, device)
}

impl HeadNorm for GemmaRmsNorm {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        GemmaRmsNorm::forward(self, xs)
    }

    fn to_device(&self, device: &Device) -> Result<Self> {
        GemmaRmsNorm::to_device(self, device)
    }
}

/// `Gemma3Attention`: q / k norms over the head width, scores scaled by `query_pre_attn_scalar^-0.5`.
fn attention(cfg: &Gemma3TextConfig, vb: &Vb) -> Result<Attention<GemmaRmsNorm>> {
    let d = cfg.head_dim;
    let shape = AttentionShape {
        hidden: cfg.hidden_size,
        num_heads: cfg.num_attention_heads,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: d,
        scaling: cfg.query_pre_attn_scalar.powf(-0.5),
    };
    let qk_norm = (
        GemmaRmsNorm::load(&vb.pp("q_norm"), d, cfg.rms_norm_eps)?,
        GemmaRmsNorm::load(&vb.pp("k_norm"), d, cfg.rms_norm_eps)?,
    );
    Attention::new(shape, vb, Some(qk_norm))
}

/// `Gemma3DecoderLayer`.
pub struct DecoderLayer {
    input_layernorm: GemmaRmsNorm,
    self_attn: Attention<GemmaRmsNorm>,
    post_attention_layernorm: GemmaRmsNorm,
    pre_feedforward_layernorm: GemmaRmsNorm,
    /// `Gemma3MLP`: `down(gelu_tanh(gate(x)) · up(x))`.
    mlp: GatedMlp,
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
            self_attn: attention(cfg, &vb.pp("self_attn"))?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            mlp: GatedMlp::new(
                cfg.hidden_size,
                cfg.intermediate_size,
                Activation::GeluTanh,
                &vb.pp("mlp"),
            )?,
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
