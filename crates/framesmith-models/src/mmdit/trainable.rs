//! [`TrainableBlock`] for [`DualStreamBlock`]: the block as a unit on the joint [text; image] sequence with its
//! hand-written backward. With selective checkpointing a block keeps its attention (and, optionally, its gated
//! branches' outputs) for the recompute ([`KeptBlock`]). [`PreparedBatch`] for the embeddings' [`Prepared`].

use candle_core::{Result, Tensor};

use super::block::grad::DualStreamTape;
use super::block::{BlockInputs, DualStreamBlock};
use super::stack::Prepared;
use crate::trainable::{BlockGrads, PreparedBatch, TrainableBlock};
use framesmith_nn::attention::KeptBlock;

impl DualStreamTape {
    /// What a recompute may reuse: the attention output and LSE, and with `projections` the outputs of the
    /// products that feed the gated residuals ([`DualStreamTape::projections`]).
    pub fn kept(&self, projections: bool) -> KeptBlock {
        let outputs = if projections {
            self.projections().iter().map(|&t| t.clone()).collect()
        } else {
            Vec::new()
        };
        KeptBlock::new(self.attention().kept(), outputs)
    }
}

impl DualStreamBlock {
    /// The forward without a graph keeping its tape; `kept`: this block's values from an earlier pass on the same
    /// input, whose attention (and kept products) are then not run again.
    fn forward_keeping(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<(Tensor, DualStreamTape)> {
        let attention = kept.map(KeptBlock::attention);
        let kept_out = match kept.map_or(&[][..], KeptBlock::outputs) {
            [] => None,
            [a, b, c, d] => Some([a, b, c, d]),
            other => candle_core::bail!(
                "a dual-stream block keeps 4 branch outputs, not {}",
                other.len()
            ),
        };
        DualStreamBlock::forward_with_tape(self, xs, shared, attention, kept_out)
    }
}

impl TrainableBlock for DualStreamBlock {
    type Shared = BlockInputs;
    type Kept = KeptBlock;
    type Tape = DualStreamTape;

    fn forward(&self, xs: &Tensor, shared: &BlockInputs) -> Result<Tensor> {
        DualStreamBlock::forward(self, xs, shared)
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
    ) -> Result<(Tensor, DualStreamTape)> {
        self.forward_keeping(xs, shared, None)
    }

    fn recompute(
        &self,
        xs: &Tensor,
        shared: &BlockInputs,
        kept: Option<&KeptBlock>,
    ) -> Result<DualStreamTape> {
        Ok(self.forward_keeping(xs, shared, kept)?.1)
    }

    fn backward(&self, tape: DualStreamTape, grad: &Tensor) -> Result<BlockGrads> {
        DualStreamBlock::backward(self, tape, grad)
    }
}

impl<H: Clone> PreparedBatch for Prepared<H> {
    type Shared = BlockInputs;

    fn block_input(&self) -> &Tensor {
        &self.xs
    }

    fn shared(&self) -> &BlockInputs {
        &self.blocks
    }

    fn detached(&self) -> Self {
        Prepared {
            xs: self.xs.detach(),
            blocks: self.blocks.detached(),
            head: self.head.clone(),
        }
    }
}
