//! Block streaming of dual-stream blocks (DESIGN.md §4.4): the frozen tensors of a block in one fixed
//! order, so the streamer can pack a block into host RAM and point its shell at a GPU slot. Every block has the
//! same layout, so one streamer holds them all.

use candle_core::{Result, Tensor};

use super::attention::{JointAttention, StreamQkv};
use super::block::{DualStreamBlock, FeedForward};
use framesmith_nn::offload::{frozen_fields, with_frozen_fields, Streamable};

impl StreamQkv {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.q.frozen_tensors_mut();
        out.extend(self.k.frozen_tensors_mut());
        out.extend(self.v.frozen_tensors_mut());
        out.extend([&mut self.norm_q, &mut self.norm_k]);
        out
    }
}

impl JointAttention {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.img.frozen_tensors_mut();
        out.extend(self.txt.frozen_tensors_mut());
        out.extend(self.to_out.frozen_tensors_mut());
        out.extend(self.to_add_out.frozen_tensors_mut());
        out
    }
}

impl FeedForward {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.proj_in.frozen_tensors_mut();
        out.extend(self.proj_out.frozen_tensors_mut());
        out
    }
}

impl DualStreamBlock {
    /// Every frozen tensor (linear bases, FP8 scales and biases, q/k norm weights), in a fixed order.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.img_mod.lin.frozen_tensors_mut();
        out.extend(self.txt_mod.lin.frozen_tensors_mut());
        out.extend(self.attn.frozen_tensors_mut());
        out.extend(self.img_mlp.frozen_tensors_mut());
        out.extend(self.txt_mlp.frozen_tensors_mut());
        out
    }
}

/// What block streaming packs and swaps: every frozen tensor, in [`DualStreamBlock::frozen_tensors_mut`]'s order.
impl Streamable for DualStreamBlock {
    fn frozen_tensors(&self) -> Vec<Tensor> {
        frozen_fields(self, DualStreamBlock::frozen_tensors_mut)
    }

    fn with_frozen(&self, tensors: &[Tensor]) -> Result<Self> {
        with_frozen_fields(
            self,
            DualStreamBlock::frozen_tensors_mut,
            tensors,
            "dual-stream block",
        )
    }
}
