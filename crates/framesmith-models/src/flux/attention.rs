//! Attention parts of the FLUX.1 blocks (`QKNorm`, `SelfAttention` and `attention` of the official
//! `modules/layers.py` / `math.py`): a fused `qkv` projection split into heads, RMSNorm of q and k per head
//! (`query_norm.scale`, `key_norm.scale`, eps 1e-6), RoPE, and unmasked attention over every text and image token.

use candle_core::{Result, Tensor};

use super::rope::Rope;
use framesmith_nn::attention::attention;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::ops::Dense;
use framesmith_nn::vb::Vb;

/// Epsilon of the q / k RMSNorm.
pub const QK_NORM_EPS: f64 = 1e-6;

/// `norm` of an attention: `query_norm.scale` and `key_norm.scale` [head_dim].
#[derive(Clone)]
pub struct QkNorm {
    pub query_norm: Tensor,
    pub key_norm: Tensor,
}

impl QkNorm {
    pub fn new(head_dim: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            query_norm: vb.pp("query_norm").get(head_dim, "scale")?,
            key_norm: vb.pp("key_norm").get(head_dim, "scale")?,
        })
    }

    /// Normalised q and k, [b, l, heads, head_dim] each, in `v`'s dtype as officially.
    pub fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let q = rms_norm(q, Some(&self.query_norm), QK_NORM_EPS)?.to_dtype(v.dtype())?;
        let k = rms_norm(k, Some(&self.key_norm), QK_NORM_EPS)?.to_dtype(v.dtype())?;
        Ok((q, k))
    }
}

/// Splits a fused projection [b, l, 3·heads·head_dim] (ordered q/k/v, then head, then channel) into q, k, v
/// [b, l, heads, head_dim].
/// Each part is copied out dense (row by row on CUDA; the fused output, or a narrow of `linear1`'s, is strided).
pub fn split_qkv(qkv: &Tensor, num_heads: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, l, width) = qkv.dims3()?;
    let dim = width / 3;
    let part = |i: usize| {
        qkv.narrow(2, i * dim, dim)?
            .dense()?
            .reshape((b, l, num_heads, dim / num_heads))
    };
    Ok((part(0)?, part(1)?, part(2)?))
}

/// RoPE on q and k, then attention of every token over every token: [b, l, heads, head_dim] → [b, l, heads·head_dim].
pub fn rope_attention(q: &Tensor, k: &Tensor, v: &Tensor, rope: &Rope) -> Result<Tensor> {
    let q = rope.apply(q)?;
    let k = rope.apply(k)?;
    attention(&q, &k, v, None)?.flatten_from(2)
}

/// `img_attn` / `txt_attn` of a double-stream block: `qkv`, `norm`, `proj`.
#[derive(Clone)]
pub struct SelfAttention {
    pub qkv: Linear,
    pub norm: QkNorm,
    pub proj: Linear,
    num_heads: usize,
}

impl SelfAttention {
    /// `qkv_bias`: the official `qkv_bias`, whose bias must then be in the checkpoint.
    pub fn new(dim: usize, num_heads: usize, qkv_bias: bool, vb: &Vb) -> Result<Self> {
        let qkv_vb = vb.pp("qkv");
        if qkv_bias && !qkv_vb.contains("bias") {
            candle_core::bail!("missing tensor `{}` in the checkpoint", qkv_vb.path("bias"));
        }
        let qkv = Linear::load(&qkv_vb, dim, 3 * dim)?;
        Ok(Self {
            qkv,
            norm: QkNorm::new(dim / num_heads, &vb.pp("norm"))?,
            proj: Linear::load(&vb.pp("proj"), dim, dim)?,
            num_heads,
        })
    }

    /// Number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Normalised q, k and v of `xs` [b, l, dim], each [b, l, heads, head_dim].
    pub fn qkv(&self, xs: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (q, k, v) = split_qkv(&self.qkv.forward(xs)?, self.num_heads)?;
        let (q, k) = self.norm.forward(&q, &k, &v)?;
        Ok((q, k, v))
    }
}
