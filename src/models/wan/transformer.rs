//! `WanModel`: the whole Wan DiT — embeddings, the block stack, head and unpatchify — for batches of samples with
//! different latent sizes padded to `seq_len` as the official code does. The block loop is exposed
//! (`prepare` → `blocks` → `finish`) so the training step can checkpoint and stream block by block.

use candle_core::{DType, Device, Result, Tensor};

use super::block::{Block, BlockInputs, Head};
use super::config::WanConfig;
use super::embeddings::{ImageEmbedding, PatchEmbedding, TextEmbedding, TimeEmbedding};
use super::rope::Rope;
use crate::nn::fp8::Fp8Scale;
use crate::nn::linear::Linear;
use crate::nn::vb::Vb;

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
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            residual_dtype: DType::F32,
            blocks_fp8: None,
        }
    }
}

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
}

impl WanModel {
    /// Builds the model from official-named tensors. `vb.dtype()` is the compute dtype of the linear layers.
    pub fn new(cfg: &WanConfig, vb: Vb, options: &ModelOptions) -> Result<Self> {
        let residual_dtype = options.residual_dtype;
        let vb_blocks = vb.pp("blocks").with_fp8(options.blocks_fp8);
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
        })
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
        let rope = Rope::new(
            &grid_sizes,
            seq_len,
            self.cfg.head_dim(),
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

    /// The whole forward pass.
    pub fn forward(&self, inputs: &WanInputs) -> Result<Vec<Tensor>> {
        let prepared = self.prepare(inputs)?;
        let mut xs = prepared.x.clone();
        for block in &self.blocks {
            xs = block.forward(&xs, &prepared.blocks)?;
        }
        self.finish(&xs, &prepared)
    }
}
