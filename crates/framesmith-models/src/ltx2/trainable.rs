//! LTX-2 / LTX-2.3 as the engine trains it: [`TrainableModel`] for [`Ltx2Transformer`] and [`TrainableBlock`] for
//! [`Ltx2Block`] (the video stream of each block, with its hand-written backward), the embeddings' results as a
//! [`PreparedBatch`], and LoRA targets named as ltx-core names the modules (`transformer_blocks.0.attn1.to_q`).
//! A block keeps its video text cross-attention's keys and values for the recompute under every checkpointing
//! that recomputes, and with selective checkpointing its video self-attention too ([`Ltx2Kept`]; no gated branch
//! output is kept). A joint audio-video batch runs the joint blocks on both streams packed into one block
//! input, and its loss compares [`joint_loss_view`]s.

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use super::block::grad::{Ltx2Kept, Ltx2Tape};
use super::block::{AudioInputs, BlockInputs, Ltx2Block, PassRows};
use super::transformer::{Ltx2Inputs, Ltx2Transformer, Prepared};
use crate::trainable::{BlockGrads, PreparedBatch, TrainableBlock, TrainableModel};
use framesmith_nn::linear::Linear;
use framesmith_nn::lora::LoraFamily;

impl TrainableBlock for Ltx2Block {
    type Shared = BlockInputs;
    type Kept = Ltx2Kept;
    type Tape = Ltx2Tape;

    fn forward(&self, xs: &Tensor, shared: &BlockInputs) -> Result<Tensor> {
        Ltx2Block::forward(self, xs, shared)
    }

    /// The forward keeping the text keys and values and the self-attention; `keep_projection` is ignored (no
    /// branch output is kept).
    fn forward_untracked(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        _keep_projection: bool,
    ) -> Result<(Tensor, Ltx2Kept)> {
        let (out, tape) = Ltx2Block::forward_with_tape(self, xs, shared)?;
        Ok((out, tape.kept(true)))
    }

    /// The forward keeping the text keys and values.
    fn forward_checkpointed(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
    ) -> Result<(Tensor, Option<Ltx2Kept>)> {
        let (out, tape) = Ltx2Block::forward_with_tape(self, xs, shared)?;
        Ok((out, Some(tape.kept(false))))
    }

    fn forward_with_tape(&self, xs: &Tensor, shared: &BlockInputs) -> Result<(Tensor, Ltx2Tape)> {
        Ltx2Block::forward_with_tape(self, xs, shared)
    }

    fn recompute(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&Ltx2Kept>,
    ) -> Result<Ltx2Tape> {
        Ltx2Block::recompute(self, xs, shared, kept)
    }

    fn backward(&self, tape: Ltx2Tape, grad: &Tensor) -> Result<BlockGrads> {
        Ltx2Block::backward(self, tape, grad)
    }
}

impl PreparedBatch for Prepared {
    type Shared = BlockInputs;

    fn block_input(&self) -> &Tensor {
        &self.xs
    }

    fn shared(&self) -> &BlockInputs {
        &self.blocks
    }

    fn detached(&self) -> Self {
        let b = &self.blocks;
        Prepared {
            xs: self.xs.detach(),
            blocks: BlockInputs {
                timestep: b.timestep.detach(),
                pick: b.pick.clone(),
                prompt_timestep: b.prompt_timestep.as_ref().map(Tensor::detach),
                rope: b.rope.detach(),
                context: b.context.detach(),
                context_lens: b.context_lens.clone(),
                audio: b.audio.as_ref().map(AudioInputs::detach),
                rows: b.rows.as_ref().map(PassRows::detach),
            },
            embedded: self.embedded.detach(),
            conditioned_tokens: self.conditioned_tokens.clone(),
            audio_embedded: self.audio_embedded.as_ref().map(Tensor::detach),
        }
    }
}

impl TrainableModel for Ltx2Transformer {
    type Inputs = Ltx2Inputs;
    type Prepared = Prepared;
    type Block = Ltx2Block;
    const LORA_FAMILY: LoraFamily = LoraFamily::Ltx2;

    fn lora_linears(&mut self) -> Vec<(String, &mut Linear)> {
        Ltx2Transformer::linears_mut(self)
    }

    fn prepare(&self, inputs: &Ltx2Inputs) -> Result<Prepared> {
        Ltx2Transformer::prepare(self, inputs)
    }

    fn num_blocks(&self) -> usize {
        self.transformer_blocks.len()
    }

    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        Ltx2Transformer::begin_blocks(self, order, cyclic)
    }

    fn block(&self, i: usize) -> Result<Cow<'_, Ltx2Block>> {
        Ltx2Transformer::block(self, i)
    }

    /// One velocity [tokens, out_channels] per sample as [`loss_views`] lays it out (the conditioning tokens
    /// left out; in a joint pass both streams' velocities joined).
    fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        let (video, audio) = Ltx2Transformer::finish_streams(self, xs, prepared)?;
        let b = video.dim(0)?;
        let video = (0..b).map(|i| video.get(i)).collect::<Result<Vec<_>>>()?;
        let audio = match &audio {
            Some(a) => Some((0..b).map(|i| a.get(i)).collect::<Result<Vec<_>>>()?),
            None => None,
        };
        loss_views(video, audio, &prepared.conditioned_tokens)
    }

    fn device(&self) -> &Device {
        self.scale_shift_table.device()
    }

    fn latents<'a>(&self, inputs: &'a Ltx2Inputs) -> &'a [Tensor] {
        std::slice::from_ref(&inputs.latents)
    }
}

/// The per-sample tensors the step's loss compares (model outputs or targets alike), from each sample's video
/// [tokens, channels] and, in a joint pass, audio [frames, channels]: the video without its leading
/// `conditioned` tokens (first-frame conditioning; empty: none), joined with the audio by [`joint_loss_view`].
/// The official trainer's loss is the mean over the batch of each sample's mean over its kept elements
/// (`compute_loss`'s masked mean, then `loss.mean()`); the step's loss is one mean over every kept element, so
/// when the samples keep different counts, sample i is scaled by √(Σⱼ nⱼ / (b · nᵢ)), which makes the two equal.
pub fn loss_views(
    video: Vec<Tensor>,
    audio: Option<Vec<Tensor>>,
    conditioned: &[usize],
) -> Result<Vec<Tensor>> {
    let mut views = Vec::with_capacity(video.len());
    for (i, v) in video.into_iter().enumerate() {
        let skip = conditioned.get(i).copied().unwrap_or(0);
        let v = if skip > 0 {
            let tokens = v.dim(0)?;
            if skip >= tokens {
                candle_core::bail!(
                    "LTX-2: {skip} conditioning tokens leave nothing of {tokens} to train on"
                );
            }
            v.narrow(0, skip, tokens - skip)?
        } else {
            v
        };
        views.push(match &audio {
            Some(a) => joint_loss_view(&v, &a[i])?,
            None => v,
        });
    }
    let counts: Vec<usize> = views.iter().map(Tensor::elem_count).collect();
    if counts.windows(2).all(|w| w[0] == w[1]) {
        return Ok(views);
    }
    let total = counts.iter().sum::<usize>() as f64;
    let b = views.len() as f64;
    views
        .into_iter()
        .zip(counts)
        .map(|(v, n)| v * (total / (b * n as f64)).sqrt())
        .collect()
}

/// One sample's video velocity (or target) [tokens, channels] and audio one [frames, channels] as the step's loss
/// compares them in a joint pass: both flattened and joined, [video elements + audio elements, 1], each scaled by
/// √(all elements / its elements). The mean squared error over the join is then the video stream's mean plus the
/// audio stream's, the official trainer's joint loss (`video_loss + audio_loss`, each a mean over its elements).
pub fn joint_loss_view(video: &Tensor, audio: &Tensor) -> Result<Tensor> {
    let (nv, na) = (video.elem_count(), audio.elem_count());
    let all = (nv + na) as f64;
    let v = (video.flatten_all()? * (all / nv as f64).sqrt())?;
    let a = (audio.flatten_all()? * (all / na as f64).sqrt())?;
    Tensor::cat(&[v, a], 0)?.unsqueeze(1)
}

#[cfg(test)]
mod tests;
