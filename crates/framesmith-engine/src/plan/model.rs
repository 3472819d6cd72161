//! The model as the planner sees it, whatever its family: a [`DescribeModel`] that each family implements in its
//! folder of `family/` — its kinds of blocks with their bytes, which blocks stream for a count, the weights that stay
//! resident, the LoRA's size, and the activations of one step — so the plan's arithmetic ([`super::plan`]) has no
//! model in it.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use framesmith_config::RunConfig;

use super::bytes::AdapterCount;
use super::sampling::{SampleShape, SamplingMemory};
use super::working_set::StepShape;
use super::{PlanError, PlanInput};
use crate::family::Family;

/// A model as its family describes it to the planner.
pub trait DescribeModel: fmt::Debug + Send + Sync {
    /// The family the model is of.
    fn family(&self) -> &'static dyn Family;
    /// The model's description for `input` (its clip, LoRA, weight format and activation settings).
    fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError>;
    /// Number of transformer blocks.
    fn num_blocks(&self) -> usize;
    /// Sets what a plan of the run config `cfg` holds that depends on the family (the clip's frames, a start frame
    /// kept, a second expert parked); `input` comes with the settings every family shares.
    fn settle(&self, _cfg: &RunConfig, _input: &mut PlanInput) {}
    /// What the family's samples during training hold and add for the largest sample `sample`
    /// ([`super::sampling`]); `None` for a family that makes no samples during training.
    fn sampling(
        &self,
        _input: &PlanInput,
        _sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        Ok(None)
    }
}

/// A [`DescribeModel`] that compares with another and can be looked inside.
trait AnyModel: DescribeModel {
    fn as_any(&self) -> &dyn Any;
    fn same(&self, other: &dyn AnyModel) -> bool;
}

impl<T: DescribeModel + PartialEq + 'static> AnyModel for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn same(&self, other: &dyn AnyModel) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
}

/// A model the planner plans for, of any family.
#[derive(Debug, Clone)]
pub struct PlanModel(Arc<dyn AnyModel>);

impl PartialEq for PlanModel {
    fn eq(&self, other: &Self) -> bool {
        self.0.same(other.0.as_ref())
    }
}

impl PlanModel {
    /// The planner's model of a family's description `model`.
    pub fn new(model: impl DescribeModel + PartialEq + 'static) -> Self {
        Self(Arc::new(model))
    }

    /// The model's description for `input` (its clip, LoRA, weight format and activation settings).
    pub fn describe(&self, input: &PlanInput) -> Result<ModelMemory, PlanError> {
        self.0.describe(input)
    }

    /// The family the model is of.
    pub fn family(&self) -> &'static dyn Family {
        self.0.family()
    }

    /// Number of transformer blocks.
    pub fn num_blocks(&self) -> usize {
        self.0.num_blocks()
    }

    /// Sets the family's part of a plan of `cfg` ([`DescribeModel::settle`]).
    pub fn settle(&self, cfg: &RunConfig, input: &mut PlanInput) {
        self.0.settle(cfg, input);
    }

    /// What the family's samples hold and add for `sample` ([`DescribeModel::sampling`]).
    pub fn sampling(
        &self,
        input: &PlanInput,
        sample: &SampleShape,
    ) -> Result<Option<SamplingMemory>, PlanError> {
        self.0.sampling(input, sample)
    }

    /// The family's own description, when it is a `T` (for the family's code and tests).
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }
}

/// One kind of block (a model has one or several, e.g. double- and single-stream blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockKind {
    /// How the plan's lines name the kind ("double-stream "), empty for a model with one kind.
    pub label: &'static str,
    /// Bytes of one block's frozen tensors as a resident block holds them (what a copy moves).
    pub data_bytes: u64,
    /// Bytes of one block packed for streaming (each buffer aligned): a GPU slot, a host master.
    pub packed_bytes: u64,
    /// Bytes of one block's whole forward tape (kept with `checkpointing = "off"`).
    pub tape_bytes: u64,
    /// Bytes of one block's kept self-attention output and log-sum-exp (`checkpointing = "attention"`).
    pub kept_attention_bytes: u64,
    /// Bytes of one block's kept self-attention projection output (`checkpointing = "attention_projection"`,
    /// on top of `kept_attention_bytes`; 0 for a model that keeps none).
    pub kept_projection_bytes: u64,
}

/// What the planner needs to know about a model for one input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelMemory {
    /// The model's name in the report (a variant's, e.g. "t2v-14b").
    pub name: String,
    pub kinds: Vec<BlockKind>,
    /// The kind of each block (an index into `kinds`), in the order the model runs them.
    pub blocks: Vec<usize>,
    /// For each count of streamed blocks (0 to every block but one), the blocks that stream.
    pub streamed: Vec<Vec<usize>>,
    /// The weights that always stay on the GPU, by component, with their bytes.
    pub resident: Vec<(&'static str, u64)>,
    /// The adapter's parameters, adapted linears and working-memory widths.
    pub lora: AdapterCount,
    /// The step's shape (tokens, dtypes).
    pub shape: StepShape,
    /// One block's saved input (the residual stream over every token).
    pub saved_input_bytes: u64,
    /// Tensors every block reads, alive for the whole step, as (label, bytes).
    pub shared_inputs: Vec<(&'static str, u64)>,
    /// The working set of one block's recompute and backward.
    pub working_set_bytes: u64,
    /// What the memory pool reserves beyond the tensors alive at the step's peak (freed blocks of other sizes),
    /// where the family measured its block's own; `None`: [`pool_fragmentation_bytes`](super::pool_fragmentation_bytes)
    /// of the working set.
    pub fragmentation_bytes: Option<u64>,
    /// What a lower-resolution suggestion rounds to (pixels), and the frame step of a shorter clip (0: images).
    pub pixel_multiple: usize,
    pub frame_step: usize,
}

impl ModelMemory {
    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The blocks that stream when `count` do (clamped to every block but one).
    pub fn streamed_blocks(&self, count: usize) -> &[usize] {
        let last = self.streamed.len().saturating_sub(1);
        self.streamed
            .get(count.min(last))
            .map_or(&[][..], |v| v.as_slice())
    }

    /// How many blocks of each kind `streamed` holds.
    pub fn per_kind(&self, streamed: &[usize]) -> Vec<usize> {
        let mut out = vec![0; self.kinds.len()];
        for &i in streamed {
            if let Some(&k) = self.blocks.get(i) {
                out[k] += 1;
            }
        }
        out
    }

    /// How many blocks of each kind the model has.
    pub fn kind_counts(&self) -> Vec<usize> {
        let mut out = vec![0; self.kinds.len()];
        for &k in &self.blocks {
            out[k] += 1;
        }
        out
    }

    /// The largest packed block (what one GPU slot or staging chunk is sized for).
    pub fn largest_packed_bytes(&self) -> u64 {
        self.kinds.iter().map(|k| k.packed_bytes).max().unwrap_or(0)
    }
}
