//! A single-stream block of the FLUX.1 DiT (`SingleStreamBlock` of `modules/layers.py`): one modulation, one
//! fused `linear1` giving q, k, v and the MLP input, attention and GELU-tanh MLP side by side, and one `linear2`
//! over their concatenation, as a gated residual on the joint sequence.

use candle_core::{Result, Tensor};

use super::attention::{rope_attention, split_qkv, QkNorm};
use super::block::BlockInputs;
use super::config::FluxConfig;
use super::modulation::Modulation;
use crate::modulated::norm_modulate;
use framesmith_nn::linear::Linear;
use framesmith_nn::ops::{gated_residual, gelu_tanh};
use framesmith_nn::vb::Vb;

pub mod grad;

/// `single_blocks.N`.
#[derive(Clone)]
pub struct SingleStreamBlock {
    pub linear1: Linear,
    pub linear2: Linear,
    pub norm: QkNorm,
    pub modulation: Modulation,
    hidden_size: usize,
    mlp_hidden_dim: usize,
    num_heads: usize,
}

impl SingleStreamBlock {
    pub fn new(cfg: &FluxConfig, vb: &Vb) -> Result<Self> {
        let (dim, mlp) = (cfg.hidden_size, cfg.mlp_hidden_dim());
        Ok(Self {
            linear1: Linear::load(&vb.pp("linear1"), dim, 3 * dim + mlp)?,
            linear2: Linear::load(&vb.pp("linear2"), dim + mlp, dim)?,
            norm: QkNorm::new(cfg.head_dim(), &vb.pp("norm"))?,
            modulation: Modulation::new(dim, false, &vb.pp("modulation"))?,
            hidden_size: dim,
            mlp_hidden_dim: mlp,
            num_heads: cfg.num_heads,
        })
    }

    /// The linears by path under the block, for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        vec![
            ("linear1".into(), &mut self.linear1),
            ("linear2".into(), &mut self.linear2),
            ("modulation.lin".into(), &mut self.modulation.lin),
        ]
    }

    /// Runs the block on the joint sequence `xs` [b, txt_len + img_len, dim]; returns the same shape and dtype.
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        let (m, _) = self.modulation.forward(&inputs.vec)?;
        let x_mod = norm_modulate(xs, &m, inputs.compute_dtype())?;
        let h = self.linear1.forward(&x_mod)?;
        let qkv = h.narrow(2, 0, 3 * self.hidden_size)?;
        let mlp = h.narrow(2, 3 * self.hidden_size, self.mlp_hidden_dim)?;
        let (q, k, v) = split_qkv(&qkv, self.num_heads)?;
        let (q, k) = self.norm.forward(&q, &k, &v)?;
        let attn = rope_attention(&q, &k, &v, &inputs.rope)?;
        let out = self
            .linear2
            .forward(&Tensor::cat(&[&attn, &gelu_tanh(&mlp)?], 2)?)?;
        gated_residual(xs, &out, &m.gate, xs.dtype())
    }
}
