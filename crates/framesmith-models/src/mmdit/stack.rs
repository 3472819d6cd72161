//! The stack of dual-stream blocks a family's transformer runs: some resident on the device, the others kept in
//! host RAM and streamed through GPU slots (DESIGN.md §4.4). A family says how block `i` is read and how its
//! linears are named; loading, the streaming order, fetching a block and the block loop are here.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{Device, Result, Tensor};

use super::block::{BlockInputs, DualStreamBlock};
use framesmith_nn::linear::Linear;
use framesmith_nn::offload::{BlockStreamer, OffloadOptions, Streamable};
use framesmith_nn::vb::Vb;

/// The blocks of one transformer, in order (a streamed block's shell points at a GPU slot: reach blocks through
/// [`BlockStack::block`]).
#[derive(Clone)]
pub struct BlockStack {
    blocks: Vec<DualStreamBlock>,
    /// The streamer of the blocks kept in host RAM (`None`: every block is resident).
    streamer: Option<Arc<BlockStreamer>>,
    /// The model's name, for errors (`Qwen-Image`).
    model: &'static str,
}

impl BlockStack {
    /// Reads `n` blocks with `block_at(i, vb)`, those in `streamed` on the CPU, each packed into the streamer
    /// before the next is read, so it never occupies the device beyond the slots; the others on `vb`'s device.
    pub fn load(
        model: &'static str,
        n: usize,
        vb: &Vb,
        block_at: impl Fn(usize, &Vb) -> Result<DualStreamBlock>,
        streamed: &[usize],
        offload: &OffloadOptions,
    ) -> Result<Self> {
        let mut streamed = streamed.to_vec();
        streamed.sort_unstable();
        streamed.dedup();
        if let Some(&i) = streamed.iter().find(|&&i| i >= n) {
            candle_core::bail!(
                "{model}: streamed block {i} is out of range (the model has {n} blocks)"
            );
        }
        let mut blocks = Vec::with_capacity(n);
        for i in (0..n).filter(|i| streamed.binary_search(i).is_err()) {
            blocks.push((i, block_at(i, vb)?));
        }
        let streamer = if streamed.is_empty() {
            None
        } else {
            let host = vb.with_device(&Device::Cpu);
            let built = streamed.iter().map(|&i| Ok((i, block_at(i, &host)?)));
            let (streamer, shells) = BlockStreamer::new(vb.device(), n, built, offload)?;
            blocks.extend(shells);
            Some(Arc::new(streamer))
        };
        blocks.sort_by_key(|(i, _)| *i);
        Ok(Self {
            blocks: blocks.into_iter().map(|(_, b)| b).collect(),
            streamer,
            model,
        })
    }

    /// How many blocks there are.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The blocks as they are held: a streamed block is a shell until [`BlockStack::block`] fetches it.
    pub fn iter(&self) -> std::slice::Iter<'_, DualStreamBlock> {
        self.blocks.iter()
    }

    /// The block streamer (`None` when every block is resident).
    pub fn streamer(&self) -> Option<&BlockStreamer> {
        self.streamer.as_deref()
    }

    /// Declares the order the coming [`BlockStack::block`] calls will follow, so streamed blocks are prefetched
    /// (`cyclic`: the order repeats, as in sampling). Does nothing without streaming.
    pub fn begin(&self, order: &[usize], cyclic: bool) -> Result<()> {
        match &self.streamer {
            Some(s) => s.begin(order, cyclic),
            None => Ok(()),
        }
    }

    /// Block `i`, ready to run: a resident block as it is, a streamed one with its weights in a GPU slot. Work
    /// reading a streamed block must be queued before the next call (the slot may then be refilled).
    pub fn block(&self, i: usize) -> Result<Cow<'_, DualStreamBlock>> {
        let Some(block) = self.blocks.get(i) else {
            candle_core::bail!(
                "{}: no block {i} (the model has {})",
                self.model,
                self.blocks.len()
            );
        };
        match self.streamer.as_ref().filter(|s| s.is_streamed(i)) {
            Some(s) => Ok(Cow::Owned(block.with_frozen(&s.fetch(i)?)?)),
            None => Ok(Cow::Borrowed(block)),
        }
    }

    /// Every block linear by its full path: `{prefix}.{i}.{path}` for each `(path, linear)` of `linears(block)`.
    pub fn linears_mut<'a>(
        &'a mut self,
        prefix: &str,
        linears: impl Fn(&'a mut DualStreamBlock) -> Vec<(String, &'a mut Linear)>,
    ) -> Vec<(String, &'a mut Linear)> {
        let mut out = Vec::new();
        for (i, block) in self.blocks.iter_mut().enumerate() {
            for (path, l) in linears(block) {
                out.push((format!("{prefix}.{i}.{path}"), l));
            }
        }
        out
    }

    /// Every block in order on `xs` (streamed blocks fetched as they come).
    pub fn forward(&self, xs: &Tensor, shared: &BlockInputs) -> Result<Tensor> {
        let order: Vec<usize> = (0..self.blocks.len()).collect();
        self.begin(&order, true)?;
        let mut xs = xs.clone();
        for i in order {
            xs = self.block(i)?.forward(&xs, shared)?;
        }
        Ok(xs)
    }
}

/// What a family's embeddings produce: the first block's input (the joint [text; image] sequence), what every
/// block shares, and `head`: what the family's head needs besides them (a latent grid, the rows a loss covers).
#[derive(Clone)]
pub struct Prepared<H> {
    pub xs: Tensor,
    pub blocks: BlockInputs,
    pub head: H,
}
