//! The blocks of the FLUX.1 DiT as one list: the double-stream blocks and then the single-stream blocks, each
//! taking and returning the joint sequence [b, txt_len + img_len, dim] (text rows first), so the training step,
//! block streaming and the planner see one kind of unit (DESIGN.md §4.8).

use candle_core::{DType, Result, Tensor};

use super::double_block::DoubleStreamBlock;
use super::rope::Rope;
use super::single_block::SingleStreamBlock;
use framesmith_nn::linear::Linear;

pub mod grad;

pub use crate::modulated::LAYER_NORM_EPS;

/// What every block of one forward pass shares.
#[derive(Clone)]
pub struct BlockInputs {
    /// The conditioning vector [b, dim] (time + guidance + pooled text), in the compute dtype.
    pub vec: Tensor,
    /// RoPE tables of the joint sequence.
    pub rope: Rope,
    /// Number of text tokens (the first rows of the joint sequence).
    pub txt_len: usize,
}

impl BlockInputs {
    /// The dtype the blocks' linears run in.
    pub fn compute_dtype(&self) -> DType {
        self.vec.dtype()
    }
}

/// One block of either kind.
// A model holds a few dozen long-lived blocks: the size difference costs nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum FluxBlock {
    /// `double_blocks.N`.
    Double(DoubleStreamBlock),
    /// `single_blocks.N`.
    Single(SingleStreamBlock),
}

impl FluxBlock {
    /// Runs the block on the joint sequence `xs` [b, txt_len + img_len, dim].
    pub fn forward(&self, xs: &Tensor, inputs: &BlockInputs) -> Result<Tensor> {
        match self {
            Self::Double(b) => b.forward(xs, inputs),
            Self::Single(b) => b.forward(xs, inputs),
        }
    }

    /// The block's linear layers by their path under the block (`img_attn.qkv`, `linear1`, …), for LoRA.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        match self {
            Self::Double(b) => b.linears_mut(),
            Self::Single(b) => b.linears_mut(),
        }
    }

    /// The block's key prefix in the official checkpoint (`double_blocks.3`, `single_blocks.10`) given its
    /// index within its kind.
    pub fn prefix(&self, index_in_kind: usize) -> String {
        match self {
            Self::Double(_) => format!("double_blocks.{index_in_kind}"),
            Self::Single(_) => format!("single_blocks.{index_in_kind}"),
        }
    }
}
