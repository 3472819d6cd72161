//! Block streaming of the FLUX.1 DiT (DESIGN.md §4.4): the frozen tensors of each block kind in one fixed order,
//! so the streamer can pack a block into host RAM and point its shell at a GPU slot. The two kinds have different
//! layouts (a double-stream block holds about 2.4 times a single-stream block's weights), so each kind that
//! streams gets a streamer (and GPU slots) of its own.

use candle_core::{Result, Tensor};

use super::attention::{QkNorm, SelfAttention};
use super::block::FluxBlock;
use super::double_block::{DoubleStreamBlock, Mlp};
use super::single_block::SingleStreamBlock;
use framesmith_nn::offload::{frozen_fields, with_frozen_fields, Streamable};

impl QkNorm {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.query_norm, &mut self.key_norm]
    }
}

impl SelfAttention {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.qkv.frozen_tensors_mut();
        out.extend(self.norm.frozen_tensors_mut());
        out.extend(self.proj.frozen_tensors_mut());
        out
    }
}

impl Mlp {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.fc0.frozen_tensors_mut();
        out.extend(self.fc2.frozen_tensors_mut());
        out
    }
}

impl DoubleStreamBlock {
    /// Every frozen tensor (linear bases, FP8 scales and biases, q/k norm scales), in a fixed order.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.img_mod.lin.frozen_tensors_mut();
        out.extend(self.img_attn.frozen_tensors_mut());
        out.extend(self.img_mlp.frozen_tensors_mut());
        out.extend(self.txt_mod.lin.frozen_tensors_mut());
        out.extend(self.txt_attn.frozen_tensors_mut());
        out.extend(self.txt_mlp.frozen_tensors_mut());
        out
    }
}

impl SingleStreamBlock {
    /// Every frozen tensor (linear bases, FP8 scales and biases, q/k norm scales), in a fixed order.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.linear1.frozen_tensors_mut();
        out.extend(self.linear2.frozen_tensors_mut());
        out.extend(self.norm.frozen_tensors_mut());
        out.extend(self.modulation.lin.frozen_tensors_mut());
        out
    }
}

impl FluxBlock {
    /// Every frozen tensor of the block, in its kind's fixed order.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Self::Double(b) => b.frozen_tensors_mut(),
            Self::Single(b) => b.frozen_tensors_mut(),
        }
    }

    /// Whether this is a double-stream block.
    pub fn is_double(&self) -> bool {
        matches!(self, Self::Double(_))
    }
}

/// What block streaming packs and swaps: every frozen tensor, in [`FluxBlock::frozen_tensors_mut`]'s order. One
/// streamer only ever holds blocks of one kind.
impl Streamable for FluxBlock {
    fn frozen_tensors(&self) -> Vec<Tensor> {
        frozen_fields(self, FluxBlock::frozen_tensors_mut)
    }

    fn with_frozen(&self, tensors: &[Tensor]) -> Result<Self> {
        with_frozen_fields(self, FluxBlock::frozen_tensors_mut, tensors, "FLUX block")
    }
}
