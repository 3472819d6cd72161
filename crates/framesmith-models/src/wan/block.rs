//! One Wan attention block: modulated self-attention with q/k RMSNorm and 3D RoPE, cross-attention over the text
//! (and, for Wan 2.1 I2V, separate keys/values over the CLIP image tokens), and a modulated GELU-tanh FFN.
//! Modulation and residual arithmetic run in f32 as in the official code.

use candle_core::{DType, Result, Tensor};

use super::config::WanConfig;
use super::rope::Rope;
use framesmith_nn::attention::attention;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::{layer_norm, rms_norm};
use framesmith_nn::ops::{gated_residual, gelu_tanh};
use framesmith_nn::vb::Vb;

mod frozen;
pub mod grad;

/// Everything a block needs besides its input; shared by all blocks of one forward pass.
#[derive(Clone)]
pub struct BlockInputs {
    /// Time modulation input `e0` [b, lt, 6, dim] (f32); lt is 1 (per sample) or the sequence length (per token).
    pub e0: Tensor,
    /// Number of real (unpadded) tokens of each sample.
    pub seq_lens: Vec<usize>,
    pub rope: Rope,
    /// Embedded text context [b, text_len, dim] in the compute dtype.
    pub context: Tensor,
    /// Embedded CLIP image tokens [b, 257, dim] (Wan 2.1 I2V only).
    pub context_img: Option<Tensor>,
}

/// `self_attn` of a block.
#[derive(Clone)]
pub struct SelfAttention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    norm_q: Option<Tensor>,
    norm_k: Option<Tensor>,
    num_heads: usize,
    eps: f64,
}

fn qk_norm_weight(cfg: &WanConfig, vb: &Vb, name: &str) -> Result<Option<Tensor>> {
    if cfg.qk_norm {
        Ok(Some(vb.pp(name).get(cfg.dim, "weight")?))
    } else {
        Ok(None)
    }
}

fn split_heads(xs: &Tensor, num_heads: usize) -> Result<Tensor> {
    let (b, l, c) = xs.dims3()?;
    xs.reshape((b, l, num_heads, c / num_heads))
}

impl SelfAttention {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        Ok(Self {
            q: Linear::load(&vb.pp("q"), cfg.dim, cfg.dim)?,
            k: Linear::load(&vb.pp("k"), cfg.dim, cfg.dim)?,
            v: Linear::load(&vb.pp("v"), cfg.dim, cfg.dim)?,
            o: Linear::load(&vb.pp("o"), cfg.dim, cfg.dim)?,
            norm_q: qk_norm_weight(cfg, &vb, "norm_q")?,
            norm_k: qk_norm_weight(cfg, &vb, "norm_k")?,
            num_heads: cfg.num_heads,
            eps: cfg.eps,
        })
    }

    pub fn forward(&self, xs: &Tensor, seq_lens: &[usize], rope: &Rope) -> Result<Tensor> {
        let q = project(&self.q, self.norm_q.as_ref(), xs, self.num_heads, self.eps)?;
        let k = project(&self.k, self.norm_k.as_ref(), xs, self.num_heads, self.eps)?;
        let v = project(&self.v, None, xs, self.num_heads, self.eps)?;
        let out = attention(&rope.apply(&q)?, &rope.apply(&k)?, &v, Some(seq_lens))?;
        self.o.forward(&out.flatten_from(2)?)
    }
}

/// A linear projection, its optional RMSNorm over the full width (`norm_q` / `norm_k`), split into heads.
fn project(
    lin: &Linear,
    norm: Option<&Tensor>,
    xs: &Tensor,
    num_heads: usize,
    eps: f64,
) -> Result<Tensor> {
    let y = lin.forward(xs)?;
    let y = match norm {
        Some(w) => rms_norm(&y, Some(w), eps)?,
        None => y,
    };
    split_heads(&y, num_heads)
}

/// `cross_attn` of a block (T2V, or Wan 2.1 I2V with `k_img` / `v_img`).
#[derive(Clone)]
pub struct CrossAttention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub k_img: Option<Linear>,
    pub v_img: Option<Linear>,
    norm_q: Option<Tensor>,
    norm_k: Option<Tensor>,
    norm_k_img: Option<Tensor>,
    num_heads: usize,
    eps: f64,
}

impl CrossAttention {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        let (k_img, v_img, norm_k_img) = if cfg.has_clip() {
            (
                Some(Linear::load(&vb.pp("k_img"), cfg.dim, cfg.dim)?),
                Some(Linear::load(&vb.pp("v_img"), cfg.dim, cfg.dim)?),
                qk_norm_weight(cfg, &vb, "norm_k_img")?,
            )
        } else {
            (None, None, None)
        };
        Ok(Self {
            q: Linear::load(&vb.pp("q"), cfg.dim, cfg.dim)?,
            k: Linear::load(&vb.pp("k"), cfg.dim, cfg.dim)?,
            v: Linear::load(&vb.pp("v"), cfg.dim, cfg.dim)?,
            o: Linear::load(&vb.pp("o"), cfg.dim, cfg.dim)?,
            k_img,
            v_img,
            norm_q: qk_norm_weight(cfg, &vb, "norm_q")?,
            norm_k: qk_norm_weight(cfg, &vb, "norm_k")?,
            norm_k_img,
            num_heads: cfg.num_heads,
            eps: cfg.eps,
        })
    }

    pub fn forward(
        &self,
        xs: &Tensor,
        context: &Tensor,
        context_img: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (heads, eps) = (self.num_heads, self.eps);
        let q = project(&self.q, self.norm_q.as_ref(), xs, heads, eps)?;
        let k = project(&self.k, self.norm_k.as_ref(), context, heads, eps)?;
        let v = project(&self.v, None, context, heads, eps)?;
        let mut out = attention(&q, &k, &v, None)?.flatten_from(2)?;
        if let (Some(k_img), Some(v_img), Some(img)) = (&self.k_img, &self.v_img, context_img) {
            let k = project(k_img, self.norm_k_img.as_ref(), img, heads, eps)?;
            let v = project(v_img, None, img, heads, eps)?;
            out = (out + attention(&q, &k, &v, None)?.flatten_from(2)?)?;
        }
        self.o.forward(&out)
    }
}

/// A `blocks.N` module.
#[derive(Clone)]
pub struct Block {
    pub self_attn: SelfAttention,
    pub cross_attn: CrossAttention,
    /// `ffn.0` and `ffn.2`.
    pub ffn0: Linear,
    pub ffn2: Linear,
    norm3: Option<(Tensor, Tensor)>,
    /// `modulation` [1, 6, dim] in f32.
    modulation: Tensor,
    eps: f64,
}

impl Block {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        let norm3 = if cfg.cross_attn_norm {
            let vb3 = vb.pp("norm3").with_dtype(DType::F32);
            Some((vb3.get(cfg.dim, "weight")?, vb3.get(cfg.dim, "bias")?))
        } else {
            None
        };
        Ok(Self {
            self_attn: SelfAttention::new(cfg, vb.pp("self_attn"))?,
            cross_attn: CrossAttention::new(cfg, vb.pp("cross_attn"))?,
            ffn0: Linear::load(&vb.pp("ffn").pp(0), cfg.dim, cfg.ffn_dim)?,
            ffn2: Linear::load(&vb.pp("ffn").pp(2), cfg.ffn_dim, cfg.dim)?,
            norm3,
            modulation: vb
                .with_dtype(DType::F32)
                .get((1, 6, cfg.dim), "modulation")?,
            eps: cfg.eps,
        })
    }

    /// The block's linear layers by their path under the block (`self_attn.q`, …, `ffn.2`), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out: Vec<(String, &mut Linear)> = vec![
            ("self_attn.q".into(), &mut self.self_attn.q),
            ("self_attn.k".into(), &mut self.self_attn.k),
            ("self_attn.v".into(), &mut self.self_attn.v),
            ("self_attn.o".into(), &mut self.self_attn.o),
            ("cross_attn.q".into(), &mut self.cross_attn.q),
            ("cross_attn.k".into(), &mut self.cross_attn.k),
            ("cross_attn.v".into(), &mut self.cross_attn.v),
            ("cross_attn.o".into(), &mut self.cross_attn.o),
        ];
        if let Some(l) = self.cross_attn.k_img.as_mut() {
            out.push(("cross_attn.k_img".into(), l));
        }
        if let Some(l) = self.cross_attn.v_img.as_mut() {
            out.push(("cross_attn.v_img".into(), l));
        }
        out.push(("ffn.0".into(), &mut self.ffn0));
        out.push(("ffn.2".into(), &mut self.ffn2));
        out
    }

    /// Runs the block on `xs` [b, seq_len, dim] (the residual stream, f32 or bf16); returns the same shape/dtype.
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        let e = self.modulation.unsqueeze(0)?.broadcast_add(&inputs.e0)?;
        let xs = self.self_attention_part(xs, inputs, &e)?;
        self.per_token_part(&xs, inputs, &e)
    }

    /// [`Block::forward`] with the cross-attention and the FFN run over at most `chunk` tokens at a time (they
    /// treat each token alone, so the result is the same): for inference, where the FFN's hidden activations of
    /// every token at once are the largest tensors of a block (at 720p several GiB).
    pub fn forward_chunked(
        &self,
        xs: &Tensor,
        inputs: &BlockInputs,
        chunk: usize,
    ) -> Result<Tensor> {
        let e = self.modulation.unsqueeze(0)?.broadcast_add(&inputs.e0)?;
        let xs = self.self_attention_part(xs, inputs, &e)?;
        let tokens = xs.dim(1)?;
        let chunk = chunk.max(1);
        if tokens <= chunk {
            return self.per_token_part(&xs, inputs, &e);
        }
        let per_token_e = e.dim(1)? > 1;
        let parts = (0..tokens)
            .step_by(chunk)
            .map(|start| {
                let n = chunk.min(tokens - start);
                let e = if per_token_e {
                    e.narrow(1, start, n)?
                } else {
                    e.clone()
                };
                self.per_token_part(&xs.narrow(1, start, n)?, inputs, &e)
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, 1)
    }

    /// Modulated self-attention and its gated residual; `e` is the block's modulation [b, lt, 6, dim].
    fn self_attention_part(&self, xs: &Tensor, inputs: &BlockInputs, e: &Tensor) -> Result<Tensor> {
        let compute = inputs.context.dtype();
        let chunk = |i: usize| -> Result<Tensor> { e.narrow(2, i, 1)?.squeeze(2) };
        let y = self.self_attn.forward(
            &self.norm_modulate(xs, &chunk(0)?, &chunk(1)?, compute)?,
            &inputs.seq_lens,
            &inputs.rope,
        )?;
        gated_residual(xs, &y, &chunk(2)?, xs.dtype())
    }

    /// Cross-attention and the modulated FFN with their residuals: each token on its own.
    fn per_token_part(&self, xs: &Tensor, inputs: &BlockInputs, e: &Tensor) -> Result<Tensor> {
        let compute = inputs.context.dtype();
        let residual = xs.dtype();
        let chunk = |i: usize| -> Result<Tensor> { e.narrow(2, i, 1)?.squeeze(2) };
        let normed3 = match &self.norm3 {
            Some((w, b)) => layer_norm(xs, Some(w), Some(b), self.eps)?,
            None => xs.clone(),
        };
        let y = self.cross_attn.forward(
            &normed3.to_dtype(compute)?,
            &inputs.context,
            inputs.context_img.as_ref(),
        )?;
        let xs = (xs.to_dtype(DType::F32)? + y.to_dtype(DType::F32)?)?.to_dtype(residual)?;

        let h = self.norm_modulate(&xs, &chunk(3)?, &chunk(4)?, compute)?;
        let y = self.ffn2.forward(&gelu_tanh(&self.ffn0.forward(&h)?)?)?;
        gated_residual(&xs, &y, &chunk(5)?, residual)
    }

    /// LayerNorm without affine, then `x · (1 + scale) + shift` in f32, returned in `compute`.
    fn norm_modulate(
        &self,
        x: &Tensor,
        shift: &Tensor,
        scale: &Tensor,
        compute: DType,
    ) -> Result<Tensor> {
        framesmith_nn::ops::layer_norm_modulate(x, scale, shift, self.eps, compute)
    }
}

/// The final `head`: LayerNorm, modulation by the time embedding, Linear to `out_dim · prod(patch)`.
#[derive(Clone)]
pub struct Head {
    head: Linear,
    /// `modulation` [1, 2, dim] in f32.
    modulation: Tensor,
    eps: f64,
}

impl Head {
    pub fn new(cfg: &WanConfig, vb: Vb) -> Result<Self> {
        let patch: usize = cfg.patch_size.iter().product();
        let vb = vb.with_dtype(DType::F32);
        Ok(Self {
            head: Linear::load(&vb.pp("head"), cfg.dim, cfg.out_dim * patch)?,
            modulation: vb.get((1, 2, cfg.dim), "modulation")?,
            eps: cfg.eps,
        })
    }

    /// `xs` [b, seq_len, dim], time embedding `e` [b, lt, dim] (f32) → [b, seq_len, out_dim·prod(patch)] in f32.
    pub fn forward(&self, xs: &Tensor, e: &Tensor) -> Result<Tensor> {
        let e = self
            .modulation
            .unsqueeze(0)?
            .broadcast_add(&e.unsqueeze(2)?)?;
        let shift = e.narrow(2, 0, 1)?.squeeze(2)?;
        let scale = e.narrow(2, 1, 1)?.squeeze(2)?;
        let normed = layer_norm(xs, None, None, self.eps)?.to_dtype(DType::F32)?;
        let h = normed
            .broadcast_mul(&(scale + 1.0)?)?
            .broadcast_add(&shift)?;
        self.head.forward(&h)
    }
}
