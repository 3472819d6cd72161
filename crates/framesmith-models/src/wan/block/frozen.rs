//! The frozen tensors of a block in one fixed order: what block streaming packs into a host buffer and swaps in
//! from a GPU slot. Everything but the LoRA (which is trained and stays resident) is listed.

use candle_core::Tensor;

use super::{Block, CrossAttention, SelfAttention};

impl SelfAttention {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = Vec::new();
        for l in [&mut self.q, &mut self.k, &mut self.v, &mut self.o] {
            out.extend(l.frozen_tensors_mut());
        }
        out.extend(self.norm_q.as_mut());
        out.extend(self.norm_k.as_mut());
        out
    }
}

impl CrossAttention {
    fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = Vec::new();
        for l in [&mut self.q, &mut self.k, &mut self.v, &mut self.o] {
            out.extend(l.frozen_tensors_mut());
        }
        for l in [self.k_img.as_mut(), self.v_img.as_mut()]
            .into_iter()
            .flatten()
        {
            out.extend(l.frozen_tensors_mut());
        }
        out.extend(self.norm_q.as_mut());
        out.extend(self.norm_k.as_mut());
        out.extend(self.norm_k_img.as_mut());
        out
    }
}

impl Block {
    /// Every frozen tensor of the block (linear bases and biases, norm weights, modulation), always in the same
    /// order for blocks of the same configuration.
    pub fn frozen_tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out = self.self_attn.frozen_tensors_mut();
        out.extend(self.cross_attn.frozen_tensors_mut());
        out.extend(self.ffn0.frozen_tensors_mut());
        out.extend(self.ffn2.frozen_tensors_mut());
        if let Some((w, b)) = self.norm3.as_mut() {
            out.push(w);
            out.push(b);
        }
        out.push(&mut self.modulation);
        out
    }
}

/// What block streaming packs and swaps: every frozen tensor, in [`Block::frozen_tensors_mut`]'s order.
impl framesmith_nn::offload::Streamable for Block {
    /// The frozen tensors in [`Block::frozen_tensors_mut`]'s order (cheap clones sharing storage).
    fn frozen_tensors(&self) -> Vec<Tensor> {
        framesmith_nn::offload::frozen_fields(self, Block::frozen_tensors_mut)
    }

    /// A copy of this block (sharing its LoRA) whose frozen tensors are `tensors`, given in
    /// [`Block::frozen_tensors_mut`]'s order with the same shapes and dtypes.
    fn with_frozen(&self, tensors: &[Tensor]) -> candle_core::Result<Block> {
        framesmith_nn::offload::with_frozen_fields(
            self,
            Block::frozen_tensors_mut,
            tensors,
            "block",
        )
    }
}
