//! What the engine's checkpointed training step needs from a model, whatever its family: the work before the
//! blocks (embeddings), the blocks as units (forward with and without a tape, recompute, hand-written backward),
//! and the work after them (the head). Wan implements it; a second family adds an implementation, not a branch
//! in the step.

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use framesmith_nn::linear::Linear;
pub use framesmith_nn::linear::ParamGrad;
use framesmith_nn::lora::{attach_family_loras, LoraError, LoraFamily, LoraSet, LoraSpec};

/// What a block's backward returns.
pub struct BlockGrads {
    /// Gradient of the block input, in its dtype (the residual dtype).
    pub input: Tensor,
    /// Gradients of the block's trainable tensors (two LoRA factors per adapted linear).
    pub params: Vec<ParamGrad>,
}

/// One block of a model, as the checkpointed step drives it.
pub trait TrainableBlock {
    /// What every block of one forward pass shares (time modulation, text context, RoPE tables, …).
    type Shared;
    /// What a forward without a graph can keep for the recompute (e.g. the self-attention output and LSE); it
    /// waits where the saved block inputs do.
    type Kept: framesmith_nn::offload::Stashable;
    /// Every intermediate the hand-written backward needs.
    type Tape;

    /// The forward with gradient tracking (candle's autograd).
    fn forward(&self, xs: &Tensor, shared: &Self::Shared) -> Result<Tensor>;
    /// The forward without an autograd graph, with what the recompute may reuse; `keep_projection` asks for
    /// the self-attention's projected output too, where the model has one to keep (Wan's `self_attn.o`; a model
    /// without one ignores it).
    fn forward_untracked(
        &self,
        xs: &Tensor,
        shared: &Self::Shared,
        keep_projection: bool,
    ) -> Result<(Tensor, Self::Kept)>;
    /// The forward keeping its whole tape (no recompute needed before the backward).
    fn forward_with_tape(&self, xs: &Tensor, shared: &Self::Shared)
        -> Result<(Tensor, Self::Tape)>;
    /// The block run again from its saved input, recording the tape; `kept` skips what it holds.
    fn recompute(
        &self,
        xs: &Tensor,
        shared: &Self::Shared,
        kept: Option<&Self::Kept>,
    ) -> Result<Self::Tape>;
    /// The hand-written backward of the output gradient `grad` through a recorded tape.
    fn backward(&self, tape: Self::Tape, grad: &Tensor) -> Result<BlockGrads>;
}

/// The embeddings' results for one batch: the first block's input, what the blocks share, and what the head
/// needs after them.
pub trait PreparedBatch: Sized {
    /// What every block shares.
    type Shared;
    /// The first block's input [b, tokens, dim] in the residual dtype.
    fn block_input(&self) -> &Tensor;
    /// What every block shares, as the blocks take it.
    fn shared(&self) -> &Self::Shared;
    /// A copy cut from the autograd graph of the embeddings (the checkpointed step runs blocks and head on
    /// detached inputs and back-propagates into the embeddings separately).
    fn detached(&self) -> Self;
}

/// A model trained block by block: embeddings, blocks (resident or streamed), head.
pub trait TrainableModel {
    /// One batch's inputs (noisy latents, timesteps, conditioning).
    type Inputs;
    /// The embeddings' results.
    type Prepared: PreparedBatch<Shared = <Self::Block as TrainableBlock>::Shared>;
    /// One block.
    type Block: TrainableBlock + Clone;

    /// Runs the embeddings.
    fn prepare(&self, inputs: &Self::Inputs) -> Result<Self::Prepared>;
    /// The number of blocks.
    fn num_blocks(&self) -> usize;
    /// Tells block streaming the order the blocks will be asked for in (`cyclic`: the order repeats).
    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()>;
    /// Block `i`, with its frozen tensors on the device (a streamed block's arrive through its GPU slot).
    fn block(&self, i: usize) -> Result<Cow<'_, Self::Block>>;
    /// Runs the head on the last block's output: one prediction per sample.
    fn finish(&self, xs: &Tensor, prepared: &Self::Prepared) -> Result<Vec<Tensor>>;
    /// The device the model computes on.
    fn device(&self) -> &Device;
    /// The inputs' latents, whose gradients a caller may ask for.
    fn latents<'a>(&self, inputs: &'a Self::Inputs) -> &'a [Tensor];
    /// How the family names its LoRA targets (block lists, default excludes, file keys).
    const LORA_FAMILY: LoraFamily;
    /// Every linear a LoRA may adapt, by module path (`blocks.0.self_attn.q`, `double_blocks.0.img_attn.qkv`).
    fn lora_linears(&mut self) -> Vec<(String, &mut Linear)>;
}

/// Attaches fresh LoRAs to the linears of `model` that `spec` targets, named as its family names them.
pub fn attach_model_loras<M: TrainableModel>(
    model: &mut M,
    spec: &LoraSpec,
) -> std::result::Result<LoraSet, LoraError> {
    attach_family_loras(model.lora_linears(), spec, M::LORA_FAMILY)
}
