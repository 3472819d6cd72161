//! The HunyuanVideo 1.5 transformer (the official `HunyuanVideo_1_5_DiffusionTransformer`; diffusers'
//! `HunyuanVideo15Transformer3DModel`) with the official key names: `img_in` on the latent patches, `time_in` on
//! the raw timestep, the text refiner `txt_in` on the Qwen2.5-VL hidden states, the glyph projection `byt5_in`,
//! the I2V image projection `vision_in`, their `cond_type_embedding` rows, 3-D RoPE over the latent grid, the
//! double-stream blocks on the joint [text; latent] sequence, and `final_layer` + unpatchify on the latent rows.

use std::borrow::Cow;

use candle_core::{Result, Tensor};

use super::block::{linears_mut, load_block};
use super::conditioning::joint_text;
pub use super::conditioning::TextStates;
use super::config::HunyuanVideo15Config;
use super::embeddings::{
    patchify, unpatchify, ByT5Mapper, FinalLayer, PatchEmbed, TimestepEmbedder, VisionProjection,
};
use super::refiner::TokenRefiner;
use super::rope::{rope, VideoGrid};
use crate::mmdit::{BlockInputs, BlockStack, DualStreamBlock};
use framesmith_nn::linear::Linear;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions};
use framesmith_nn::vb::Vb;

/// One batch as the official forward takes it.
#[derive(Clone, Debug)]
pub struct HunyuanVideo15Inputs {
    /// The model input [b, in_channels, f, h, w]: noisy latents, condition latents and their mask
    /// ([`super::conditioning::model_input`]).
    pub latents: Tensor,
    /// Raw timesteps [b] (0–1000, the flow-matching t · 1000).
    pub timesteps: Tensor,
    /// Qwen2.5-VL hidden states [b, l, text_embed_dim] with their valid lengths.
    pub txt: TextStates,
    /// byT5 hidden states [b, l2, text_embed_2_dim] of the quoted glyph text (`None`: no glyph tokens).
    pub byt5: Option<TextStates>,
    /// SigLIP embeddings [b, n, image_embed_dim] of the I2V first frame (`None`, or all zeros as the T2V
    /// pipeline passes them: no image tokens).
    pub image_embeds: Option<Tensor>,
}

/// What the embeddings produce: the first block's input [b, txt_len + tokens, dim], what every block shares, and
/// (`head`) the latent grid the head folds the prediction back into.
pub type Prepared = crate::mmdit::Prepared<VideoGrid>;

/// The HunyuanVideo 1.5 transformer.
#[derive(Clone)]
pub struct HunyuanVideo15Transformer {
    pub img_in: PatchEmbed,
    pub time_in: TimestepEmbedder,
    pub txt_in: TokenRefiner,
    pub byt5_in: ByT5Mapper,
    pub vision_in: VisionProjection,
    /// `cond_type_embedding.weight` [3, dim]: rows for text (0), glyph (1) and image (2) tokens.
    pub cond_type_embedding: Tensor,
    /// `double_blocks.*`, resident or streamed.
    pub double_blocks: BlockStack,
    pub final_layer: FinalLayer,
    cfg: HunyuanVideo15Config,
}

impl HunyuanVideo15Transformer {
    /// Builds the model from the official key names under `vb`, every block on `vb`'s device. `vb`'s FP8 mode
    /// applies to the blocks' linears only.
    pub fn new(cfg: &HunyuanVideo15Config, vb: &Vb) -> Result<Self> {
        Self::new_streamed(cfg, vb, &[], &OffloadOptions::default())
    }

    /// Builds the model with the blocks in `streamed` (indices into `double_blocks`) kept in host RAM and
    /// streamed through GPU slots (DESIGN.md §4.4).
    pub fn new_streamed(
        cfg: &HunyuanVideo15Config,
        vb: &Vb,
        streamed: &[usize],
        offload: &OffloadOptions,
    ) -> Result<Self> {
        cfg.validate()?;
        let block_at = |i: usize, vb: &Vb| load_block(cfg, &vb.pp("double_blocks").pp(i));
        let double_blocks = BlockStack::load(
            "HunyuanVideo 1.5",
            cfg.num_layers,
            vb,
            block_at,
            streamed,
            offload,
        )?;
        // Past the blocks, nothing is quantised.
        let vb = &vb.with_fp8(None);
        Ok(Self {
            img_in: PatchEmbed::new(cfg, &vb.pp("img_in"))?,
            time_in: TimestepEmbedder::new(cfg.inner_dim(), &vb.pp("time_in"))?,
            txt_in: TokenRefiner::new(cfg, &vb.pp("txt_in"))?,
            byt5_in: ByT5Mapper::new(cfg, &vb.pp("byt5_in"))?,
            vision_in: VisionProjection::new(cfg, &vb.pp("vision_in"))?,
            cond_type_embedding: vb
                .pp("cond_type_embedding")
                .get((3, cfg.inner_dim()), "weight")?,
            double_blocks,
            final_layer: FinalLayer::new(cfg, &vb.pp("final_layer"))?,
            cfg: cfg.clone(),
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &HunyuanVideo15Config {
        &self.cfg
    }

    /// The block streamer (`None` when every block is resident).
    pub fn streamer(&self) -> Option<&BlockStreamer> {
        self.double_blocks.streamer()
    }

    /// Declares the order the coming [`HunyuanVideo15Transformer::block`] calls will follow (`cyclic`: the order
    /// repeats). Does nothing without streaming.
    pub fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        self.double_blocks.begin(order, cyclic)
    }

    /// Block `i`, ready to run: a resident block as it is, a streamed one with its weights in a GPU slot.
    pub fn block(&self, i: usize) -> Result<Cow<'_, DualStreamBlock>> {
        self.double_blocks.block(i)
    }

    /// Every block linear by its full official path (`double_blocks.0.img_attn_q`, …), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        self.double_blocks.linears_mut("double_blocks", linears_mut)
    }

    /// `xs` plus row `kind` of `cond_type_embedding`.
    fn with_cond_type(&self, xs: &Tensor, kind: usize) -> Result<Tensor> {
        let row = self.cond_type_embedding.get(kind)?.to_dtype(xs.dtype())?;
        xs.broadcast_add(&row)
    }

    /// The image tokens of an I2V batch at the model width, `None` for T2V (no embeds, or all zeros).
    fn image_tokens(&self, image_embeds: Option<&Tensor>) -> Result<Option<Tensor>> {
        let Some(embeds) = image_embeds else {
            return Ok(None);
        };
        if embeds
            .abs()?
            .max_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_scalar::<f32>()?
            == 0.0
        {
            return Ok(None);
        }
        Ok(Some(
            self.with_cond_type(&self.vision_in.forward(embeds)?, 2)?,
        ))
    }

    /// Runs the embeddings: the joint sequence and what every block shares.
    pub fn prepare(&self, inputs: &HunyuanVideo15Inputs) -> Result<Prepared> {
        let cfg = &self.cfg;
        let (b, _, f, h, w) = inputs.latents.dims5()?;
        let (pt, p) = (cfg.patch_size_t, cfg.patch_size);
        let grid = VideoGrid {
            frames: f / pt,
            height: h / p,
            width: w / p,
        };
        let dtype = inputs.txt.states.dtype();
        let img = self
            .img_in
            .proj
            .forward(&patchify(&inputs.latents, (pt, p))?)?;
        let temb = self.time_in.forward(&inputs.timesteps, dtype)?;
        let txt = self
            .txt_in
            .forward(&inputs.txt.states, &inputs.timesteps, &inputs.txt.lens)?;
        let txt = TextStates {
            states: self.with_cond_type(&txt, 0)?,
            lens: inputs.txt.lens.clone(),
        };
        let byt5 = match &inputs.byt5 {
            Some(g) => Some(TextStates {
                states: self.with_cond_type(&self.byt5_in.forward(&g.states)?, 1)?,
                lens: g.lens.clone(),
            }),
            None => None,
        };
        let image = self.image_tokens(inputs.image_embeds.as_ref())?;
        let (joint, txt_lens) = joint_text(image.as_ref(), byt5.as_ref(), &txt)?;
        let txt_len = joint.dim(1)?;
        let rope = rope(
            grid,
            txt_len,
            (&cfg.rope_axes_dim, cfg.rope_theta),
            b,
            img.device(),
        )?;
        Ok(Prepared {
            xs: Tensor::cat(&[&joint, &img], 1)?,
            blocks: BlockInputs {
                temb,
                rope,
                txt_len,
                txt_lens: Some(txt_lens),
            },
            head: grid,
        })
    }

    /// The head on the last block's output: the prediction [b, out_channels, f, h, w].
    pub fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Tensor> {
        let t = prepared.blocks.txt_len;
        let img = xs.narrow(1, t, xs.dim(1)? - t)?;
        let out = self.final_layer.forward(&img, &prepared.blocks.temb)?;
        let g = prepared.head;
        unpatchify(
            &out,
            (g.frames, g.height, g.width),
            (self.cfg.patch_size_t, self.cfg.patch_size),
        )
    }

    /// The whole forward pass, as the official `forward`.
    pub fn forward(&self, inputs: &HunyuanVideo15Inputs) -> Result<Tensor> {
        let prepared = self.prepare(inputs)?;
        let xs = self.double_blocks.forward(&prepared.xs, &prepared.blocks)?;
        self.finish(&xs, &prepared)
    }
}

#[cfg(test)]
mod tests;
