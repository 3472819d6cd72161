//! The parts a decoder-only language encoder's layer is made of, shared by the encoders that read a language
//! model's hidden states (`qwen25vl`, `gemma3`): rotary tables and their application, the causal + padding (and
//! sliding-window) attention bias, grouped-query self-attention with optional q/k norms, and the gated MLP. Each
//! encoder keeps in its own folder what differs: its norms, how it builds its rotary angles, and the order of norms
//! and residuals in its layer. Frozen: inference only.

use candle_core::{DType, Device, Result, Tensor, D};

use framesmith_nn::linear::{BaseWeight, Linear};
use framesmith_nn::ops::{gelu_tanh, softmax_last_dim};
use framesmith_nn::vb::Vb;

/// The cosine and sine tables [1 or b, 1, l, head_dim] of a layer's rotary positions, in the compute dtype.
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// The tables of `emb` (the angles, f32, last dimension `cat(freqs, freqs)`) in `dtype`.
    pub fn from_angles(emb: &Tensor, dtype: DType) -> Result<Self> {
        Ok(Self {
            cos: emb.cos()?.to_dtype(dtype)?,
            sin: emb.sin()?.to_dtype(dtype)?,
        })
    }

    /// The tables [1, 1, l, 2 · inv_freq.len()] of positions 0..l: angles `pos · inv_freq` in f32,
    /// `cat(freqs, freqs)`.
    pub fn sequential(inv_freq: Vec<f32>, l: usize, dtype: DType, device: &Device) -> Result<Self> {
        let half = inv_freq.len();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let pos = Tensor::arange(0u32, l as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((l, 1))?;
        let freqs = pos.broadcast_mul(&inv_freq)?;
        let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?.reshape((1, 1, l, 2 * half))?;
        Self::from_angles(&emb, dtype)
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

/// A copy of `linear` on `device` (FP8 bases stay FP8).
pub fn linear_to_device(linear: &Linear, device: &Device) -> Result<Linear> {
    let base = match linear.base() {
        BaseWeight::Dense(w) => BaseWeight::Dense(w.to_device(device)?),
        BaseWeight::Fp8(w) => BaseWeight::Fp8(w.to_device(device)?),
    };
    let bias = linear.bias().map(|b| b.to_device(device)).transpose()?;
    Ok(Linear::from_base(base, bias))
}

/// A norm over the last dimension, applied to the query and key heads [b, l, heads, head_dim] before RoPE.
pub trait HeadNorm: Sized {
    fn forward(&self, xs: &Tensor) -> Result<Tensor>;
    /// A copy on `device`.
    fn to_device(&self, device: &Device) -> Result<Self>;
}

/// The sizes of a grouped-query self-attention.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub hidden: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// What the scores are multiplied by (`head_dim^-0.5`, or a model's own scalar).
    pub scaling: f64,
}

/// Grouped-query self-attention (`self_attn.{q,k,v,o}_proj`, biases where the checkpoint has them), with the
/// query and key heads normalised by `N` (`q_norm`, `k_norm`) when the model has them.
pub struct Attention<N> {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// `(q_norm, k_norm)`.
    qk_norm: Option<(N, N)>,
    shape: AttentionShape,
}

impl<N: HeadNorm> Attention<N> {
    /// Reads the projections under `vb`; `qk_norm`: the model's q and k norms, already read.
    pub fn new(shape: AttentionShape, vb: &Vb, qk_norm: Option<(N, N)>) -> Result<Self> {
        let AttentionShape {
            hidden: h,
            head_dim: d,
            ..
        } = shape;
        let (q, kv) = (shape.num_heads * d, shape.num_kv_heads * d);
        Ok(Self {
            q_proj: Linear::load(&vb.pp("q_proj"), h, q)?,
            k_proj: Linear::load(&vb.pp("k_proj"), h, kv)?,
            v_proj: Linear::load(&vb.pp("v_proj"), h, kv)?,
            o_proj: Linear::load(&vb.pp("o_proj"), q, h)?,
            qk_norm,
            shape,
        })
    }

    /// Self-attention of `xs` [b, l, hidden] with `bias` ([`attention_bias`]); scores and softmax in f32. The
    /// query heads sharing a key/value head are stacked along the sequence, so keys and values are never repeated.
    pub fn forward(&self, xs: &Tensor, rope: &Rope, bias: &Tensor) -> Result<Tensor> {
        let (b, l, _) = xs.dims3()?;
        let AttentionShape {
            num_heads,
            num_kv_heads: kvh,
            head_dim: d,
            ..
        } = self.shape;
        let group = num_heads / kvh;
        let heads = |t: Tensor, n: usize, norm: Option<&N>| -> Result<Tensor> {
            let t = t.reshape((b, l, n, d))?;
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            t.transpose(1, 2)?.contiguous()
        };
        let (q_norm, k_norm) = match &self.qk_norm {
            Some((q, k)) => (Some(q), Some(k)),
            None => (None, None),
        };
        let q = rope.apply(&heads(self.q_proj.forward(xs)?, num_heads, q_norm)?)?;
        let k = rope.apply(&heads(self.k_proj.forward(xs)?, kvh, k_norm)?)?;
        let v = heads(self.v_proj.forward(xs)?, kvh, None)?;
        let q = q.reshape((b, kvh, group * l, d))?;
        let scores = (q.matmul(&k.t()?)? * self.shape.scaling)?
            .to_dtype(DType::F32)?
            .reshape((b, kvh, group, l, l))?
            .broadcast_add(bias)?;
        let probs =
            softmax_last_dim(&scores)?
                .to_dtype(xs.dtype())?
                .reshape((b, kvh, group * l, l))?;
        let out = probs
            .matmul(&v)?
            .reshape((b, num_heads, l, d))?
            .transpose(1, 2)?
            .reshape((b, l, num_heads * d))?;
        self.o_proj.forward(&out)
    }

    /// A copy on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        let qk_norm = match &self.qk_norm {
            Some((q, k)) => Some((q.to_device(device)?, k.to_device(device)?)),
            None => None,
        };
        Ok(Self {
            q_proj: linear_to_device(&self.q_proj, device)?,
            k_proj: linear_to_device(&self.k_proj, device)?,
            v_proj: linear_to_device(&self.v_proj, device)?,
            o_proj: linear_to_device(&self.o_proj, device)?,
            qk_norm,
            shape: self.shape,
        })
    }
}

/// The gate's activation in a [`GatedMlp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU.
    Silu,
    /// GeGLU with the tanh approximation.
    GeluTanh,
}

/// `down(act(gate(x)) · up(x))` (`mlp.{gate,up,down}_proj`).
pub struct GatedMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    act: Activation,
}

impl GatedMlp {
    /// Reads the projections under `vb`: `hidden` → `intermediate` → `hidden`.
    pub fn new(hidden: usize, intermediate: usize, act: Activation, vb: &Vb) -> Result<Self> {
        let (h, i) = (hidden, intermediate);
        Ok(Self {
            gate_proj: Linear::load(&vb.pp("gate_proj"), h, i)?,
            up_proj: Linear::load(&vb.pp("up_proj"), h, i)?,
            down_proj: Linear::load(&vb.pp("down_proj"), i, h)?,
            act,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let gate = self.gate_proj.forward(xs)?;
        let gate = match self.act {
            Activation::Silu => gate.silu()?,
            Activation::GeluTanh => gelu_tanh(&gate)?,
        };
        let gated = (gate * self.up_proj.forward(xs)?)?;
        self.down_proj.forward(&gated)
    }

    /// A copy on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            gate_proj: linear_to_device(&self.gate_proj, device)?,
            up_proj: linear_to_device(&self.up_proj, device)?,
            down_proj: linear_to_device(&self.down_proj, device)?,
            act: self.act,
        })
    }
}
