//! `WanModel`: the whole Wan DiT — embeddings, the block stack, head and unpatchify — for batches of samples with
//! different latent sizes padded to `seq_len` as the official code does. The block loop is exposed
//! (`prepare` → `blocks` → `finish`) so the training step can checkpoint and stream block by block.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};

use super::block::{Block, BlockInputs, Head};
use super::config::WanConfig;
use super::embeddings::{ImageEmbedding, PatchEmbedding, TextEmbedding, TimeEmbedding};
use super::rope::{Rope, RopeCache};
use framesmith_nn::fp8::Fp8Scale;
use framesmith_nn::linear::Linear;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions, Streamable};
use framesmith_nn::vb::Vb;

mod park;

/// Diffusion timesteps in the model's scale (0..1000): one per sample, or one per token (Wan 2.2 TI2V,
/// `[sample][seq_len]`, padding positions included).
#[derive(Clone, Debug)]
pub enum Timesteps {
    PerSample(Vec<f64>),
    PerToken(Vec<Vec<f64>>),
}

/// One forward call's inputs, as the official `WanModel.forward` takes them.
#[derive(Clone)]
pub struct WanInputs {
    /// Noisy latents `x_i` [in_dim − y channels, F, H, W].
    pub latents: Vec<Tensor>,
    pub timesteps: Timesteps,
    /// Text embeddings `context_i` [L_i ≤ text_len, text_dim].
    pub context: Vec<Tensor>,
    /// Padded token count; `None` uses the longest sample.
    pub seq_len: Option<usize>,
    /// CLIP image features [b, 257, clip_dim] (Wan 2.1 I2V).
    pub clip: Option<Tensor>,
    /// I2V conditioning `y_i` [C_y, F, H, W], concatenated to the latents along channels.
    pub y: Option<Vec<Tensor>>,
}

impl WanInputs {
    /// The same inputs on `device` (through [`framesmith_nn::ops::to_device`]; each tensor already there is
    /// shared, not copied): for an
    /// expert that lives on another GPU than the one its inputs were made on.
    pub fn to_device(&self, device: &Device) -> Result<WanInputs> {
        use framesmith_nn::ops::{all_to_device, to_device};
        Ok(WanInputs {
            latents: all_to_device(&self.latents, device)?,
            timesteps: self.timesteps.clone(),
            context: all_to_device(&self.context, device)?,
            seq_len: self.seq_len,
            clip: self
                .clip
                .as_ref()
                .map(|t| to_device(t, device))
                .transpose()?,
            y: self
                .y
                .as_deref()
                .map(|ys| all_to_device(ys, device))
                .transpose()?,
        })
    }
}

/// The embedded inputs of one forward pass: the block stack's input and what every block shares.
#[derive(Clone)]
pub struct Prepared {
    /// Block-0 input [b, seq_len, dim] in the residual dtype.
    pub x: Tensor,
    /// Time embedding [b, lt, dim] (f32) for the head.
    pub e: Tensor,
    pub blocks: BlockInputs,
    /// Latent grid (frames, height, width in patches) of each sample.
    pub grid_sizes: Vec<[usize; 3]>,
}

/// How the DiT is built from its checkpoint tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelOptions {
    /// The residual stream's dtype (f32 in the official code; bf16 as musubi-tuner since v0.2.10).
    pub residual_dtype: DType,
    /// Quantise (or keep) the block linears in FP8 with this scale granularity; other layers stay dense, as in
    /// musubi-tuner.
    pub blocks_fp8: Option<Fp8Scale>,
    /// The FP8 block linears multiply on FP8 tensor cores (`model.fp8_matmul`; see
    /// [`framesmith_nn::fp8::Fp8Weight::for_fp8_products`]).
    pub fp8_products: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            residual_dtype: DType::F32,
            blocks_fp8: None,
            fp8_products: false,
        }
    }
}

/// Tokens per chunk of the cross-attention and FFN in [`WanModel::forward_untracked`]: a 720p clip (75,600 tokens)
/// runs in five chunks, each FFN hidden activation 0.45 GB instead of 2.1 GB for a 14B model.
pub const INFERENCE_CHUNK_TOKENS: usize = 16_384;

/// The Wan diffusion transformer.
#[derive(Clone)]
pub struct WanModel {
    cfg: WanConfig,
    patch_embedding: PatchEmbedding,
    text_embedding: TextEmbedding,
    time: TimeEmbedding,
    img_emb: Option<ImageEmbedding>,
    blocks: Vec<Block>,
    head: Head,
    residual_dtype: DType,
    compute_dtype: DType,
    device: Device,
    /// The streamed blocks' host masters and GPU ring (`blocks` then holds their shells).
    streamer: Option<Arc<BlockStreamer>>,
    /// The resident blocks' frozen weights wait in host RAM ([`WanModel::park`]).
    parked: bool,
    /// Host copies of the resident blocks' frozen weights, by block, made at the first park and kept: the
    /// weights are frozen, so later parks only drop the device copies.
    host_frozen: Vec<Option<Vec<Tensor>>>,
    /// The RoPE host tables of the last grids [`WanModel::prepare`] embedded (every step of a run uses the same).
    rope_tables: RopeCache,
}

impl WanModel {
    /// Builds the model from official-named tensors. `vb.dtype()` is the compute dtype of the linear layers.
    pub fn new(cfg: &WanConfig, vb: Vb, options: &ModelOptions) -> Result<Self> {
        let residual_dtype = options.residual_dtype;
        let vb_blocks = vb
            .pp("blocks")
            .with_fp8(options.blocks_fp8)
            .with_fp8_products(options.fp8_products);
        let img_emb = if cfg.has_clip() {
            Some(ImageEmbedding::new(cfg, vb.pp("img_emb"))?)
        } else {
            None
        };
        let blocks = (0..cfg.num_layers)
            .map(|i| Block::new(cfg, vb_blocks.pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            patch_embedding: PatchEmbedding::new(cfg, vb.pp("patch_embedding"))?,
            text_embedding: TextEmbedding::new(cfg, vb.pp("text_embedding"))?,
            time: TimeEmbedding::new(cfg, vb.pp("time_embedding"), vb.pp("time_projection"))?,
            img_emb,
            blocks,
            head: Head::new(cfg, vb.pp("head"))?,
            residual_dtype,
            compute_dtype: vb.dtype(),
            device: vb.device().clone(),
            streamer: None,
            parked: false,
            host_frozen: Vec::new(),
            rope_tables: RopeCache::default(),
        })
    }

    /// Builds the model with the blocks in `streamed` kept in host RAM and streamed through a ring of GPU slots
    /// (DESIGN.md §4.4): those blocks are built on the CPU (quantised there for FP8) one at a time, each packed
    /// before the next is read, and never occupy the device beyond the ring.
    pub fn new_streamed(
        cfg: &WanConfig,
        vb: Vb,
        options: &ModelOptions,
        streamed: &[usize],
        offload: &OffloadOptions,
    ) -> Result<Self> {
        let mut resident_cfg = cfg.clone();
        resident_cfg.num_layers = 0;
        let mut model = Self::new(&resident_cfg, vb.clone(), options)?;
        model.cfg = cfg.clone();
        let vb_blocks = vb
            .pp("blocks")
            .with_fp8(options.blocks_fp8)
            .with_fp8_products(options.fp8_products);
        let host = vb_blocks.with_device(&Device::Cpu);
        let mut streamed: Vec<usize> = streamed.to_vec();
        streamed.sort_unstable();
        streamed.dedup();
        if streamed.is_empty() {
            for i in 0..cfg.num_layers {
                model.blocks.push(Block::new(cfg, vb_blocks.pp(i))?);
            }
            return Ok(model);
        }
        if streamed.iter().any(|&i| i >= cfg.num_layers) {
            candle_core::bail!("streamed block indices must lie within the model");
        }
        // Resident blocks first (straight to the device), then the streamed ones, each read, built on the host and
        // packed in turn by the streamer.
        let mut resident = Vec::with_capacity(cfg.num_layers - streamed.len());
        for i in (0..cfg.num_layers).filter(|i| !streamed.contains(i)) {
            resident.push((i, Block::new(cfg, vb_blocks.pp(i))?));
        }
        let built = streamed
            .iter()
            .map(|&i| Ok((i, Block::new(cfg, host.pp(i))?)));
        let (streamer, shells) = BlockStreamer::new(&model.device, cfg.num_layers, built, offload)?;
        let mut blocks: Vec<(usize, Block)> = resident.into_iter().chain(shells).collect();
        blocks.sort_by_key(|(i, _)| *i);
        model.blocks = blocks.into_iter().map(|(_, b)| b).collect();
        model.streamer = Some(Arc::new(streamer));
        Ok(model)
    }

    /// Streams the blocks in `streamed` of an already built model: their weights move to host RAM (packed) and
    /// the device copies are dropped. LoRAs attached to them stay where they are.
    pub fn stream_blocks(&mut self, streamed: &[usize], offload: &OffloadOptions) -> Result<()> {
        if self.streamer.is_some() {
            candle_core::bail!("the model already streams blocks");
        }
        let mut taken = Vec::with_capacity(streamed.len());
        for &i in streamed {
            match self.blocks.get(i) {
                Some(b) => taken.push((i, b.clone())),
                None => candle_core::bail!("block {i} out of range"),
            }
        }
        self.attach_streamer(taken, offload)
    }

    fn attach_streamer(
        &mut self,
        blocks: Vec<(usize, Block)>,
        offload: &OffloadOptions,
    ) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let n = self.cfg.num_layers;
        if blocks.windows(2).any(|w| w[0].0 >= w[1].0) || blocks.iter().any(|(i, _)| *i >= n) {
            candle_core::bail!("streamed block indices must be increasing and within the model");
        }
        if self.blocks.len() != n {
            candle_core::bail!("the model has {} blocks, expected {n}", self.blocks.len());
        }
        let (streamer, shells) =
            BlockStreamer::new(&self.device, n, blocks.into_iter().map(Ok), offload)?;
        for (i, shell) in shells {
            self.blocks[i] = shell;
        }
        self.streamer = Some(Arc::new(streamer));
        Ok(())
    }

    /// The block streamer, when some blocks stream.
    pub fn streamer(&self) -> Option<&BlockStreamer> {
        self.streamer.as_deref()
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Declares the order the coming [`WanModel::block`] calls will follow, so streamed blocks are prefetched
    /// (`cyclic`: the order repeats, as in sampling). Does nothing without streaming.
    pub fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        match &self.streamer {
            Some(s) => s.begin(order, cyclic),
            None => Ok(()),
        }
    }

    /// Block `i`, ready to run: resident blocks as they are, a streamed one with its weights in a GPU slot.
    /// Work reading a streamed block must be queued before the next call (the slot may then be refilled).
    pub fn block(&self, i: usize) -> Result<Cow<'_, Block>> {
        let Some(block) = self.blocks.get(i) else {
            candle_core::bail!("block {i} out of range");
        };
        match &self.streamer {
            Some(s) if s.is_streamed(i) => Ok(Cow::Owned(block.with_frozen(&s.fetch(i)?)?)),
            _ => Ok(Cow::Borrowed(block)),
        }
    }

    pub fn config(&self) -> &WanConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Every block linear layer with its official module path (`blocks.3.self_attn.q`), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        self.blocks
            .iter_mut()
            .enumerate()
            .flat_map(|(i, b)| {
                b.linears_mut()
                    .into_iter()
                    .map(move |(path, l)| (format!("blocks.{i}.{path}"), l))
            })
            .collect()
    }

    /// Embeds latents, timesteps and context; the result feeds the block loop.
    pub fn prepare(&self, inputs: &WanInputs) -> Result<Prepared> {
        if self.parked {
            candle_core::bail!(
                "this model is parked in host RAM (the inactive Wan2.2 expert); unpark it first"
            );
        }
        let b = inputs.latents.len();
        if inputs.context.len() != b {
            candle_core::bail!("{b} latents but {} text contexts", inputs.context.len());
        }
        let compute = self.compute_dtype;
        let mut tokens = Vec::with_capacity(b);
        let mut grid_sizes = Vec::with_capacity(b);
        for (i, x) in inputs.latents.iter().enumerate() {
            let x = match &inputs.y {
                Some(y) => Tensor::cat(&[x, &y[i]], 0)?,
                None => x.clone(),
            };
            let (t, grid) = self.patch_embedding.forward(&x.to_dtype(compute)?)?;
            tokens.push(t);
            grid_sizes.push(grid);
        }
        let seq_lens: Vec<usize> = tokens.iter().map(|t| t.dim(0)).collect::<Result<_>>()?;
        let longest = seq_lens.iter().copied().max().unwrap_or(0);
        let seq_len = inputs.seq_len.unwrap_or(longest);
        if longest > seq_len {
            candle_core::bail!("a sample has {longest} tokens, more than seq_len {seq_len}");
        }
        let x = Tensor::stack(
            &tokens
                .iter()
                .map(|t| t.pad_with_zeros(0, 0, seq_len - t.dim(0)?))
                .collect::<Result<Vec<_>>>()?,
            0,
        )?
        .to_dtype(self.residual_dtype)?;

        let (e, e0) = self.time.forward(
            &self.timestep_rows(&inputs.timesteps, b, seq_len)?,
            &self.device,
        )?;

        let context = Tensor::stack(
            &inputs
                .context
                .iter()
                .map(|c| self.pad_context(c))
                .collect::<Result<Vec<_>>>()?,
            0,
        )?;
        let context = self.text_embedding.forward(&context.to_dtype(compute)?)?;
        let context_img = match (&self.img_emb, &inputs.clip) {
            (Some(img_emb), Some(clip)) => Some(img_emb.forward(&clip.to_dtype(compute)?)?),
            (Some(_), None) => candle_core::bail!("this I2V model needs CLIP image features"),
            _ => None,
        };
        let rope = Rope::cached(
            &self.rope_tables,
            &grid_sizes,
            (seq_len, self.cfg.head_dim()),
            compute,
            &self.device,
        )?;
        Ok(Prepared {
            x,
            e,
            blocks: BlockInputs {
                e0,
                seq_lens,
                rope,
                context,
                context_img,
            },
            grid_sizes,
        })
    }

    /// Timestep rows [b][lt]: per-token rows that are constant collapse to one value per sample (identical
    /// results, and the modulation tensors stay [b, 1, 6, dim] instead of [b, seq_len, 6, dim]).
    fn timestep_rows(
        &self,
        timesteps: &Timesteps,
        b: usize,
        seq_len: usize,
    ) -> Result<Vec<Vec<f64>>> {
        match timesteps {
            Timesteps::PerSample(t) if t.len() == b => Ok(t.iter().map(|&v| vec![v]).collect()),
            Timesteps::PerToken(rows)
                if rows.len() == b && rows.iter().all(|r| r.len() == seq_len) =>
            {
                if rows.iter().all(|r| r.iter().all(|&v| v == r[0])) {
                    Ok(rows.iter().map(|r| vec![r[0]]).collect())
                } else {
                    Ok(rows.clone())
                }
            }
            _ => candle_core::bail!(
                "timesteps do not match the batch of {b} samples (seq_len {seq_len})"
            ),
        }
    }

    fn pad_context(&self, c: &Tensor) -> Result<Tensor> {
        let (l, d) = c.dims2()?;
        if l > self.cfg.text_len || d != self.cfg.text_dim {
            candle_core::bail!(
                "text context [{l}, {d}] does not fit the model (at most {} tokens of width {})",
                self.cfg.text_len,
                self.cfg.text_dim
            );
        }
        c.pad_with_zeros(0, 0, self.cfg.text_len - l)
    }

    /// Head and unpatchify: block-stack output [b, seq_len, dim] → one [out_dim, F, H, W] tensor per sample (f32).
    pub fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        let out = self.head.forward(xs, &prepared.e)?;
        let [pt, ph, pw] = self.cfg.patch_size;
        let c = self.cfg.out_dim;
        prepared
            .grid_sizes
            .iter()
            .enumerate()
            .map(|(i, &[f, h, w])| {
                out.get(i)?
                    .narrow(0, 0, f * h * w)?
                    .reshape(&[f, h, w, pt, ph, pw, c][..])?
                    .permute(vec![6, 0, 3, 1, 4, 2, 5])?
                    .reshape((c, f * pt, h * ph, w * pw))
            })
            .collect()
    }

    /// The whole forward pass, tracked for autograd: with trainable LoRA attached, every block's intermediates
    /// stay alive until the outputs are dropped (what a backward pass through it needs).
    pub fn forward(&self, inputs: &WanInputs) -> Result<Vec<Tensor>> {
        self.forward_with(inputs, |block, xs, shared| block.forward(xs, shared))
    }

    /// The whole forward pass for inference (generation, samples during training): nothing is recorded for a
    /// backward, even with trainable LoRA attached ([`framesmith_nn::lora::untracked`]), so each intermediate is
    /// freed as soon as it is used — no block keeps a tape, which at 720p is several GiB a block — and each
    /// block's cross-attention and FFN run [`INFERENCE_CHUNK_TOKENS`] tokens at a time.
    pub fn forward_untracked(&self, inputs: &WanInputs) -> Result<Vec<Tensor>> {
        framesmith_nn::lora::untracked(|| {
            self.forward_with(inputs, |block, xs, shared| {
                block.forward_chunked(&xs.detach(), shared, INFERENCE_CHUNK_TOKENS)
            })
        })
    }

    /// Embeddings, every block in order through `run_block`, and the head.
    fn forward_with(
        &self,
        inputs: &WanInputs,
        run_block: impl Fn(&Block, &Tensor, &BlockInputs) -> Result<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let prepared = self.prepare(inputs)?;
        let mut xs = prepared.x.clone();
        let order: Vec<usize> = (0..self.blocks.len()).collect();
        self.begin_blocks(&order, true)?;
        for i in order {
            xs = run_block(&*self.block(i)?, &xs, &prepared.blocks)?;
        }
        self.finish(&xs, &prepared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::random::{random_inputs, random_weights};

    /// A block run in token chunks computes the whole block, with per-sample and with per-token (Wan 2.2)
    /// modulation, for chunks that do and do not divide the tokens.
    #[test]
    fn chunked_blocks_compute_the_whole_block() -> Result<()> {
        let dev = Device::Cpu;
        let wan21 = WanConfig::tiny(1);
        let wan22 = WanConfig {
            generation: crate::wan::config::Generation::Wan22,
            ..wan21.clone()
        };
        for cfg in [wan21, wan22] {
            let weights = random_weights(&cfg, 5, DType::F32, &dev)?;
            let vb = Vb::from_tensors(weights, DType::F32, &dev);
            let model = WanModel::new(&cfg, vb, &ModelOptions::default())?;
            let mut inputs = random_inputs(&cfg, &[[2, 4, 4], [1, 4, 4]], 3, &dev)?;
            if cfg.per_token_time() {
                let row = |t0: f64| (0..8).map(|i| t0 + 10.0 * i as f64).collect::<Vec<_>>();
                inputs.timesteps = Timesteps::PerToken(vec![row(100.0), row(600.0)]);
            }
            let prepared = model.prepare(&inputs)?;
            let block = &model.blocks()[0];
            let whole = block.forward(&prepared.x, &prepared.blocks)?;
            for chunk in [1, 3, 8, 100] {
                let chunked = block.forward_chunked(&prepared.x, &prepared.blocks, chunk)?;
                let err = relative_error(&[chunked], std::slice::from_ref(&whole))?;
                assert!(err <= 1e-6, "chunk {chunk}: relative error {err}");
            }
        }
        Ok(())
    }

    fn relative_error(a: &[Tensor], b: &[Tensor]) -> Result<f64> {
        let (mut diff, mut norm) = (0f64, 0f64);
        for (x, y) in a.iter().zip(b) {
            diff += (x - y)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            norm += y.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
        Ok((diff / norm).sqrt())
    }

    #[test]
    fn fp8_block64_model_stays_within_two_percent_of_dense() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = WanConfig::tiny(2);
        let weights = random_weights(&cfg, 3, DType::F32, &dev)?;
        let build = |blocks_fp8| {
            let options = ModelOptions {
                residual_dtype: DType::F32,
                blocks_fp8,
                fp8_products: false,
            };
            WanModel::new(
                &cfg,
                Vb::from_tensors(weights.clone(), DType::F32, &dev),
                &options,
            )
        };
        let inputs = random_inputs(&cfg, &[[2, 8, 8], [1, 4, 6]], 4, &dev)?;
        let dense = build(None)?.forward(&inputs)?;
        let fp8 = build(Some(Fp8Scale::Block64))?.forward(&inputs)?;
        let err = relative_error(&fp8, &dense)?;
        eprintln!("FP8 block64 tiny model: relative output error {err:.4}");
        assert!(err < 0.02, "FP8 block64 output differs from dense by {err}");
        assert!(err > 0.0, "the FP8 path was not taken");
        Ok(())
    }
}
