//! HunyuanVideo 1.5 as the engine trains it: [`TrainableModel`] for [`HunyuanVideo15Transformer`], whose blocks
//! are the dual-stream blocks of `crate::mmdit` (their [`crate::trainable::TrainableBlock`] impl, hand-written
//! backward, streaming and `mmdit::Prepared` serve both), and LoRA targets named as the official checkpoint and
//! musubi-tuner name them (`double_blocks.0.img_attn_q`).

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use super::transformer::{HunyuanVideo15Inputs, HunyuanVideo15Transformer, Prepared};
use crate::mmdit::DualStreamBlock;
use crate::trainable::TrainableModel;
use framesmith_nn::linear::Linear;
use framesmith_nn::lora::LoraFamily;

impl TrainableModel for HunyuanVideo15Transformer {
    type Inputs = HunyuanVideo15Inputs;
    type Prepared = Prepared;
    type Block = DualStreamBlock;
    const LORA_FAMILY: LoraFamily = LoraFamily::HunyuanVideo15;

    fn lora_linears(&mut self) -> Vec<(String, &mut Linear)> {
        HunyuanVideo15Transformer::linears_mut(self)
    }

    fn prepare(&self, inputs: &HunyuanVideo15Inputs) -> Result<Prepared> {
        HunyuanVideo15Transformer::prepare(self, inputs)
    }

    fn num_blocks(&self) -> usize {
        self.double_blocks.len()
    }

    fn begin_blocks(&self, order: &[usize], cyclic: bool) -> Result<()> {
        HunyuanVideo15Transformer::begin_blocks(self, order, cyclic)
    }

    fn block(&self, i: usize) -> Result<Cow<'_, DualStreamBlock>> {
        HunyuanVideo15Transformer::block(self, i)
    }

    /// One prediction [out_channels, f, h, w] per sample.
    fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        let out = HunyuanVideo15Transformer::finish(self, xs, prepared)?;
        (0..out.dim(0)?).map(|i| out.get(i)).collect()
    }

    fn device(&self) -> &Device {
        self.cond_type_embedding.device()
    }

    fn latents<'a>(&self, inputs: &'a HunyuanVideo15Inputs) -> &'a [Tensor] {
        std::slice::from_ref(&inputs.latents)
    }
}

#[cfg(test)]
mod tests;
