//! One decoder layer of the Qwen2.5-VL language model (`Qwen2_5_VLDecoderLayer`): RMSNorm, grouped-query
//! self-attention with q/k/v biases, rotary positions (multimodal ones here; the rest in `crate::decoder`) and a
//! causal + padding mask, RMSNorm, SwiGLU MLP, each with a residual. Fields are named like the checkpoint's keys (`self_attn.q_proj`, `mlp.gate_proj`,
//! `input_layernorm`). Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor};

use super::Qwen25VlTextConfig;
pub use crate::decoder::{attention_bias, Rope};
use crate::decoder::{Activation, Attention, AttentionShape, GatedMlp, HeadNorm};
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// `1 / θ^(2i/d)` for the `head_dim / 2` frequencies (computed in f64, as transformers does, then f32).
fn inv_freq(cfg: &Qwen25VlTextConfig) -> Vec<f32> {
    let d = cfg.head_dim();
    (0..d / 2)
        .map(|i| (1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64)) as f32)
        .collect()
}

/// The rotary tables [1, 1, l, head_dim] of positions 0..l, in `dtype` on `device` (angles in f32).
///
/// Qwen2.5-VL's multimodal RoPE gives each token a (time, height, width) position and takes the frequencies of
/// each `mrope_section` part from one of them. Text tokens have all three equal (transformers builds them as
/// `arange(l)` expanded to 3 rows), so every part reads the same angles and the table is ordinary 1-D RoPE over
/// `cat(freqs, freqs)`; the parity fixture, made through the multimodal path, checks this.
pub fn rope(cfg: &Qwen25VlTextConfig, l: usize, dtype: DType, device: &Device) -> Result<Rope> {
    Rope::sequential(inv_freq(cfg), l, dtype, device)
}

/// The rotary tables [b, 1, l, head_dim] of multimodal positions: `positions[row]` holds the (time, height, width)
/// position of each of the row's first tokens (the rest are padding, at position 0), and frequency `i` takes its
/// angle from the axis of the `mrope_section` part it falls in (`recomposition_frequencies`).
pub fn rope_from_positions(
    cfg: &Qwen25VlTextConfig,
    positions: &[[Vec<u32>; 3]],
    l: usize,
    dtype: DType,
    device: &Device,
) -> Result<Rope> {
    let d = cfg.head_dim();
    let inv_freq = inv_freq(cfg);
    let axis: Vec<usize> = cfg
        .mrope_section
        .iter()
        .enumerate()
        .flat_map(|(part, &n)| std::iter::repeat_n(part % 3, n))
        .collect();
    if axis.len() != d / 2 {
        candle_core::bail!(
            "Qwen2.5-VL: mrope_section {:?} does not cover {} frequencies",
            cfg.mrope_section,
            d / 2
        );
    }
    let b = positions.len();
    let mut emb = vec![0f32; b * l * d];
    for (row, pos) in positions.iter().enumerate() {
        if pos.iter().any(|p| p.len() > l) {
            candle_core::bail!("Qwen2.5-VL: more positions than the {l} tokens of a row");
        }
        for j in 0..pos[0].len() {
            let at = (row * l + j) * d;
            for (i, (&f, &a)) in inv_freq.iter().zip(&axis).enumerate() {
                let angle = pos[a].get(j).copied().unwrap_or(0) as f32 * f;
                emb[at + i] = angle;
                emb[at + i + d / 2] = angle;
            }
        }
    }
    Rope::from_angles(&Tensor::from_vec(emb, (b, 1, l, d), device)?, dtype)
}

/// No q / k norms in Qwen2.5-VL's attention.
pub enum NoHeadNorm {}

impl HeadNorm for NoHeadNorm {
    fn forward(&self, _: &Tensor) -> Result<Tensor> {
        match *self {}
    }

    fn to_device(&self, _: &Device) -> Result<Self> {
        match *self {}
    }
}

/// `Qwen2_5_VLDecoderLayer`.
pub struct DecoderLayer {
    input_layernorm: Tensor,
    /// `Qwen2_5_VLAttention`: q/k/v biases, scores scaled by `head_dim^-0.5`.
    self_attn: Attention<NoHeadNorm>,
    post_attention_layernorm: Tensor,
    /// `Qwen2MLP`: `down(silu(gate(x)) · up(x))`.
    mlp: GatedMlp,
    eps: f64,
}

impl DecoderLayer {
    /// Builds layer `vb` (`layers.{i}`) from the checkpoint's names.
    pub fn new(cfg: &Qwen25VlTextConfig, vb: &Vb) -> Result<Self> {
        Ok(Self {
            input_layernorm: vb.pp("input_layernorm").get(cfg.hidden_size, "weight")?,
            self_attn: Attention::new(
                AttentionShape {
                    hidden: cfg.hidden_size,
                    num_heads: cfg.num_attention_heads,
                    num_kv_heads: cfg.num_key_value_heads,
                    head_dim: cfg.head_dim(),
                    scaling: (cfg.head_dim() as f64).powf(-0.5),
                },
                &vb.pp("self_attn"),
                None,
            )?,
            post_attention_layernorm: vb
                .pp("post_attention_layernorm")
                .get(cfg.hidden_size, "weight")?,
            mlp: GatedMlp::new(
                cfg.hidden_size,
                cfg.intermediate_size,
                Activation::Silu,
                &vb.pp("mlp"),
            )?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// The layer applied to `xs` [b, l, hidden] with `bias` from [`attention_bias`].
    pub fn forward(&self, xs: &Tensor, rope: &Rope, bias: &Tensor) -> Result<Tensor> {
        let h = rms_norm(xs, Some(&self.input_layernorm), self.eps)?;
        let xs = (xs + self.self_attn.forward(&h, rope, bias)?)?;
        let h = rms_norm(&xs, Some(&self.post_attention_layernorm), self.eps)?;
        xs + self.mlp.forward(&h)?
    }

    /// A copy of the layer on `device` (a streamed layer's trip from host memory to the accelerator).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            input_layernorm: self.input_layernorm.to_device(device)?,
            self_attn: self.self_attn.to_device(device)?,
            post_attention_layernorm: self.post_attention_layernorm.to_device(device)?,
            mlp: self.mlp.to_device(device)?,
            eps: self.eps,
        })
    }
}
