//! Qwen-Image as the engine trains it: [`TrainableModel`] for [`QwenImageTransformer`] and [`TrainableBlock`] for
//! [`QwenImageBlock`] — the dual-stream blocks as units on the joint [text; image] sequence, each with a
//! hand-written backward. With selective checkpointing a block keeps its attention (and, optionally, its gated
//! branches' outputs) for the recompute ([`KeptBlock`]); streamed blocks arrive through their GPU slots
//! ([`QwenImageTransformer::block`]).

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use super::block::grad::QwenImageTape;
use super::block::{BlockInputs, QwenImageBlock};
use super::rope::{Rope, RopeTable};
use super::transformer::{Prepared, QwenImageInputs, QwenImageTransformer};
use crate::trainable::{BlockGrads, PreparedBatch, TrainableBlock, TrainableModel};
use framesmith_nn::attention::KeptBlock;
use framesmith_nn::linear::Linear;
use framesmith_nn::lora::LoraFamily;

impl QwenImageTape {
    /// What a recompute may reuse: the attention output and LSE, and with `projections` the outputs of the
    /// products that feed the gated residuals ([`QwenImageTape::projections`]).
    pub fn kept(&self, projections: bool) -> KeptBlock {
        let outputs = if projections {
            self.projections().iter().map(|&t| t.clone()).collect()
        } else {
            Vec::new()
        };
        KeptBlock::new(self.attention().kept(), outputs)
    }
}

impl QwenImageBlock {
    /// The forward without a graph keeping its tape; `kept`: this block's values from an earlier pass on the same
    /// input, whose attention (and kept products) are then not run again.
    fn forward_keeping(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<(Tensor, QwenImageTape)> {
        let attention = kept.map(KeptBlock::attention);
        let kept_out = match kept.map_or(&[][..], KeptBlock::outputs) {
            [] => None,
            [a, b, c, d] => Some([a, b, c, d]),
            other => candle_core::bail!(
                "a Qwen-Image block keeps 4 branch outputs, not {}",
                other.len()
            ),
        };
        QwenImageBlock::forward_with_tape(self, xs, shared, attention, kept_out)
    }
}

impl TrainableBlock for QwenImageBlock {
    type Shared = BlockInputs;
    type Kept = KeptBlock;
    type Tape = QwenImageTape;

    fn forward(&self, xs: &Tensor, shared: &BlockInputs) -> Result<Tensor> {
        QwenImageBlock::forward(self, xs, shared)
    }

    fn forward_untracked(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        keep_projection: bool,
    ) -> Result<(Tensor, KeptBlock)> {
        let (out, tape) = self.forward_keeping(xs, shared, None)?;
        Ok((out, tape.kept(keep_projection)))
    }

    fn forward_with_tape(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
    ) -> Result<(Tensor, QwenImageTape)> {
        self.forward_keeping(xs, shared, None)
    }

    fn recompute(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<QwenImageTape> {
        Ok(self.forward_keeping(xs, shared, kept)?.1)
    }

    fn backward(&self, tape: QwenImageTape, grad: &Tensor) -> Result<BlockGrads> {
        QwenImageBlock::backward(self, tape, grad)
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
        let table = |t: &RopeTable| RopeTable {
            cos: t.cos.detach(),
            sin: t.sin.detach(),
        };
        Prepared {
            xs: self.xs.detach(),
            blocks: BlockInputs {
                temb: b.temb.detach(),
                rope: Rope {
                    img: table(&b.rope.img),
                    txt: table(&b.rope.txt),
                },
                txt_len: b.txt_len,
                txt_lens: b.txt_lens.clone(),
            },
        }
    }
}

impl TrainableModel for QwenImageTransformer {
    type Inputs = QwenImageInputs;
    type Prepared = Prepared;
    type Block = QwenImageBlock;
    const LORA_FAMILY: LoraFamily = LoraFamily::QwenImage;

    fn lora_linears(&mut self) -> Vec<(String, &mut Linear)> {
        QwenImageTransformer::linears_mut(self)
    }

    fn prepare(&self, inputs: &QwenImageInputs) -> Result<Prepared> {
        QwenImageTransformer::prepare(self, inputs)
    }

    fn num_blocks(&self) -> usize {
        self.transformer_blocks.len()
    }

    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        QwenImageTransformer::begin_blocks(self, order, cyclic)
    }

    fn block(&self, i: usize) -> Result<Cow<'_, QwenImageBlock>> {
        QwenImageTransformer::block(self, i)
    }

    fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        let out = QwenImageTransformer::finish(self, xs, prepared)?;
        (0..out.dim(0)?).map(|i| out.get(i)).collect()
    }

    fn device(&self) -> &Device {
        self.img_in.base().device()
    }

    fn latents<'a>(&self, inputs: &'a QwenImageInputs) -> &'a [Tensor] {
        std::slice::from_ref(&inputs.img)
    }
}

#[cfg(test)]
mod tests;
