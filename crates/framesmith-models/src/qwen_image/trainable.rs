//! Qwen-Image as the engine trains it: [`TrainableModel`] for [`QwenImageTransformer`], whose units are the
//! shared [`DualStreamBlock`]s on the joint [text; image] sequence (`crate::mmdit`); streamed blocks arrive
//! through their GPU slots ([`QwenImageTransformer::block`]).

use std::borrow::Cow;

use candle_core::{Device, Result, Tensor};

use super::transformer::{Prepared, QwenImageInputs, QwenImageTransformer};
use crate::mmdit::DualStreamBlock;
use crate::trainable::TrainableModel;
use framesmith_nn::linear::Linear;
use framesmith_nn::lora::LoraFamily;

impl TrainableModel for QwenImageTransformer {
    type Inputs = QwenImageInputs;
    type Prepared = Prepared;
    type Block = DualStreamBlock;
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

    fn block(&self, i: usize) -> Result<Cow<'_, DualStreamBlock>> {
        QwenImageTransformer::block(self, i)
    }

    /// The prediction for the image being denoised only: Qwen-Image-Edit's conditioning images are input, never
    /// target (the official pipeline keeps `noise_pred[:, :latents.size(1)]`).
    fn finish(&self, xs: &Tensor, prepared: &Prepared) -> Result<Vec<Tensor>> {
        let out = QwenImageTransformer::finish(self, xs, prepared)?.narrow(1, 0, prepared.head)?;
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
