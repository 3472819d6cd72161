//! The FLUX.1 DiT (`Flux` of the official `model.py`): input projections (`img_in`, `txt_in`), the conditioning
//! vector (`time_in` + `guidance_in` + `vector_in`), RoPE over the (t, h, w) ids, the double-stream then the
//! single-stream blocks on the joint [text; image] sequence, and the head on the image rows. One model for dev,
//! schnell and Kontext (whose conditioning image is extra image tokens with ids axis 0 = 1).

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};

use super::block::{BlockInputs, FluxBlock};
use super::config::FluxConfig;
use super::double_block::DoubleStreamBlock;
use super::embeddings::{timestep_embedding, MlpEmbedder, TIMESTEP_DIM};
use super::last_layer::LastLayer;
use super::rope::{Rope, RopeCache};
use super::single_block::SingleStreamBlock;
use framesmith_nn::linear::Linear;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions, Streamable};
use framesmith_nn::vb::Vb;

/// One batch as the official `Flux.forward` takes it.
#[derive(Clone, Debug)]
pub struct FluxInputs {
    /// Packed latent tokens [b, img_len, in_channels] (Kontext: conditioning tokens appended).
    pub img: Tensor,
    /// Their ids [b, img_len, n_axes].
    pub img_ids: Tensor,
    /// Text tokens (T5) [b, txt_len, context_in_dim].
    pub txt: Tensor,
    /// Their ids [b, txt_len, n_axes] (zeros).
    pub txt_ids: Tensor,
    /// Timesteps [b] in [0, 1].
    pub timesteps: Tensor,
    /// Pooled text vector (CLIP-L) [b, vec_in_dim].
    pub y: Tensor,
    /// Guidance strength [b]; required by guidance-distilled models (dev), ignored otherwise.
    pub guidance: Option<Tensor>,
}

/// What the embeddings produce: the first block's input (the joint sequence) and what every block shares.
#[derive(Clone)]
pub struct Prepared {
    pub xs: Tensor,
    pub blocks: BlockInputs,
    /// The image tokens being denoised (ids axis 0 = 0), before any Kontext conditioning tokens: the rows a
    /// training loss covers.
    pub target_len: usize,
}

/// The number of leading image tokens of sample 0 whose ids' axis 0 is 0 (the image being denoised; Kontext's
/// conditioning tokens follow with axis 0 = 1).
fn target_len(img_ids: &Tensor) -> Result<usize> {
    let axis0 = img_ids.get(0)?.narrow(1, 0, 1)?.flatten_all()?;
    let axis0 = axis0.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    Ok(axis0.iter().take_while(|&&a| a == 0.0).count())
}

/// The FLUX.1 DiT.
#[derive(Clone)]
pub struct Flux {
    pub img_in: Linear,
    pub time_in: MlpEmbedder,
    pub vector_in: MlpEmbedder,
    pub guidance_in: Option<MlpEmbedder>,
    pub txt_in: Linear,
    /// `double_blocks.*` then `single_blocks.*`.
    pub blocks: Vec<FluxBlock>,
    pub final_layer: LastLayer,
    cfg: FluxConfig,
    /// One streamer per block kind that streams (double-stream, single-stream): the two kinds' blocks have
    /// different layouts. `blocks` then holds the streamed blocks' shells.
    streamers: Vec<Arc<BlockStreamer>>,
    /// The RoPE host tables of the last ids [`Flux::prepare`] embedded (every step of a run uses the same).
    rope_tables: RopeCache,
}

impl Flux {
    /// Builds the model from official key names under `vb`, every block on `vb`'s device. `vb`'s FP8 mode
    /// ([`Vb::with_fp8`]) applies to the blocks' linears only, as Wan's `blocks_fp8`: the embeddings and the final
    /// layer stay in the compute dtype (an FP8 file's are dequantised; they are a few MB).
    pub fn new(cfg: &FluxConfig, vb: &Vb) -> Result<Self> {
        Self::new_streamed(cfg, vb, &[], &OffloadOptions::default())
    }

    /// Builds the model with the blocks in `streamed` (indices into [`Flux::blocks`]: double-stream blocks first,
    /// then single-stream) kept in host RAM and streamed through GPU slots (DESIGN.md §4.4): each is built on
    /// the CPU and packed before the next is read, so it never occupies the device beyond its kind's slots.
    pub fn new_streamed(
        cfg: &FluxConfig,
        vb: &Vb,
        streamed: &[usize],
        offload: &OffloadOptions,
    ) -> Result<Self> {
        cfg.validate()?;
        let dim = cfg.hidden_size;
        let n = cfg.depth + cfg.depth_single_blocks;
        let mut streamed = streamed.to_vec();
        streamed.sort_unstable();
        streamed.dedup();
        if let Some(&i) = streamed.iter().find(|&&i| i >= n) {
            candle_core::bail!(
                "FLUX: streamed block {i} is out of range (the model has {n} blocks)"
            );
        }
        let block_at = |i: usize, vb: &Vb| -> Result<FluxBlock> {
            if i < cfg.depth {
                let block = DoubleStreamBlock::new(cfg, &vb.pp("double_blocks").pp(i))?;
                Ok(FluxBlock::Double(block))
            } else {
                let block = SingleStreamBlock::new(cfg, &vb.pp("single_blocks").pp(i - cfg.depth))?;
                Ok(FluxBlock::Single(block))
            }
        };
        let mut blocks = Vec::with_capacity(n);
        for i in (0..n).filter(|i| streamed.binary_search(i).is_err()) {
            blocks.push((i, block_at(i, vb)?));
        }
        let host = vb.with_device(&Device::Cpu);
        // Past the blocks, nothing is quantised.
        let vb = &vb.with_fp8(None);
        let mut streamers = Vec::new();
        let (double, single): (Vec<usize>, Vec<usize>) =
            streamed.iter().copied().partition(|&i| i < cfg.depth);
        for kind in [double, single].into_iter().filter(|k| !k.is_empty()) {
            let built = kind.iter().map(|&i| Ok((i, block_at(i, &host)?)));
            let (streamer, shells) = BlockStreamer::new(vb.device(), n, built, offload)?;
            blocks.extend(shells);
            streamers.push(Arc::new(streamer));
        }
        blocks.sort_by_key(|(i, _)| *i);
        let guidance_in = if cfg.guidance_embed {
            Some(MlpEmbedder::new(TIMESTEP_DIM, dim, &vb.pp("guidance_in"))?)
        } else {
            None
        };
        Ok(Self {
            img_in: Linear::load(&vb.pp("img_in"), cfg.in_channels, dim)?,
            time_in: MlpEmbedder::new(TIMESTEP_DIM, dim, &vb.pp("time_in"))?,
            vector_in: MlpEmbedder::new(cfg.vec_in_dim, dim, &vb.pp("vector_in"))?,
            guidance_in,
            txt_in: Linear::load(&vb.pp("txt_in"), cfg.context_in_dim, dim)?,
            blocks: blocks.into_iter().map(|(_, b)| b).collect(),
            final_layer: LastLayer::new(dim, cfg.out_channels, &vb.pp("final_layer"))?,
            cfg: cfg.clone(),
            streamers,
            rope_tables: RopeCache::default(),
        })
    }

    /// The block streamers (one per block kind that streams; none when every block is resident).
    pub fn streamers(&self) -> impl Iterator<Item = &BlockStreamer> {
        self.streamers.iter().map(|s| s.as_ref())
    }

    /// Declares the order the coming [`Flux::block`] calls will follow, so streamed blocks are prefetched
    /// (`cyclic`: the order repeats, as in sampling). Does nothing without streaming.
    pub fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        self.streamers
            .iter()
            .try_for_each(|s| s.begin(order, cyclic))
    }

    /// Block `i`, ready to run: a resident block as it is, a streamed one with its weights in a GPU slot. Work
    /// reading a streamed block must be queued before the next call (the slot may then be refilled).
    pub fn block(&self, i: usize) -> Result<Cow<'_, FluxBlock>> {
        let Some(block) = self.blocks.get(i) else {
            candle_core::bail!("FLUX: no block {i} (the model has {})", self.blocks.len());
        };
        match self.streamers.iter().find(|s| s.is_streamed(i)) {
            Some(s) => Ok(Cow::Owned(block.with_frozen(&s.fetch(i)?)?)),
            None => Ok(Cow::Borrowed(block)),
        }
    }

    /// The model's sizes.
    pub fn config(&self) -> &FluxConfig {
        &self.cfg
    }

    /// The official checkpoint path of block `i` of [`Flux::blocks`] (`double_blocks.i` or `single_blocks.j`).
    pub fn block_prefix(&self, i: usize) -> String {
        let index_in_kind = if i < self.cfg.depth {
            i
        } else {
            i - self.cfg.depth
        };
        self.blocks
            .get(i)
            .map(|b| b.prefix(index_in_kind))
            .unwrap_or_default()
    }

    /// Every block linear by its full path (`double_blocks.0.img_attn.qkv`, …), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let prefixes: Vec<String> = (0..self.blocks.len())
            .map(|i| self.block_prefix(i))
            .collect();
        self.blocks
            .iter_mut()
            .zip(prefixes)
            .flat_map(|(block, prefix)| {
                block
                    .linears_mut()
                    .into_iter()
                    .map(move |(path, l)| (format!("{prefix}.{path}"), l))
            })
            .collect()
    }

    /// The conditioning vector `vec` [b, dim]: time_in + guidance_in + vector_in, in the compute dtype.
    pub fn conditioning(&self, inputs: &FluxInputs) -> Result<Tensor> {
        let dtype = inputs.txt.dtype();
        let t = timestep_embedding(&inputs.timesteps, TIMESTEP_DIM)?.to_dtype(dtype)?;
        let mut vec = self.time_in.forward(&t)?;
        if let Some(guidance_in) = &self.guidance_in {
            let Some(g) = &inputs.guidance else {
                candle_core::bail!(
                    "this FLUX model is guidance-distilled (dev): it needs a guidance strength"
                );
            };
            let g = timestep_embedding(g, TIMESTEP_DIM)?.to_dtype(dtype)?;
            vec = (vec + guidance_in.forward(&g)?)?;
        }
        vec + self.vector_in.forward(&inputs.y)?
    }

    /// Runs the embeddings: the joint sequence [b, txt_len + img_len, dim] and what every block shares.
    pub fn prepare(&self, inputs: &FluxInputs) -> Result<Prepared> {
        let img = self.img_in.forward(&inputs.img)?;
        let txt = self.txt_in.forward(&inputs.txt)?;
        let vec = self.conditioning(inputs)?;
        let ids = Tensor::cat(&[&inputs.txt_ids, &inputs.img_ids], 1)?;
        let rope = Rope::cached(
            &self.rope_tables,
            &ids,
            (&self.cfg.axes_dim, self.cfg.theta),
            img.device(),
        )?;
        Ok(Prepared {
            xs: Tensor::cat(&[&txt, &img], 1)?,
            blocks: BlockInputs {
                vec,
                rope,
                txt_len: txt.dim(1)?,
            },
            target_len: target_len(&inputs.img_ids)?,
        })
    }

    /// The head on the last block's output: the image rows' prediction [b, img_len, out_channels].
    pub fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Tensor> {
        let t = prepared.blocks.txt_len;
        let img = xs.narrow(1, t, xs.dim(1)? - t)?;
        self.final_layer.forward(&img, &prepared.blocks.vec)
    }

    /// The whole forward pass, as the official `Flux.forward`.
    pub fn forward(&self, inputs: &FluxInputs) -> Result<Tensor> {
        let prepared = self.prepare(inputs)?;
        let mut xs = prepared.xs.clone();
        let order: Vec<usize> = (0..self.blocks.len()).collect();
        self.begin_blocks(&order, true)?;
        for i in order {
            xs = self.block(i)?.forward(&xs, &prepared.blocks)?;
        }
        self.finish(&xs, &prepared)
    }
}

#[cfg(test)]
mod tests;
