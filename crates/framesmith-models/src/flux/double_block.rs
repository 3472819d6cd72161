//! A double-stream block of the FLUX.1 DiT (`DoubleStreamBlock` of `modules/layers.py`): image and text tokens
//! keep their own modulation, attention projections and MLP, and attend jointly over the concatenated sequence
//! (text first). LayerNorms and the modulated residuals are computed in f32; linears run in the compute dtype.

use candle_core::{DType, Result, Tensor};

use super::attention::{rope_attention, SelfAttention};
use super::block::BlockInputs;
use super::config::FluxConfig;
use super::modulation::{Modulation, ModulationOut};
use crate::modulated::norm_modulate;
use framesmith_nn::linear::Linear;
use framesmith_nn::ops::{gated_residual, gelu_tanh};
use framesmith_nn::vb::Vb;

pub mod grad;

/// `img_mlp` / `txt_mlp`: `0` Linear → GELU-tanh → `2` Linear.
#[derive(Clone)]
pub struct Mlp {
    /// `mlp.0`.
    pub fc0: Linear,
    /// `mlp.2`.
    pub fc2: Linear,
}

impl Mlp {
    pub fn new(dim: usize, hidden: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            fc0: Linear::load(&vb.pp(0), dim, hidden)?,
            fc2: Linear::load(&vb.pp(2), hidden, dim)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&gelu_tanh(&self.fc0.forward(xs)?)?)
    }
}

/// `double_blocks.N`.
#[derive(Clone)]
pub struct DoubleStreamBlock {
    pub img_mod: Modulation,
    pub img_attn: SelfAttention,
    pub img_mlp: Mlp,
    pub txt_mod: Modulation,
    pub txt_attn: SelfAttention,
    pub txt_mlp: Mlp,
}

impl DoubleStreamBlock {
    pub fn new(cfg: &FluxConfig, vb: &Vb) -> Result<Self> {
        let (dim, heads, hidden) = (cfg.hidden_size, cfg.num_heads, cfg.mlp_hidden_dim());
        Ok(Self {
            img_mod: Modulation::new(dim, true, &vb.pp("img_mod"))?,
            img_attn: SelfAttention::new(dim, heads, cfg.qkv_bias, &vb.pp("img_attn"))?,
            img_mlp: Mlp::new(dim, hidden, &vb.pp("img_mlp"))?,
            txt_mod: Modulation::new(dim, true, &vb.pp("txt_mod"))?,
            txt_attn: SelfAttention::new(dim, heads, cfg.qkv_bias, &vb.pp("txt_attn"))?,
            txt_mlp: Mlp::new(dim, hidden, &vb.pp("txt_mlp"))?,
        })
    }

    /// The linears by path under the block, for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        vec![
            ("img_mod.lin".into(), &mut self.img_mod.lin),
            ("img_attn.qkv".into(), &mut self.img_attn.qkv),
            ("img_attn.proj".into(), &mut self.img_attn.proj),
            ("img_mlp.0".into(), &mut self.img_mlp.fc0),
            ("img_mlp.2".into(), &mut self.img_mlp.fc2),
            ("txt_mod.lin".into(), &mut self.txt_mod.lin),
            ("txt_attn.qkv".into(), &mut self.txt_attn.qkv),
            ("txt_attn.proj".into(), &mut self.txt_attn.proj),
            ("txt_mlp.0".into(), &mut self.txt_mlp.fc0),
            ("txt_mlp.2".into(), &mut self.txt_mlp.fc2),
        ]
    }

    /// Runs the block on the joint sequence `xs` [b, txt_len + img_len, dim]; returns the same shape and dtype.
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        let (t, total) = (inputs.txt_len, xs.dim(1)?);
        let (txt, img) = (xs.narrow(1, 0, t)?, xs.narrow(1, t, total - t)?);
        let (img1, img2) = both(self.img_mod.forward(&inputs.vec)?)?;
        let (txt1, txt2) = both(self.txt_mod.forward(&inputs.vec)?)?;
        let compute = inputs.compute_dtype();

        let (img_q, img_k, img_v) = self.img_attn.qkv(&norm_modulate(&img, &img1, compute)?)?;
        let (txt_q, txt_k, txt_v) = self.txt_attn.qkv(&norm_modulate(&txt, &txt1, compute)?)?;
        let q = Tensor::cat(&[&txt_q, &img_q], 1)?;
        let k = Tensor::cat(&[&txt_k, &img_k], 1)?;
        let v = Tensor::cat(&[&txt_v, &img_v], 1)?;
        let attn = rope_attention(&q, &k, &v, &inputs.rope)?;
        let (txt_attn, img_attn) = (attn.narrow(1, 0, t)?, attn.narrow(1, t, total - t)?);

        let img = stream_rest(
            &img,
            &img_attn,
            (&self.img_attn, &self.img_mlp),
            (&img1, &img2),
            compute,
        )?;
        let txt = stream_rest(
            &txt,
            &txt_attn,
            (&self.txt_attn, &self.txt_mlp),
            (&txt1, &txt2),
            compute,
        )?;
        Tensor::cat(&[&txt, &img], 1)
    }
}

fn both(mods: (ModulationOut, Option<ModulationOut>)) -> Result<(ModulationOut, ModulationOut)> {
    match mods {
        (first, Some(second)) => Ok((first, second)),
        (_, None) => candle_core::bail!("FLUX: a double-stream block needs two modulation triples"),
    }
}

/// One stream after the joint attention: the gated attention residual, then the gated MLP residual.
fn stream_rest(
    xs: &Tensor,
    attn: &Tensor,
    (attention, mlp): (&SelfAttention, &Mlp),
    (m1, m2): (&ModulationOut, &ModulationOut),
    compute: DType,
) -> Result<Tensor> {
    let residual = xs.dtype();
    let xs = gated_residual(xs, &attention.proj.forward(attn)?, &m1.gate, residual)?;
    let y = mlp.forward(&norm_modulate(&xs, m2, compute)?)?;
    gated_residual(&xs, &y, &m2.gate, residual)
}
