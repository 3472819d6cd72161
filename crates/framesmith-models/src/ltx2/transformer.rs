//! The LTX-2 / LTX-2.3 transformer's video stream with ltx-core's key names (`LTXModel`): `patchify_proj` of the
//! patchified latents, the AdaLN-single timestep embedding (`adaln_single`; LTX-2.3's `prompt_adaln_single` for
//! the cross-attention's context), LTX-2's `caption_projection` of the text, the RoPE table of the tokens'
//! positions, the blocks, and the head (`scale_shift_table` with the embedded timestep around a parameter-free
//! LayerNorm, `proj_out`). Text-to-video reads the video stream only (ltx-core computes nothing for the audio
//! stream when no audio is given). Read with audio ([`Ltx2Transformer::load_streamed_av`]), the model also holds
//! the audio stream's embeddings and head (`audio_patchify_proj`, `audio_adaln_single`, LTX-2's
//! `audio_caption_projection`, LTX-2.3's `audio_prompt_adaln_single`, `audio_scale_shift_table`,
//! `audio_proj_out`) and the audio-video cross-attentions' AdaLNs (`av_ca_*_adaln_single`), and a batch with
//! audio latents runs both streams jointly.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};

use super::block::{unpack_joint, AudioInputs, BlockInputs, BlockTables, Ltx2Block, PassRows};
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
    /// Valid text tokens per sample (of both streams' texts); `None`: all.
    pub context_lens: Option<Vec<usize>>,
    /// The audio stream of a joint audio-video batch (at the same σ, as the official trainer noises it);
    /// `None`: text-to-video.
    pub audio: Option<Ltx2AudioInputs>,
    /// First-frame conditioning (the official trainer's `first_frame_conditioning_p`): the leading video tokens
    /// of each sample that are clean conditioning, at timestep 0 (per-token timesteps; the rest at the sample's
    /// σ) and left out of the loss ([`super::loss_views`]). Empty, or all zero: none, every token at σ.
    pub conditioned_tokens: Vec<usize>,
}

/// The audio stream's part of a joint batch.
pub struct Ltx2AudioInputs {
    /// Noisy audio latents, patchified: [b, frames, audio_in_channels] (ltx-core's `AudioPatchifier`: a latent
    /// frame's channels × mel bins).
    pub latents: Tensor,
    /// Frame bounds in seconds [b, 1, frames, 2] (see [`super::rope::audio_positions`]).
    pub positions: Tensor,
    /// The audio text context: the connector's audio output ([b, text_len, caption_channels] for LTX-2,
    /// [b, text_len, audio dim] for LTX-2.3).
    pub context: Tensor,
}

/// The embeddings' results: the first block's input, what the blocks share, and what the head needs.
pub struct Prepared {
    /// Video tokens [b, tokens, dim].
    pub xs: Tensor,
    pub blocks: BlockInputs,
    /// The embedded timestep [b, 1, dim] the head modulates with ([b, n, dim] with per-token timesteps, each
    /// token's row picked by [`BlockInputs::pick`]).
    pub embedded: Tensor,
    /// The leading clean tokens of each sample ([`Ltx2Inputs::conditioned_tokens`]; empty: none).
    pub conditioned_tokens: Vec<usize>,
    /// The audio head's embedded timestep [b, 1, audio dim] (joint passes).
    pub audio_embedded: Option<Tensor>,
}

/// The audio stream's embeddings and head, and the audio-video cross-attentions' AdaLNs.
pub struct Ltx2AudioModel {
    pub audio_patchify_proj: Linear,
    pub audio_adaln_single: AdaLayerNormSingle,
    pub audio_prompt_adaln_single: Option<AdaLayerNormSingle>,
    pub audio_caption_projection: Option<CaptionProjection>,
    /// `av_ca_video_scale_shift_adaln_single` (4 rows of the video width, video σ) and its audio twin.
    pub av_ca_video_scale_shift_adaln_single: AdaLayerNormSingle,
    pub av_ca_audio_scale_shift_adaln_single: AdaLayerNormSingle,
    /// `av_ca_a2v_gate_adaln_single` (1 row of the video width, audio σ) and `av_ca_v2a_gate_adaln_single` (1 row
    /// of the audio width, video σ).
    pub av_ca_a2v_gate_adaln_single: AdaLayerNormSingle,
    pub av_ca_v2a_gate_adaln_single: AdaLayerNormSingle,
    /// `audio_scale_shift_table` [2, audio dim] of the audio head.
    pub audio_scale_shift_table: Tensor,
    pub audio_proj_out: Linear,
}

impl Ltx2AudioModel {
    /// Reads the audio parts outside the blocks under `vb` (the model's root).
    pub fn load(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        let (dim, adim) = (cfg.inner_dim(), cfg.audio_inner_dim());
        let prompt = if cfg.cross_attention_adaln && cfg.use_prompt_adaln_single {
            Some(AdaLayerNormSingle::load(
                &vb.pp("audio_prompt_adaln_single"),
                adim,
                2,
            )?)
        } else {
            None
        };
        let caption = match (cfg.has_caption_projection(), cfg.caption_channels) {
            (true, Some(channels)) => Some(CaptionProjection::load(
                &vb.pp("audio_caption_projection"),
                channels,
                adim,
            )?),
            _ => None,
        };
        let adaln = |name: &str, width: usize, rows: usize| {
            AdaLayerNormSingle::load(&vb.pp(name), width, rows)
        };
        Ok(Self {
            audio_patchify_proj: Linear::load(
                &vb.pp("audio_patchify_proj"),
                cfg.audio_in_channels,
                adim,
            )?,
            audio_adaln_single: adaln("audio_adaln_single", adim, cfg.adaln_coefficient())?,
            audio_prompt_adaln_single: prompt,
            audio_caption_projection: caption,
            av_ca_video_scale_shift_adaln_single: adaln(
                "av_ca_video_scale_shift_adaln_single",
                dim,
                4,
            )?,
            av_ca_audio_scale_shift_adaln_single: adaln(
                "av_ca_audio_scale_shift_adaln_single",
                adim,
                4,
            )?,
            av_ca_a2v_gate_adaln_single: adaln("av_ca_a2v_gate_adaln_single", dim, 1)?,
            av_ca_v2a_gate_adaln_single: adaln("av_ca_v2a_gate_adaln_single", adim, 1)?,
            audio_scale_shift_table: vb.get((2, adim), "audio_scale_shift_table")?,
            audio_proj_out: Linear::load(&vb.pp("audio_proj_out"), adim, cfg.audio_out_channels)?,
        })
    }
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
    /// The audio stream outside the blocks (read for joint audio-video training only).
    pub audio: Option<Ltx2AudioModel>,
    streamer: Option<Arc<BlockStreamer>>,
    /// The blocks' AdaLN tables stacked, for each pass's rows at once.
    tables: BlockTables,
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
        Self::load_streamed_av(vb, cfg, streamed, offload, false)
    }

    /// Reads both streams, every block resident (joint audio-video training).
    pub fn load_av(vb: &Vb, cfg: &Ltx2Config) -> Result<Self> {
        Self::load_streamed_av(vb, cfg, &[], &OffloadOptions::default(), true)
    }

    /// [`Ltx2Transformer::load_streamed`] reading the audio stream and the audio-video cross-attentions too
    /// when `audio`.
    pub fn load_streamed_av(
        vb: &Vb,
        cfg: &Ltx2Config,
        streamed: &[usize],
        offload: &OffloadOptions,
        audio: bool,
    ) -> Result<Self> {
        cfg.validate()?;
        if audio {
            cfg.validate_audio()?;
        }
        let n = cfg.num_layers;
        let mut streamed = streamed.to_vec();
        streamed.sort_unstable();
        streamed.dedup();
        if let Some(&i) = streamed.iter().find(|&&i| i >= n) {
            candle_core::bail!(
                "LTX-2: streamed block {i} is out of range (the model has {n} blocks)"
            );
        }
        let block_at = |i: usize, vb: &Vb| {
            Ltx2Block::load_streams(&vb.pp("transformer_blocks").pp(i), cfg, audio)
        };
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
        for (i, block) in blocks.iter_mut() {
            block.index = Some(*i);
        }
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
            audio: if audio {
                Some(Ltx2AudioModel::load(vb, cfg)?)
            } else {
                None
            },
            streamer,
            tables: BlockTables::load(vb, cfg)?,
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

    /// The embeddings of `inputs`: patchified tokens, AdaLN rows, the projected text and the RoPE table; in a
    /// joint pass the audio stream's too and the audio-video cross-attentions' rows and tables, the block input
    /// both streams' tokens packed.
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
        let tokens = TokenTimesteps::new(&inputs.conditioned_tokens, &scaled, xs.dim(1)?)?;
        let (rows, embedded) = self
            .adaln_single
            .forward(tokens.timesteps(&scaled), dtype)?;
        let prompt_timestep = match &self.prompt_adaln_single {
            Some(p) => Some(p.forward(&scaled, dtype)?.0.unsqueeze(1)?),
            None => None,
        };
        let context = match &self.caption_projection {
            Some(p) => p.forward(&inputs.context)?,
            None => inputs.context.clone(),
        };
        let rope = RopeTable::new(&inputs.positions, &self.cfg, dtype, xs.device())?;
        let pick = tokens.pick(xs.device())?;
        let timestep = tokens.per_sample(&rows, b)?;
        // Per-token timesteps take each block's rows at every token, formed by the block.
        let rows = match pick {
            Some(_) => None,
            None => Some(PassRows::new(
                &self.tables,
                (&timestep, prompt_timestep.as_ref()),
                b,
                context.dtype(),
            )?),
        };
        let mut prepared = Prepared {
            xs,
            blocks: BlockInputs {
                timestep,
                pick,
                prompt_timestep,
                rope,
                context,
                context_lens: inputs.context_lens.clone(),
                audio: None,
                rows,
            },
            embedded: tokens.per_sample(&embedded, b)?,
            conditioned_tokens: inputs.conditioned_tokens.clone(),
            audio_embedded: None,
        };
        let Some(audio) = &inputs.audio else {
            return Ok(prepared);
        };
        self.prepare_audio(
            &mut prepared,
            (audio, &inputs.positions),
            (&scaled, &tokens),
        )?;
        Ok(prepared)
    }

    /// The audio stream's embeddings of a joint pass into `prepared`: its AdaLN rows, text, RoPE tables, the
    /// audio-video rows and tables, and the block input packed with the audio tokens.
    fn prepare_audio(
        &self,
        prepared: &mut Prepared,
        (audio, positions): (&Ltx2AudioInputs, &Tensor),
        (scaled, tokens): (&[f32], &TokenTimesteps),
    ) -> Result<()> {
        let dtype = audio.latents.dtype();
        let Some(model) = &self.audio else {
            candle_core::bail!(
                "LTX-2: a batch with audio latents for a transformer read without its audio stream"
            );
        };
        let ax = model.audio_patchify_proj.forward(&audio.latents)?;
        let (arows, aembedded) = model.audio_adaln_single.forward(scaled, dtype)?;
        let aprompt = match &model.audio_prompt_adaln_single {
            Some(p) => Some(p.forward(scaled, dtype)?.0.unsqueeze(1)?),
            None => None,
        };
        let acontext = match &model.audio_caption_projection {
            Some(p) => p.forward(&audio.context)?,
            None => audio.context.clone(),
        };
        let device = ax.device().clone();
        let cfg = &self.cfg;
        // The gates embed the other stream's σ times `av_ca_timestep_scale_multiplier` (ltx-core's factor
        // `av / timestep_scale` times the scaled σ); both streams share σ here.
        let factor = (cfg.av_ca_timestep_scale_multiplier / cfg.timestep_scale_multiplier) as f32;
        let gate_t: Vec<f32> = scaled.iter().map(|t| t * factor).collect();
        let cross = |adaln: &AdaLayerNormSingle, t: &[f32]| -> Result<Tensor> {
            adaln.forward(t, dtype)?.0.unsqueeze(1)
        };
        let ai = AudioInputs {
            timestep: arows.unsqueeze(1)?,
            prompt_timestep: aprompt,
            rope: RopeTable::audio(&audio.positions, cfg, dtype, &device)?,
            context: acontext,
            video_cross_rope: RopeTable::cross(
                positions,
                cfg,
                cfg.num_attention_heads,
                dtype,
                &device,
            )?,
            audio_cross_rope: RopeTable::cross(
                &audio.positions,
                cfg,
                cfg.audio_num_attention_heads,
                dtype,
                &device,
            )?,
            // The video side's scale and shift embed the video's timesteps (per token), the gates each σ.
            video_cross: tokens.per_sample(
                &model
                    .av_ca_video_scale_shift_adaln_single
                    .forward(tokens.timesteps(scaled), dtype)?
                    .0,
                scaled.len(),
            )?,
            video_gate: cross(&model.av_ca_a2v_gate_adaln_single, &gate_t)?,
            audio_cross: cross(&model.av_ca_audio_scale_shift_adaln_single, scaled)?,
            audio_gate: cross(&model.av_ca_v2a_gate_adaln_single, &gate_t)?,
            video_shape: (prepared.xs.dim(1)?, prepared.xs.dim(2)?),
            audio_shape: (ax.dim(1)?, ax.dim(2)?),
        };
        prepared.xs = AudioInputs::pack(&prepared.xs, &ax)?;
        prepared.blocks.audio = Some(ai);
        prepared.audio_embedded = Some(aembedded.unsqueeze(1)?);
        Ok(())
    }

    /// The head on the last block's output `xs` [b, tokens, dim] (or a joint pass's packed streams): the video
    /// velocity [b, tokens, out_channels].
    pub fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Tensor> {
        Ok(self.finish_streams(xs, prepared)?.0)
    }

    /// Both heads on the last block's output: the video velocity and, in a joint pass, the audio velocity
    /// [b, audio frames, audio_out_channels].
    pub fn finish_streams(
        &self,
        xs: &Tensor,
        prepared: &Prepared,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (Some(ai), Some(aembedded), Some(model)) = (
            &prepared.blocks.audio,
            &prepared.audio_embedded,
            &self.audio,
        ) else {
            let video = head(
                xs,
                &self.scale_shift_table,
                &prepared.token_embedded()?,
                &self.proj_out,
                self.cfg.norm_eps,
            )?;
            return Ok((video, None));
        };
        let (vx, ax) = unpack_joint(xs, ai.video_shape, ai.audio_shape)?;
        let eps = self.cfg.norm_eps;
        let video = head(
            &vx,
            &self.scale_shift_table,
            &prepared.token_embedded()?,
            &self.proj_out,
            eps,
        )?;
        let audio = head(
            &ax,
            &model.audio_scale_shift_table,
            aembedded,
            &model.audio_proj_out,
            eps,
        )?;
        Ok((video, Some(audio)))
    }

    /// The whole forward (differentiable): the velocity [b, tokens, out_channels].
    pub fn forward(&self, inputs: &Ltx2Inputs) -> Result<Tensor> {
        Ok(self.forward_streams(inputs)?.0)
    }

    /// The whole forward of both streams: the video velocity and, with audio inputs, the audio velocity
    /// [b, audio frames, audio_out_channels].
    pub fn forward_streams(&self, inputs: &Ltx2Inputs) -> Result<(Tensor, Option<Tensor>)> {
        let prepared = self.prepare(inputs)?;
        let mut xs = prepared.xs.clone();
        let order: Vec<usize> = (0..self.transformer_blocks.len()).collect();
        self.begin_blocks(&order, false)?;
        for i in order {
            xs = self.block(i)?.forward(&xs, &prepared.blocks)?;
        }
        self.finish_streams(&xs, &prepared)
    }

    /// Whether the model was read with its audio stream.
    pub fn has_audio(&self) -> bool {
        self.audio.is_some()
    }

    /// The dtype the model's weights were read in.
    pub fn dtype(&self) -> DType {
        self.scale_shift_table.dtype()
    }
}

impl Prepared {
    /// The video head's embedded timestep: [b, 1, dim], or per token [b, tokens, dim] with per-token timesteps.
    pub fn token_embedded(&self) -> Result<Tensor> {
        self.blocks.per_token(&self.embedded)
    }
}

/// The video timesteps of a pass: one per sample, or with first-frame conditioning two per sample (its σ and 0,
/// the clean tokens'), each token picking its own.
struct TokenTimesteps {
    /// Scaled timesteps, two per sample (`[t₀, 0, t₁, 0, …]`), when some sample is conditioned.
    pairs: Option<Vec<f32>>,
    /// The leading clean tokens of each sample, and the tokens per sample.
    conditioned: Vec<usize>,
    tokens: usize,
}

impl TokenTimesteps {
    /// The timesteps of samples at `scaled` (one each) whose leading `conditioned` tokens of `tokens` are clean.
    fn new(conditioned: &[usize], scaled: &[f32], tokens: usize) -> Result<Self> {
        let any = conditioned.iter().any(|&n| n > 0);
        if any && conditioned.len() != scaled.len() {
            candle_core::bail!(
                "LTX-2: first-frame conditioning for {} samples of a batch of {}",
                conditioned.len(),
                scaled.len()
            );
        }
        if let Some(&n) = conditioned.iter().find(|&&n| n > tokens) {
            candle_core::bail!("LTX-2: {n} conditioning tokens of a sample of {tokens}");
        }
        let pairs = any.then(|| scaled.iter().flat_map(|&t| [t, 0.0]).collect());
        Ok(Self {
            pairs,
            conditioned: conditioned.to_vec(),
            tokens,
        })
    }

    /// The timesteps to embed: `scaled` (one per sample) or the pairs.
    fn timesteps<'a>(&'a self, scaled: &'a [f32]) -> &'a [f32] {
        self.pairs.as_deref().unwrap_or(scaled)
    }

    /// Embedded rows [b · n, width] as [b, n, width].
    fn per_sample(&self, rows: &Tensor, b: usize) -> Result<Tensor> {
        let (count, width) = rows.dims2()?;
        rows.reshape((b, count / b.max(1), width))
    }

    /// Each video token's row (u32 [b · tokens]): `2i` (σ) or `2i + 1` (0) for sample i; `None` without
    /// conditioning.
    fn pick(&self, device: &Device) -> Result<Option<Tensor>> {
        if self.pairs.is_none() {
            return Ok(None);
        }
        let mut index = Vec::with_capacity(self.conditioned.len() * self.tokens);
        for (i, &n) in self.conditioned.iter().enumerate() {
            let row = 2 * i as u32;
            index.extend((0..self.tokens).map(|t| if t < n { row + 1 } else { row }));
        }
        let len = index.len();
        Tensor::from_vec(index, len, device).map(Some)
    }
}

/// A head: `proj_out` of the parameter-free LayerNorm of `xs` modulated by `table` [2, dim] plus `embedded`
/// [b, 1, dim] or [b, tokens, dim] (shift, scale).
fn head(
    xs: &Tensor,
    table: &Tensor,
    embedded: &Tensor,
    proj_out: &Linear,
    eps: f64,
) -> Result<Tensor> {
    let dtype = xs.dtype();
    let table = table.to_dtype(dtype)?;
    let embedded = embedded.to_dtype(dtype)?;
    let shift = embedded.broadcast_add(&table.get(0)?)?;
    let scale = embedded.broadcast_add(&table.get(1)?)?;
    let normed = layer_norm(xs, None, None, eps)?;
    let h = normed
        .broadcast_mul(&(scale + 1.0)?)?
        .broadcast_add(&shift)?;
    proj_out.forward(&h)
}

#[cfg(test)]
mod tests;
