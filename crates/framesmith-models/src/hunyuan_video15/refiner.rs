//! The text token refiner of HunyuanVideo 1.5 (`txt_in`, the official `SingleTokenRefiner`; diffusers'
//! `context_embedder`): the Qwen2.5-VL hidden states projected to the model width (`input_embedder`), conditioned
//! on the timestep (`t_embedder`) plus the mean of the valid tokens (`c_embedder`), then refined by self-attention
//! blocks (`individual_token_refiner.blocks.*`) whose residuals are gated by that condition. Padding tokens are
//! masked as keys; their own rows are not used downstream.

use candle_core::{DType, Result, Tensor};

use super::config::HunyuanVideo15Config;
use super::embeddings::TimestepEmbedder;
use framesmith_nn::attention::attention;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::AffineNorm;
use framesmith_nn::vb::Vb;

/// Epsilon of the refiner blocks' LayerNorms.
pub const REFINER_NORM_EPS: f64 = 1e-6;

/// `txt_in.individual_token_refiner.blocks.N`.
#[derive(Clone)]
pub struct RefinerBlock {
    pub norm1: AffineNorm,
    /// `self_attn_qkv` [3·dim, dim]: q, k and v stacked.
    pub self_attn_qkv: Linear,
    pub self_attn_proj: Linear,
    pub norm2: AffineNorm,
    /// `mlp.fc1` (then SiLU).
    pub mlp_fc1: Linear,
    pub mlp_fc2: Linear,
    /// `adaLN_modulation.1` [2·dim, dim]: the attention's and the MLP's gates.
    pub ada_ln_modulation: Linear,
    heads: usize,
}

impl RefinerBlock {
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        let (dim, hidden) = (cfg.inner_dim(), cfg.mlp_hidden_dim());
        Ok(Self {
            norm1: AffineNorm::new(dim, REFINER_NORM_EPS, &vb.pp("norm1"))?,
            self_attn_qkv: Linear::load(&vb.pp("self_attn_qkv"), dim, 3 * dim)?,
            self_attn_proj: Linear::load(&vb.pp("self_attn_proj"), dim, dim)?,
            norm2: AffineNorm::new(dim, REFINER_NORM_EPS, &vb.pp("norm2"))?,
            mlp_fc1: Linear::load(&vb.pp("mlp").pp("fc1"), dim, hidden)?,
            mlp_fc2: Linear::load(&vb.pp("mlp").pp("fc2"), hidden, dim)?,
            ada_ln_modulation: Linear::load(&vb.pp("adaLN_modulation").pp(1), dim, 2 * dim)?,
            heads: cfg.num_attention_heads,
        })
    }

    /// `xs` [b, l, dim], the condition `c` [b, dim], `lens[i]` valid tokens of sample i.
    pub fn forward(&self, xs: &Tensor, c: &Tensor, lens: &[usize]) -> Result<Tensor> {
        let gates = self.ada_ln_modulation.forward(&c.silu()?)?.unsqueeze(1)?;
        let gates = gates.chunk(2, 2)?;
        let (b, l, dim) = xs.dims3()?;
        let qkv = self.self_attn_qkv.forward(&self.norm1.forward(xs)?)?;
        let head = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * dim, dim)?
                .reshape((b, l, self.heads, dim / self.heads))
        };
        let out = attention(&head(0)?, &head(1)?, &head(2)?, Some(lens))?.reshape((b, l, dim))?;
        let xs = (xs
            + self
                .self_attn_proj
                .forward(&out)?
                .broadcast_mul(&gates[0])?)?;
        let mlp = self
            .mlp_fc2
            .forward(&self.mlp_fc1.forward(&self.norm2.forward(&xs)?)?.silu()?)?;
        xs + mlp.broadcast_mul(&gates[1])?
    }
}

/// `txt_in.c_embedder`: `linear_2(silu(linear_1(x)))`.
#[derive(Clone)]
pub struct TextProjection {
    pub linear_1: Linear,
    pub linear_2: Linear,
}

/// `txt_in`.
#[derive(Clone)]
pub struct TokenRefiner {
    pub input_embedder: Linear,
    pub t_embedder: TimestepEmbedder,
    pub c_embedder: TextProjection,
    /// `individual_token_refiner.blocks.*`.
    pub blocks: Vec<RefinerBlock>,
}

impl TokenRefiner {
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        let (input, dim) = (cfg.text_embed_dim, cfg.inner_dim());
        let c = vb.pp("c_embedder");
        let blocks = vb.pp("individual_token_refiner").pp("blocks");
        Ok(Self {
            input_embedder: Linear::load(&vb.pp("input_embedder"), input, dim)?,
            t_embedder: TimestepEmbedder::new(dim, &vb.pp("t_embedder"))?,
            c_embedder: TextProjection {
                linear_1: Linear::load(&c.pp("linear_1"), input, dim)?,
                linear_2: Linear::load(&c.pp("linear_2"), dim, dim)?,
            },
            blocks: (0..cfg.num_refiner_layers)
                .map(|i| RefinerBlock::new(cfg, &blocks.pp(i)))
                .collect::<Result<_>>()?,
        })
    }

    /// The refined text [b, l, dim] of hidden states `xs` [b, l, text_embed_dim] whose first `lens[i]` tokens are
    /// valid, at raw timesteps `t` [b].
    pub fn forward(&self, xs: &Tensor, t: &Tensor, lens: &[usize]) -> Result<Tensor> {
        let pooled = masked_mean(xs, lens)?;
        let c_emb = &self.c_embedder;
        let context = c_emb
            .linear_2
            .forward(&c_emb.linear_1.forward(&pooled)?.silu()?)?;
        let c = (self.t_embedder.forward(t, xs.dtype())? + context)?;
        let mut xs = self.input_embedder.forward(xs)?;
        for block in &self.blocks {
            xs = block.forward(&xs, &c, lens)?;
        }
        Ok(xs)
    }
}

/// The mean of each sample's first `lens[i]` tokens of `xs` [b, l, d] → [b, d] in `xs`' dtype (f32 sums).
fn masked_mean(xs: &Tensor, lens: &[usize]) -> Result<Tensor> {
    let (b, l, _) = xs.dims3()?;
    if lens.len() != b || lens.iter().any(|&n| n == 0 || n > l) {
        candle_core::bail!(
            "HunyuanVideo 1.5: text lengths {lens:?} for a batch of {b} with {l} text tokens (each sample needs \
             at least one valid Qwen2.5-VL token)"
        );
    }
    let mask: Vec<f32> = lens
        .iter()
        .flat_map(|&n| (0..l).map(move |j| if j < n { 1.0 } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (b, l, 1), xs.device())?;
    let counts: Vec<f32> = lens.iter().map(|&n| n as f32).collect();
    let counts = Tensor::from_vec(counts, (b, 1), xs.device())?;
    let sums = xs.to_dtype(DType::F32)?.broadcast_mul(&mask)?.sum(1)?;
    sums.broadcast_div(&counts)?.to_dtype(xs.dtype())
}
