//! Wan as the engine trains it: [`TrainableModel`] for [`WanModel`], [`TrainableBlock`] for its [`Block`].

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use super::block::grad::{BlockTape, KeptBlock};
use super::block::{Block, BlockInputs};
use super::rope::Rope;
use super::transformer::{Prepared, WanInputs, WanModel};
use crate::trainable::{BlockGrads, PreparedBatch, TrainableBlock, TrainableModel};

impl TrainableBlock for Block {
    type Shared = BlockInputs;
    type Kept = KeptBlock;
    type Tape = BlockTape;

    fn forward(&self, xs: &Tensor, shared: &BlockInputs) -> Result<Tensor> {
        Block::forward(self, xs, shared)
    }

    fn forward_untracked(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        keep_projection: bool,
    ) -> Result<(Tensor, KeptBlock)> {
        Block::forward_untracked(self, xs, shared, keep_projection)
    }

    fn forward_with_tape(&self, xs: &Tensor, shared: &BlockInputs) -> Result<(Tensor, BlockTape)> {
        Block::forward_with_tape(self, xs, shared)
    }

    fn recompute(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<BlockTape> {
        Block::recompute(self, xs, shared, kept)
    }

    fn backward(&self, tape: BlockTape, grad: &Tensor) -> Result<BlockGrads> {
        Block::backward(self, tape, grad)
    }
}

impl PreparedBatch for Prepared {
    type Shared = BlockInputs;

    fn block_input(&self) -> &Tensor {
        &self.x
    }

    fn shared(&self) -> &BlockInputs {
        &self.blocks
    }

    fn detached(&self) -> Self {
        let b = &self.blocks;
        Prepared {
            x: self.x.detach(),
            e: self.e.detach(),
            blocks: BlockInputs {
                e0: b.e0.detach(),
                seq_lens: b.seq_lens.clone(),
                rope: Rope {
                    cos: b.rope.cos.detach(),
                    sin: b.rope.sin.detach(),
                },
                context: b.context.detach(),
                context_img: b.context_img.as_ref().map(|t| t.detach()),
            },
            grid_sizes: self.grid_sizes.clone(),
        }
    }
}

impl TrainableModel for WanModel {
    type Inputs = WanInputs;
    type Prepared = Prepared;
    type Block = Block;
    const LORA_FAMILY: framesmith_nn::lora::LoraFamily = framesmith_nn::lora::LoraFamily::Wan;

    fn lora_linears(&mut self) -> Vec<(String, &mut framesmith_nn::linear::Linear)> {
        WanModel::linears_mut(self)
    }

    fn prepare(&self, inputs: &WanInputs) -> Result<Prepared> {
        WanModel::prepare(self, inputs)
    }

    fn num_blocks(&self) -> usize {
        WanModel::num_blocks(self)
    }

    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        WanModel::begin_blocks(self, order, cyclic)
    }

    fn block(&self, i: usize) -> Result<Cow<'_, Block>> {
        WanModel::block(self, i)
    }

    fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        WanModel::finish(self, xs, prepared)
    }

    fn device(&self) -> &Device {
        WanModel::device(self)
    }

    fn latents<'a>(&self, inputs: &'a WanInputs) -> &'a [Tensor] {
        &inputs.latents
    }
}
