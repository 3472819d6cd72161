//! The LTX-2 / LTX-2.3 transformer's video stream with ltx-core's key names (`LTXModel`): `patchify_proj` of the
//! patchified latents, the AdaLN-single timestep embedding (`adaln_single`; LTX-2.3's `prompt_adaln_single` for
//! the cross-attention's context), LTX-2's `caption_projection` of the text, the RoPE table of the tokens'
//! positions, the blocks, and the head (`scale_shift_table` with the embedded timestep around a parameter-free
//! LayerNorm, `proj_out`). Text-to-video without audio: the audio stream's and the audio-video cross-attentions'
//! weights stay unread (ltx-core computes nothing for them when no audio is given).

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};

use super::block::{BlockInputs, Ltx2Block};
use super::config::Ltx2Config;
use super::embeddings::{AdaLayerNormSingle, CaptionProjection};
use super::rope::RopeTable;
use framesmith_nn::linear::Linear;
use framesmith_nn::norm::layer_norm;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions, Streamable};
use framesmith_nn::vb::Vb;

/// One batch as the transformer takes it.
pub struct Ltx2Inputs {
    /// Noisy latents, patchified: [b, frames·height·width, in_channels] (ltx-core's `VideoLatentPatchifier`
    /// order, frame-major).
    pub latents: Tensor,
    /// The noise level σ of each sample (every token of a sample shares it).
    pub sigmas: Vec<f32>,
    /// Patch bounds [b, 3, tokens, 2] (see [`super::rope::video_positions`]).
    pub positions: Tensor,
    /// The text context: the connector's output ([b, text_len, caption_channels] for LTX-2, [b, text_len, dim]
    /// for LTX-2.3).
    pub context: Tensor,
    /// Valid text tokens per sample; `None`: all.
    pub context_lens: Option<Vec<usize>>,
}

/// The embeddings' results: the first block's input, what the blocks share, and what the head needs.
pub struct Prepared {
    /// Video tokens [b, tokens, dim].
    pub xs: Tensor,
    pub blocks: BlockInputs,
    /// The embedded timestep [b, 1, dim] the head modulates with.
    pub embedded: Tensor,
}

/// The video stream of `LTXModel`.
pub struct Ltx2Transformer {
    pub cfg: Ltx2Config,
    pub patchify_proj: Linear,
    pub adaln_single: AdaLayerNormSingle,
    pub prompt_adaln_single: Option<AdaLayerNormSingle>,
    pub caption_projection: Option<CaptionProjection>,
    /// `transformer_blocks.*` (a streamed block's shell points at a GPU slot: reach blocks through
    /// [`Ltx2Transformer::block`]).
    pub transformer_blocks: Vec<Ltx2Block>,
    /// `scale_shift_table` [2, dim] of the head.
    pub scale_shift_table: Tensor,
    pub proj_out: Linear,
    streamer: Option<Arc<BlockStreamer>>,
}

impl Ltx2Transformer {
    /// Reads the video stream under `vb` (the model's root: `patchify_proj.weight` is `vb`'s `patchify_proj`),
    /// every block on `vb`'s device.
    pub fn load(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        Self::load_streamed(vb, cfg, &[], &OffloadOptions::default())
    }

    /// [`Ltx2Transformer::load`] with the blocks in `streamed` kept in host RAM and streamed through GPU slots
    /// (DESIGN.md §4.4). `vb`'s FP8 mode applies to the blocks' linears only.
    pub fn load_streamed(
        vb: &Vb,
        cfg: &Ltx2Config,
        streamed: &[usize],
        offload: &OffloadOptions,
    ) -> Result<Self> {
        cfg.validate()?;
        let n = cfg.num_layers;
        let mut streamed = streamed.to_vec();
        streamed.sort_unstable();
        streamed.dedup();
        if let Some(&i) = streamed.iter().find(|&&i| i >= n) {
            candle_core::bail!(
                "LTX-2: streamed block {i} is out of range (the model has {n} blocks)"
            );
        }
        let block_at = |i: usize, vb: &Vb| Ltx2Block::load(&vb.pp("transformer_blocks").pp(i), cfg);
        let mut blocks = Vec::with_capacity(n);
        for i in (0..n).filter(|i| streamed.binary_search(i).is_err()) {
            blocks.push((i, block_at(i, vb)?));
        }
        let streamer = if streamed.is_empty() {
            None
        } else {
            let host = vb.with_device(&Device::Cpu);
            let built = streamed.iter().map(|&i| Ok((i, block_at(i, &host)?)));
            let (streamer, shells) = BlockStreamer::new(vb.device(), n, built, offload)?;
            blocks.extend(shells);
            Some(Arc::new(streamer))
        };
        blocks.sort_by_key(|(i, _)| *i);
        // Past the blocks, nothing is quantised.
        let vb = &vb.with_fp8(None);
        let dim = cfg.inner_dim();
        let prompt = if cfg.cross_attention_adaln && cfg.use_prompt_adaln_single {
            Some(AdaLayerNormSingle::load(
                &vb.pp("prompt_adaln_single"),
                dim,
                2,
            )?)
        } else {
            None
        };
        let caption = match (cfg.has_caption_projection(), cfg.caption_channels) {
            (true, Some(channels)) => Some(CaptionProjection::load(
                &vb.pp("caption_projection"),
                channels,
                dim,
            )?),
            _ => None,
        };
        Ok(Self {
            cfg: cfg.clone(),
            patchify_proj: Linear::load(&vb.pp("patchify_proj"), cfg.in_channels, dim)?,
            adaln_single: AdaLayerNormSingle::load(
                &vb.pp("adaln_single"),
                dim,
                cfg.adaln_coefficient(),
            )?,
            prompt_adaln_single: prompt,
            caption_projection: caption,
            transformer_blocks: blocks.into_iter().map(|(_, b)| b).collect(),
            scale_shift_table: vb.get((2, dim), "scale_shift_table")?,
            proj_out: Linear::load(&vb.pp("proj_out"), dim, cfg.out_channels)?,
            streamer,
        })
    }

    /// The block streamer (`None` when every block is resident).
    pub fn streamer(&self) -> Option<&BlockStreamer> {
        self.streamer.as_deref()
    }

    /// Declares the order the coming [`Ltx2Transformer::block`] calls will follow (`cyclic`: the order repeats).
    /// Does nothing without streaming.
    pub fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        match &self.streamer {
            Some(s) => s.begin(order, cyclic),
            None => Ok(()),
        }
    }

    /// Block `i`, ready to run: a resident block as it is, a streamed one with its weights in a GPU slot.
    pub fn block(&self, i: usize) -> Result<Cow<'_, Ltx2Block>> {
        let Some(block) = self.transformer_blocks.get(i) else {
            candle_core::bail!(
                "LTX-2: no block {i} (the model has {})",
                self.transformer_blocks.len()
            );
        };
        match self.streamer.as_ref().filter(|s| s.is_streamed(i)) {
            Some(s) => Ok(Cow::Owned(block.with_frozen(&s.fetch(i)?)?)),
            None => Ok(Cow::Borrowed(block)),
        }
    }

    /// Every block linear by its full path (`transformer_blocks.0.attn1.to_q`, …), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        self.transformer_blocks
            .iter_mut()
            .enumerate()
            .flat_map(|(i, block)| {
                block
                    .linears_mut()
                    .into_iter()
                    .map(move |(path, l)| (format!("transformer_blocks.{i}.{path}"), l))
            })
            .collect()
    }

    /// The embeddings of `inputs`: patchified tokens, AdaLN rows, the projected text and the RoPE table.
    pub fn prepare(&self, inputs: &Ltx2Inputs) -> Result<Prepared> {
        let dtype = inputs.latents.dtype();
        let b = inputs.latents.dim(0)?;
        if inputs.sigmas.len() != b {
            candle_core::bail!("LTX-2: {} sigmas for a batch of {b}", inputs.sigmas.len());
        }
        let scaled: Vec<f32> = inputs
            .sigmas
            .iter()
            .map(|s| s * self.cfg.timestep_scale_multiplier as f32)
            .collect();
        let xs = self.patchify_proj.forward(&inputs.latents)?;
        let (rows, embedded) = self.adaln_single.forward(&scaled, dtype)?;
        let prompt_timestep = match &self.prompt_adaln_single {
            Some(p) => Some(p.forward(&scaled, dtype)?.0.unsqueeze(1)?),
            None => None,
        };
        let context = match &self.caption_projection {
            Some(p) => p.forward(&inputs.context)?,
            None => inputs.context.clone(),
        };
        let rope = RopeTable::new(&inputs.positions, &self.cfg, dtype, xs.device())?;
        Ok(Prepared {
            xs,
            blocks: BlockInputs {
                timestep: rows.unsqueeze(1)?,
                prompt_timestep,
                rope,
                context,
                context_lens: inputs.context_lens.clone(),
            },
            embedded: embedded.unsqueeze(1)?,
        })
    }

    /// The head on the last block's output `xs` [b, tokens, dim]: the velocity [b, tokens, out_channels].
    pub fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Tensor> {
        let dtype = xs.dtype();
        let table = self.scale_shift_table.to_dtype(dtype)?;
        let embedded = prepared.embedded.to_dtype(dtype)?;
        let shift = embedded.broadcast_add(&table.get(0)?)?;
        let scale = embedded.broadcast_add(&table.get(1)?)?;
        let normed = layer_norm(xs, None, None, self.cfg.norm_eps)?;
        let h = normed
            .broadcast_mul(&(scale + 1.0)?)?
            .broadcast_add(&shift)?;
        self.proj_out.forward(&h)
    }

    /// The whole forward (differentiable): the velocity [b, tokens, out_channels].
    pub fn forward(&self, inputs: &Ltx2Inputs) -> Result<Tensor> {
        let prepared = self.prepare(inputs)?;
        let mut xs = prepared.xs.clone();
        let order: Vec<usize> = (0..self.transformer_blocks.len()).collect();
        self.begin_blocks(&order, false)?;
        for i in order {
            xs = self.block(i)?.forward(&xs, &prepared.blocks)?;
        }
        self.finish(&xs, &prepared)
    }

    /// The dtype the model's weights were read in.
    pub fn dtype(&self) -> DType {
        self.scale_shift_table.dtype()
    }
}

#[cfg(test)]
mod tests;
