//! The joint attention of a dual-stream block (diffusers' `Attention` with `QwenDoubleStreamAttnProcessor2_0`,
//! which HunyuanVideo 1.5's double blocks compute too): image tokens through `to_q` / `to_k` / `to_v`, text tokens through `add_q_proj` / `add_k_proj` /
//! `add_v_proj`, RMSNorm of q and k per head (`norm_q`, `norm_k`, `norm_added_q`, `norm_added_k`, eps 1e-6),
//! each stream's RoPE, one attention over every image and text token with the text padding masked as keys, then
//! `to_out.0` (image) and `to_add_out` (text).

use candle_core::{Result, Tensor};

use super::rope::{Rope, RopeTable};
use framesmith_nn::attention::attention;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::vb::Vb;

/// Epsilon of the q / k RMSNorms.
pub const QK_NORM_EPS: f64 = 1e-6;

/// The q, k, v projections of one stream and its q / k norm weights.
#[derive(Clone)]
pub struct StreamQkv {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    /// RMSNorm weight of q [head_dim].
    pub norm_q: Tensor,
    /// RMSNorm weight of k [head_dim].
    pub norm_k: Tensor,
}

impl StreamQkv {
    /// q, k (normalised and rotated) and v of `xs` [b, l, dim], each [b, l, heads, head_dim].
    fn forward(&self, xs: &Tensor, head_dim: usize, rope: &RopeTable) -> Result<[Tensor; 3]> {
        let q = split_heads(&self.q.forward(xs)?, head_dim)?;
        let k = split_heads(&self.k.forward(xs)?, head_dim)?;
        let v = split_heads(&self.v.forward(xs)?, head_dim)?;
        let q = rope.apply(&rms_norm(&q, Some(&self.norm_q), QK_NORM_EPS)?)?;
        let k = rope.apply(&rms_norm(&k, Some(&self.norm_k), QK_NORM_EPS)?)?;
        Ok([q, k, v])
    }
}

/// `xs` [b, l, heads · head_dim] as [b, l, heads, head_dim].
pub fn split_heads(xs: &Tensor, head_dim: usize) -> Result<Tensor> {
    let (b, l, width) = xs.dims3()?;
    xs.reshape((b, l, width / head_dim, head_dim))
}

/// The keys each sample attends to in the joint [image; text] sequence: every image token and its valid text
/// tokens (`None`: every key).
pub fn joint_kv_lens(img_len: usize, txt_lens: Option<&[usize]>) -> Option<Vec<usize>> {
    txt_lens.map(|lens| lens.iter().map(|&n| img_len + n).collect())
}

/// `transformer_blocks.N.attn`.
#[derive(Clone)]
pub struct JointAttention {
    /// `to_q`, `to_k`, `to_v`, `norm_q`, `norm_k`.
    pub img: StreamQkv,
    /// `add_q_proj`, `add_k_proj`, `add_v_proj`, `norm_added_q`, `norm_added_k`.
    pub txt: StreamQkv,
    /// `to_out.0`.
    pub to_out: Linear,
    pub to_add_out: Linear,
    head_dim: usize,
}

impl JointAttention {
    /// Reads the attention of width `dim` with heads of `head_dim` under `vb`.
    pub fn new(dim: usize, head_dim: usize, vb: &Vb) -> Result<Self> {
        let linear = |name: &str| Linear::load(&vb.pp(name), dim, dim);
        let norm = |name: &str| vb.pp(name).get(head_dim, "weight");
        Ok(Self {
            img: StreamQkv {
                q: linear("to_q")?,
                k: linear("to_k")?,
                v: linear("to_v")?,
                norm_q: norm("norm_q")?,
                norm_k: norm("norm_k")?,
            },
            txt: StreamQkv {
                q: linear("add_q_proj")?,
                k: linear("add_k_proj")?,
                v: linear("add_v_proj")?,
                norm_q: norm("norm_added_q")?,
                norm_k: norm("norm_added_k")?,
            },
            to_out: Linear::load(&vb.pp("to_out").pp(0), dim, dim)?,
            to_add_out: linear("to_add_out")?,
            head_dim,
        })
    }

    /// An attention from its parts, for a family that shares this block under other key names (HunyuanVideo
    /// 1.5's `img_attn_q`, …).
    pub fn from_parts(
        (img, txt): (StreamQkv, StreamQkv),
        to_out: Linear,
        to_add_out: Linear,
        head_dim: usize,
    ) -> Self {
        Self {
            img,
            txt,
            to_out,
            to_add_out,
            head_dim,
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Attention of the modulated image tokens `img` [b, img_len, dim] and text tokens `txt` [b, txt_len, dim]
    /// over both; `txt_lens[i]` text tokens of sample i are attended as keys (`None`: all). Returns the projected
    /// (image, text) outputs.
    pub fn forward(
        &self,
        img: &Tensor,
        txt: &Tensor,
        rope: &Rope,
        txt_lens: Option<&[usize]>,
    ) -> Result<(Tensor, Tensor)> {
        let img_len = img.dim(1)?;
        let [img_q, img_k, img_v] = self.img.forward(img, self.head_dim, &rope.img)?;
        let [txt_q, txt_k, txt_v] = self.txt.forward(txt, self.head_dim, &rope.txt)?;
        // Image rows first, so that a sample's padded text tokens are the keys past its length.
        let q = Tensor::cat(&[&img_q, &txt_q], 1)?;
        let k = Tensor::cat(&[&img_k, &txt_k], 1)?;
        let v = Tensor::cat(&[&img_v, &txt_v], 1)?;
        let kv_lens = joint_kv_lens(img_len, txt_lens);
        let out = attention(&q, &k, &v, kv_lens.as_deref())?.flatten_from(2)?;
        let total = out.dim(1)?;
        let img_out = self.to_out.forward(&out.narrow(1, 0, img_len)?)?;
        let txt_out = self
            .to_add_out
            .forward(&out.narrow(1, img_len, total - img_len)?)?;
        Ok((img_out, txt_out))
    }
}
