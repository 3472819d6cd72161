//! One decoder layer of the Qwen2.5-VL language model (`Qwen2_5_VLDecoderLayer`): RMSNorm, grouped-query
//! self-attention with q/k/v biases, rotary positions and a causal + padding mask, RMSNorm, SwiGLU MLP, each with
//! a residual. Fields are named like the checkpoint's keys (`self_attn.q_proj`, `mlp.gate_proj`,
//! `input_layernorm`). Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor, D};

use super::Qwen25VlTextConfig;
use framesmith_nn::linear::{BaseWeight, Linear};
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// The cosine and sine tables [1, 1, l, head_dim] of positions 0..l.
///
/// Qwen2.5-VL's multimodal RoPE gives each token a (time, height, width) position and takes the frequencies of
/// each `mrope_section` part from one of them. Text tokens have all three equal (transformers builds them as
/// `arange(l)` expanded to 3 rows), so every part reads the same angles and the table is ordinary 1-D RoPE over
/// `cat(freqs, freqs)`; the parity fixture, made through the multimodal path, checks this.
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// The tables for `l` positions in `dtype` on `device` (angles computed in f32, as transformers does).
    pub fn new(cfg: &Qwen25VlTextConfig, l: usize, dtype: DType, device: &Device) -> Result<Self> {
        let d = cfg.head_dim();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| (1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64)) as f32)
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

    /// The tables [b, 1, l, head_dim] of multimodal positions: `positions[row]` holds the (time, height, width)
    /// position of each of the row's first tokens (the rest are padding, at position 0), and frequency `i` takes
    /// its angle from the axis of the `mrope_section` part it falls in (`recomposition_frequencies`).
    pub fn from_positions(
        cfg: &Qwen25VlTextConfig,
        positions: &[[Vec<u32>; 3]],
        l: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let d = cfg.head_dim();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| (1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64)) as f32)
            .collect();
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
        let emb = Tensor::from_vec(emb, (b, 1, l, d), device)?;
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

/// The additive attention bias [b, 1, 1, l, l] in f32: 0 where query i may see key j (j ≤ i and key j is a token
/// of `mask` [b, l]), a large negative value elsewhere. Finite, so a query with no visible key (left padding)
/// gets a uniform average instead of NaN; such positions are padding, which callers drop.
pub fn attention_bias(mask: &Tensor) -> Result<Tensor> {
    let (b, l) = mask.dims2()?;
    let keep = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let mut bias = vec![0f32; b * l * l];
    for (s, row) in keep.iter().enumerate() {
        for i in 0..l {
            for (j, &k) in row.iter().enumerate() {
                if j > i || k == 0.0 {
                    bias[(s * l + i) * l + j] = -1e30;
                }
            }
        }
    }
    Tensor::from_vec(bias, (b, 1, 1, l, l), mask.device())
}

/// `Qwen2_5_VLAttention`.
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn new(cfg: &Qwen25VlTextConfig, vb: &Vb) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim());
        let kv = cfg.num_key_value_heads * d;
        Ok(Self {
            q_proj: Linear::load(&vb.pp("q_proj"), h, cfg.num_attention_heads * d)?,
            k_proj: Linear::load(&vb.pp("k_proj"), h, kv)?,
            v_proj: Linear::load(&vb.pp("v_proj"), h, kv)?,
            o_proj: Linear::load(&vb.pp("o_proj"), cfg.num_attention_heads * d, h)?,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: d,
        })
    }

    /// Self-attention of `xs` [b, l, hidden]; scores and softmax in f32. The query heads sharing a key/value head
    /// are stacked along the sequence, so keys and values are never repeated.
    fn forward(&self, xs: &Tensor, rope: &Rope, bias: &Tensor) -> Result<Tensor> {
        let (b, l, _) = xs.dims3()?;
        let (kvh, d) = (self.num_kv_heads, self.head_dim);
        let group = self.num_heads / kvh;
        let heads = |t: Tensor, n: usize| -> Result<Tensor> {
            t.reshape((b, l, n, d))?.transpose(1, 2)?.contiguous()
        };
        let q = rope.apply(&heads(self.q_proj.forward(xs)?, self.num_heads)?)?;
        let k = rope.apply(&heads(self.k_proj.forward(xs)?, kvh)?)?;
        let v = heads(self.v_proj.forward(xs)?, kvh)?;
        let q = q.reshape((b, kvh, group * l, d))?;
        let scores = (q.matmul(&k.t()?)? * (d as f64).powf(-0.5))?
            .to_dtype(DType::F32)?
            .reshape((b, kvh, group, l, l))?
            .broadcast_add(bias)?;
        let probs = framesmith_nn::ops::softmax_last_dim(&scores)?
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
            ..*self
        })
    }
}

/// `Qwen2MLP`: `down(silu(gate(x)) · up(x))`.
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn new(cfg: &Qwen25VlTextConfig, vb: &Vb) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: Linear::load(&vb.pp("gate_proj"), h, i)?,
            up_proj: Linear::load(&vb.pp("up_proj"), h, i)?,
            down_proj: Linear::load(&vb.pp("down_proj"), i, h)?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let gated = (self.gate_proj.forward(xs)?.silu()? * self.up_proj.forward(xs)?)?;
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

/// A copy of `linear` on `device` (FP8 bases stay FP8).
pub(crate) fn linear_to_device(linear: &Linear, device: &Device) -> Result<Linear> {
    let base = match linear.base() {
        BaseWeight::Dense(w) => BaseWeight::Dense(w.to_device(device)?),
        BaseWeight::Fp8(w) => BaseWeight::Fp8(w.to_device(device)?),
    };
    let bias = linear.bias().map(|b| b.to_device(device)).transpose()?;
    Ok(Linear::from_base(base, bias))
}

/// `Qwen2_5_VLDecoderLayer`.
pub struct DecoderLayer {
    input_layernorm: Tensor,
    self_attn: Attention,
    post_attention_layernorm: Tensor,
    mlp: Mlp,
    eps: f64,
}

impl DecoderLayer {
    /// Builds layer `vb` (`layers.{i}`) from the checkpoint's names.
    pub fn new(cfg: &Qwen25VlTextConfig, vb: &Vb) -> Result<Self> {
        Ok(Self {
            input_layernorm: vb.pp("input_layernorm").get(cfg.hidden_size, "weight")?,
            self_attn: Attention::new(cfg, &vb.pp("self_attn"))?,
            post_attention_layernorm: vb
                .pp("post_attention_layernorm")
                .get(cfg.hidden_size, "weight")?,
            mlp: Mlp::new(cfg, &vb.pp("mlp"))?,
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
