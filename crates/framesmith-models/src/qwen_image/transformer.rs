//! The Qwen-Image transformer (diffusers' `QwenImageTransformer2DModel`): `img_in` on the packed latent tokens,
//! `txt_norm` (RMSNorm) then `txt_in` on the text encoder's hidden states, the timestep embedding
//! (`time_text_embed`), MSRoPE over the image grids and the text, the dual-stream blocks on the joint
//! [text; image] sequence, and `norm_out` + `proj_out` on the image rows.

use std::borrow::Cow;

use candle_core::{DType, Result, Tensor};

use super::config::QwenImageConfig;
use super::embeddings::TimestepEmbedding;
use super::norm_out::AdaNormOut;
use super::rope::{self, ImageGrid};
use crate::mmdit::{BlockInputs, BlockStack, DualStreamBlock};
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::rms_norm;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions};
use framesmith_nn::vb::Vb;

/// Epsilon of `txt_norm`.
pub const TXT_NORM_EPS: f64 = 1e-6;

/// One batch as the official forward takes it.
#[derive(Clone, Debug)]
pub struct QwenImageInputs {
    /// Packed latent tokens [b, img_len, in_channels]: the images of `img_grids`, one after the other.
    pub img: Tensor,
    /// The latent grid of each image of a sample (the same for every sample), in sequence order: the image being
    /// denoised, then any conditioning images (Qwen-Image-Edit).
    pub img_grids: Vec<ImageGrid>,
    /// The text encoder's hidden states [b, txt_len, joint_attention_dim].
    pub txt: Tensor,
    /// Valid text tokens per sample, padding after them ([`txt_lens_from_mask`]); `None`: every token is valid.
    pub txt_lens: Option<Vec<usize>>,
    /// Timesteps [b] in [0, 1] (the model scales them by 1000).
    pub timesteps: Tensor,
}

/// The per-sample text lengths of a mask [b, txt_len] (non-zero: a valid token) in the form the official
/// pipeline makes: valid tokens first, then padding. Any other pattern is an error.
pub fn txt_lens_from_mask(mask: &Tensor) -> Result<Vec<usize>> {
    let rows = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let len = row.iter().take_while(|&&v| v != 0.0).count();
            if row[len..].iter().any(|&v| v != 0.0) {
                candle_core::bail!(
                    "Qwen-Image: the text mask of sample {i} has a valid token after padding; the mask must be \
                     valid tokens followed by padding, as the Qwen-Image pipeline makes it"
                );
            }
            Ok(len)
        })
        .collect()
}

/// What the embeddings produce: the first block's input (the joint sequence), what every block shares, and
/// (`head`) the tokens of the image being denoised (the first grid), before any conditioning images' tokens: the
/// rows a training loss covers.
pub type Prepared = crate::mmdit::Prepared<usize>;

/// The Qwen-Image transformer.
#[derive(Clone)]
pub struct QwenImageTransformer {
    pub img_in: Linear,
    /// `txt_norm.weight` [joint_attention_dim].
    pub txt_norm: Tensor,
    pub txt_in: Linear,
    /// `time_text_embed.timestep_embedder`.
    pub time_text_embed: TimestepEmbedding,
    /// `transformer_blocks.*`, resident or streamed.
    pub transformer_blocks: BlockStack,
    pub norm_out: AdaNormOut,
    pub proj_out: Linear,
    cfg: QwenImageConfig,
}

impl QwenImageTransformer {
    /// Builds the model from the official (diffusers) key names under `vb`, every block on `vb`'s device. `vb`'s
    /// FP8 mode applies to the blocks' linears only: the embeddings and the head stay in the compute dtype.
    pub fn new(cfg: &QwenImageConfig, vb: &Vb) -> Result<Self> {
        Self::new_streamed(cfg, vb, &[], &OffloadOptions::default())
    }

    /// Builds the model with the blocks in `streamed` (indices into `transformer_blocks`) kept in host RAM and
    /// streamed through GPU slots (DESIGN.md §4.4): each is built on the CPU and packed before the next is read,
    /// so it never occupies the device beyond the slots.
    pub fn new_streamed(
        cfg: &QwenImageConfig,
        vb: &Vb,
        streamed: &[usize],
        offload: &OffloadOptions,
    ) -> Result<Self> {
        cfg.validate()?;
        let dim = cfg.inner_dim();
        let block_at = |i: usize, vb: &Vb| {
            DualStreamBlock::new(
                cfg.inner_dim(),
                cfg.attention_head_dim,
                cfg.mlp_hidden_dim(),
                &vb.pp("transformer_blocks").pp(i),
            )
        };
        let transformer_blocks = BlockStack::load(
            "Qwen-Image",
            cfg.num_layers,
            vb,
            block_at,
            streamed,
            offload,
        )?;
        // Past the blocks, nothing is quantised.
        let vb = &vb.with_fp8(None);
        Ok(Self {
            img_in: Linear::load(&vb.pp("img_in"), cfg.in_channels, dim)?,
            txt_norm: vb.pp("txt_norm").get(cfg.joint_attention_dim, "weight")?,
            txt_in: Linear::load(&vb.pp("txt_in"), cfg.joint_attention_dim, dim)?,
            time_text_embed: TimestepEmbedding::new(
                dim,
                &vb.pp("time_text_embed").pp("timestep_embedder"),
            )?,
            transformer_blocks,
            norm_out: AdaNormOut::new(dim, &vb.pp("norm_out"))?,
            proj_out: Linear::load(&vb.pp("proj_out"), dim, cfg.out_dim())?,
            cfg: cfg.clone(),
        })
    }

    /// The block streamer (`None` when every block is resident).
    pub fn streamer(&self) -> Option<&BlockStreamer> {
        self.transformer_blocks.streamer()
    }

    /// Declares the order the coming [`QwenImageTransformer::block`] calls will follow, so streamed blocks are
    /// prefetched (`cyclic`: the order repeats, as in sampling). Does nothing without streaming.
    pub fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        self.transformer_blocks.begin(order, cyclic)
    }

    /// Block `i`, ready to run: a resident block as it is, a streamed one with its weights in a GPU slot. Work
    /// reading a streamed block must be queued before the next call (the slot may then be refilled).
    pub fn block(&self, i: usize) -> Result<Cow<'_, DualStreamBlock>> {
        self.transformer_blocks.block(i)
    }

    /// The model's sizes.
    pub fn config(&self) -> &QwenImageConfig {
        &self.cfg
    }

    /// Every block linear by its full path (`transformer_blocks.0.attn.to_q`, …), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        self.transformer_blocks
            .linears_mut("transformer_blocks", DualStreamBlock::linears_mut)
    }

    /// Runs the embeddings: the joint sequence [b, txt_len + img_len, dim] and what every block shares.
    pub fn prepare(&self, inputs: &QwenImageInputs) -> Result<Prepared> {
        let (b, img_len, _) = inputs.img.dims3()?;
        let (_, txt_len, _) = inputs.txt.dims3()?;
        let grid_tokens: usize = inputs.img_grids.iter().map(ImageGrid::tokens).sum();
        if grid_tokens != img_len {
            candle_core::bail!(
                "Qwen-Image: the image grids {:?} hold {grid_tokens} tokens, the latents {img_len}",
                inputs.img_grids
            );
        }
        if let Some(lens) = &inputs.txt_lens {
            if lens.len() != b || lens.iter().any(|&n| n > txt_len) {
                candle_core::bail!(
                    "Qwen-Image: text lengths {lens:?} for a batch of {b} with {txt_len} text tokens"
                );
            }
        }
        let dtype = inputs.txt.dtype();
        let img = self.img_in.forward(&inputs.img)?;
        let txt = rms_norm(&inputs.txt, Some(&self.txt_norm), TXT_NORM_EPS)?;
        let txt = self.txt_in.forward(&txt)?;
        let temb = self.time_text_embed.forward(&inputs.timesteps, dtype)?;
        let rope = rope::rope(
            &inputs.img_grids,
            txt_len,
            &self.cfg.axes_dims_rope,
            b,
            img.device(),
        )?;
        Ok(Prepared {
            xs: Tensor::cat(&[&txt, &img], 1)?,
            blocks: BlockInputs {
                temb,
                rope,
                txt_len,
                txt_lens: inputs.txt_lens.clone(),
            },
            head: inputs.img_grids.first().map_or(img_len, ImageGrid::tokens),
        })
    }

    /// The head on the last block's output: the image rows' prediction [b, img_len, patch_size² · out_channels].
    pub fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Tensor> {
        let t = prepared.blocks.txt_len;
        let img = xs.narrow(1, t, xs.dim(1)? - t)?;
        let normed = self.norm_out.forward(&img, &prepared.blocks.temb)?;
        self.proj_out.forward(&normed)
    }

    /// The whole forward pass, as the official `forward`.
    pub fn forward(&self, inputs: &QwenImageInputs) -> Result<Tensor> {
        let prepared = self.prepare(inputs)?;
        let xs = self
            .transformer_blocks
            .forward(&prepared.xs, &prepared.blocks)?;
        self.finish(&xs, &prepared)
    }
}

#[cfg(test)]
mod tests;
