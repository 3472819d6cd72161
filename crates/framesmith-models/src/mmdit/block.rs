//! A dual-stream (MMDiT) block, as Qwen-Image's `QwenImageTransformerBlock` and HunyuanVideo 1.5's double blocks
//! compute it: image and text
//! tokens each have their modulation (`img_mod.1`, `txt_mod.1`: SiLU then a linear to two (shift, scale, gate)
//! triples), parameter-free LayerNorms (eps 1e-6) and MLP (`img_mlp`, `txt_mlp`: GELU-tanh, 4× wide), and attend
//! jointly. A block takes and returns the joint sequence [b, txt_len + img_len, dim], text rows first (the order
//! of the official attention), so the training step and block streaming see one tensor per block.
//! LayerNorms and the modulated residuals are computed in f32; linears run in the compute dtype.

use candle_core::{DType, Result, Tensor};

use super::attention::JointAttention;
use super::rope::Rope;
use framesmith_nn::linear::Linear;
use framesmith_nn::ops::{gated_residual, gelu_tanh};
use framesmith_nn::vb::Vb;

pub mod grad;

pub use crate::modulated::{norm_modulate, ModulationOut, LAYER_NORM_EPS};

/// What every block of one forward pass shares.
#[derive(Clone)]
pub struct BlockInputs {
    /// The timestep embedding `temb` [b, dim], in the compute dtype.
    pub temb: Tensor,
    /// RoPE tables of both streams.
    pub rope: Rope,
    /// Number of text tokens (the first rows of the joint sequence).
    pub txt_len: usize,
    /// Valid text tokens per sample (the rest is padding, masked as keys); `None`: all are valid.
    pub txt_lens: Option<Vec<usize>>,
}

impl BlockInputs {
    /// The dtype the blocks' linears run in.
    pub fn compute_dtype(&self) -> DType {
        self.temb.dtype()
    }

    /// The same inputs outside any autograd graph.
    pub fn detached(&self) -> Self {
        Self {
            temb: self.temb.detach(),
            rope: self.rope.detached(),
            txt_len: self.txt_len,
            txt_lens: self.txt_lens.clone(),
        }
    }
}

/// `img_mod` / `txt_mod`: `1` is the linear [6·dim, dim] after the SiLU.
#[derive(Clone)]
pub struct Modulation {
    pub lin: Linear,
}

impl Modulation {
    pub fn new(dim: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            lin: Linear::load(&vb.pp(1), dim, 6 * dim)?,
        })
    }

    /// The attention's and the MLP's triples for `temb` [b, dim].
    pub fn forward(&self, temb: &Tensor) -> Result<(ModulationOut, ModulationOut)> {
        triples(&self.lin.forward(&temb.silu()?)?)
    }
}

/// The two (shift, scale, gate) triples of a modulation linear's output [b, 6·dim], in f32 as [b, 1, dim] each.
pub fn triples(out: &Tensor) -> Result<(ModulationOut, ModulationOut)> {
    let mut mods = crate::modulated::triples(out, 2)?.into_iter();
    match (mods.next(), mods.next()) {
        (Some(first), Some(second)) => Ok((first, second)),
        _ => candle_core::bail!("dual-stream block: a modulation needs two triples"),
    }
}

/// `img_mlp` / `txt_mlp` (diffusers' `FeedForward`): `net.0.proj` → GELU-tanh → `net.2`.
#[derive(Clone)]
pub struct FeedForward {
    /// `net.0.proj`.
    pub proj_in: Linear,
    /// `net.2`.
    pub proj_out: Linear,
}

impl FeedForward {
    pub fn new(dim: usize, hidden: usize, vb: &Vb) -> Result<Self> {
        let net = vb.pp("net");
        Ok(Self {
            proj_in: Linear::load(&net.pp(0).pp("proj"), dim, hidden)?,
            proj_out: Linear::load(&net.pp(2), hidden, dim)?,
        })
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        self.proj_out
            .forward(&gelu_tanh(&self.proj_in.forward(xs)?)?)
    }
}

/// One dual-stream block (Qwen-Image's `transformer_blocks.N`, HunyuanVideo 1.5's `double_blocks.N`).
#[derive(Clone)]
pub struct DualStreamBlock {
    pub img_mod: Modulation,
    pub txt_mod: Modulation,
    pub attn: JointAttention,
    pub img_mlp: FeedForward,
    pub txt_mlp: FeedForward,
}

impl DualStreamBlock {
    /// A block of width `dim`, heads of `head_dim` and MLPs `hidden` wide, under Qwen-Image's (diffusers') names.
    pub fn new(dim: usize, head_dim: usize, hidden: usize, vb: &Vb) -> Result<Self> {
        Ok(Self {
            img_mod: Modulation::new(dim, &vb.pp("img_mod"))?,
            txt_mod: Modulation::new(dim, &vb.pp("txt_mod"))?,
            attn: JointAttention::new(dim, head_dim, &vb.pp("attn"))?,
            img_mlp: FeedForward::new(dim, hidden, &vb.pp("img_mlp"))?,
            txt_mlp: FeedForward::new(dim, hidden, &vb.pp("txt_mlp"))?,
        })
    }

    /// The block's linears by their path under the block (official names), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let attn = &mut self.attn;
        vec![
            ("img_mod.1".into(), &mut self.img_mod.lin),
            ("txt_mod.1".into(), &mut self.txt_mod.lin),
            ("attn.to_q".into(), &mut attn.img.q),
            ("attn.to_k".into(), &mut attn.img.k),
            ("attn.to_v".into(), &mut attn.img.v),
            ("attn.add_q_proj".into(), &mut attn.txt.q),
            ("attn.add_k_proj".into(), &mut attn.txt.k),
            ("attn.add_v_proj".into(), &mut attn.txt.v),
            ("attn.to_out.0".into(), &mut attn.to_out),
            ("attn.to_add_out".into(), &mut attn.to_add_out),
            ("img_mlp.net.0.proj".into(), &mut self.img_mlp.proj_in),
            ("img_mlp.net.2".into(), &mut self.img_mlp.proj_out),
            ("txt_mlp.net.0.proj".into(), &mut self.txt_mlp.proj_in),
            ("txt_mlp.net.2".into(), &mut self.txt_mlp.proj_out),
        ]
    }

    /// Runs the block on the joint sequence `xs` [b, txt_len + img_len, dim]; returns the same shape and dtype.
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        let (t, total) = (inputs.txt_len, xs.dim(1)?);
        let (txt, img) = (xs.narrow(1, 0, t)?, xs.narrow(1, t, total - t)?);
        let (img1, img2) = self.img_mod.forward(&inputs.temb)?;
        let (txt1, txt2) = self.txt_mod.forward(&inputs.temb)?;
        let compute = inputs.compute_dtype();

        let (img_attn, txt_attn) = self.attn.forward(
            &norm_modulate(&img, &img1, compute)?,
            &norm_modulate(&txt, &txt1, compute)?,
            &inputs.rope,
            inputs.txt_lens.as_deref(),
        )?;
        let img = stream_rest(&img, &img_attn, &self.img_mlp, (&img1, &img2), compute)?;
        let txt = stream_rest(&txt, &txt_attn, &self.txt_mlp, (&txt1, &txt2), compute)?;
        Tensor::cat(&[&txt, &img], 1)
    }
}

/// One stream after the joint attention: the gated attention residual, then the gated MLP residual.
fn stream_rest(
    xs: &Tensor,
    attn: &Tensor,
    mlp: &FeedForward,
    (m1, m2): (&ModulationOut, &ModulationOut),
    compute: DType,
) -> Result<Tensor> {
    let residual = xs.dtype();
    let xs = gated_residual(xs, attn, &m1.gate, residual)?;
    let y = mlp.forward(&norm_modulate(&xs, m2, compute)?)?;
    gated_residual(&xs, &y, &m2.gate, residual)
}
