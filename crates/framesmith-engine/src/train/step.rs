//! The block-wise checkpointed LoRA training step (DESIGN.md §4.3): the forward pass runs every block on detached
//! inputs and keeps only each block's input; the loss is computed in f32; the backward pass walks the blocks in
//! reverse, recomputing each block with gradient tracking from its saved input and back-propagating the incoming
//! gradient. Peak activation memory is one block's graph plus the saved block inputs.

use std::collections::HashMap;

use candle_core::{backprop::GradStore, DType, Result, Tensor, TensorId, Var};

use framesmith_models::trainable::{ParamGrad, PreparedBatch, TrainableBlock, TrainableModel};
use framesmith_nn::offload::{KeptValues, OutOfMemory, SavedInputs, SavedPlacement};

/// Why a step gave no result: what the trainer branches on. candle's other errors ride in `Candle`.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The cancel poll asked to stop (checked between blocks); nothing was applied.
    #[error("the step was interrupted")]
    Interrupted,
    /// A device allocation failed.
    #[error(transparent)]
    OutOfMemory(#[from] OutOfMemory),
    /// The loss was NaN or infinite, so its gradients would be too: the backward pass was not run.
    #[error("the loss was {0}")]
    NonFiniteLoss(f32),
    #[error(transparent)]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for StepError {
    fn from(err: candle_core::Error) -> Self {
        match OutOfMemory::classify(err) {
            Ok(oom) => Self::OutOfMemory(oom),
            Err(err) => Self::Candle(err),
        }
    }
}

impl StepError {
    /// Whether `err` is (or wraps) a stop between blocks.
    pub fn is_interrupted(err: &anyhow::Error) -> bool {
        matches!(
            err.downcast_ref::<StepError>(),
            Some(StepError::Interrupted)
        )
    }

    /// As a candle error: candle's own error back as it was, the others as their message.
    pub fn into_candle(self) -> candle_core::Error {
        match self {
            Self::Candle(err) => err,
            Self::OutOfMemory(oom) => oom.into_inner(),
            other => candle_core::Error::Msg(other.to_string()),
        }
    }
}

/// What the loss compares the model output with.
pub struct LossTarget<'a> {
    /// Flow-matching targets, one [out_dim, F, H, W] per sample.
    pub targets: &'a [Tensor],
    /// Per-sample loss weights (timestep weighting); `None` weighs every sample 1.
    pub weights: Option<&'a [f64]>,
    /// Leading latent frames left out of the loss: the given start frame of image-to-video training.
    pub skip_frames: usize,
}

/// Result of one step.
pub struct StepOutput {
    /// Mean squared error over every element of every sample (weighted), in f32.
    pub loss: f32,
    /// Gradient of each trainable variable, in the order given; zeros for a variable the loss does not reach.
    pub grads: Vec<Tensor>,
    /// Gradients of the input latents (only when the latents were passed as variables and asked for).
    pub input_grads: Option<Vec<Tensor>>,
}

/// Weighted MSE in f32 (in f64 when the outputs are f64): Σᵢ wᵢ Σ (outᵢ − targetᵢ)² / (total element count),
/// over the latent frames after `skip_frames`.
pub fn flow_loss(outs: &[Tensor], target: &LossTarget) -> Result<Tensor> {
    if outs.len() != target.targets.len() {
        candle_core::bail!(
            "{} outputs but {} targets",
            outs.len(),
            target.targets.len()
        );
    }
    let mut total: Option<Tensor> = None;
    let mut count = 0usize;
    for (i, (out, t)) in outs.iter().zip(target.targets).enumerate() {
        let dtype = if out.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let frames = out.dim(1)?;
        if target.skip_frames >= frames {
            candle_core::bail!(
                "{} start frames leave nothing of {frames} latent frames to train on",
                target.skip_frames
            );
        }
        let kept = |x: &Tensor| x.narrow(1, target.skip_frames, frames - target.skip_frames);
        let out = kept(out)?;
        let diff = (out.to_dtype(dtype)? - kept(t)?.to_dtype(dtype)?)?;
        let mut se = diff.sqr()?.sum_all()?;
        if let Some(w) = target.weights {
            se = (se * w.get(i).copied().unwrap_or(1.0))?;
        }
        count += out.elem_count();
        total = Some(match total {
            Some(acc) => (acc + se)?,
            None => se,
        });
    }
    match total {
        Some(t) => t / count.max(1) as f64,
        None => candle_core::bail!("empty batch"),
    }
}

fn add_into(slot: &mut Option<Tensor>, g: &Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        Some(prev) => (prev + g)?,
        None => g.clone(),
    });
    Ok(())
}

/// Adds the gradients `store` holds for `vars` into `acc`.
pub(crate) fn accumulate(
    acc: &mut [Option<Tensor>],
    vars: &[Var],
    store: &GradStore,
) -> Result<()> {
    for (slot, var) in acc.iter_mut().zip(vars) {
        if let Some(g) = store.get(var.as_tensor()) {
            add_into(slot, g)?;
        }
    }
    Ok(())
}

/// Adds hand-computed gradients into `acc`, finding each variable's slot by its tensor id; gradients of
/// variables not in the list are dropped (they are not being trained).
fn accumulate_params(
    acc: &mut [Option<Tensor>],
    slots: &HashMap<TensorId, usize>,
    params: &[ParamGrad],
) -> Result<()> {
    for p in params {
        if let Some(slot) = slots
            .get(&p.var.as_tensor().id())
            .and_then(|&i| acc.get_mut(i))
        {
            add_into(slot, &p.grad)?;
        }
    }
    Ok(())
}

pub(crate) fn finish_grads(acc: Vec<Option<Tensor>>, vars: &[Var]) -> Result<Vec<Tensor>> {
    acc.into_iter()
        .zip(vars)
        .map(|(g, v)| g.map_or_else(|| v.as_tensor().zeros_like(), Ok))
        .collect()
}

/// How the checkpointed step back-propagates through each block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockBackward {
    /// The hand-written backward ([`TrainableBlock::backward`]): the block is recomputed without an autograd graph and
    /// back-propagated op by op.
    #[default]
    Manual,
    /// candle's autograd through a recomputed block graph: the reference the manual backward is tested against.
    Autograd,
}

/// Options of the checkpointed step.
#[derive(Default)]
pub struct StepOptions<'a> {
    /// Also return the gradient of the input latents (when `inputs.latents` are variables; tests).
    pub return_input_grads: bool,
    /// Polled between blocks: returning true abandons the step with an error (cooperative cancel).
    pub interrupted: Option<&'a dyn Fn() -> bool>,
    /// Where the saved block inputs wait (`memory.activations`; host RAM page-locked or pageable).
    pub saved_inputs: SavedPlacement,
    /// How blocks are back-propagated.
    pub backward: BlockBackward,
    /// Selective checkpointing (manual backward only): keep every block's self-attention output and LSE from the
    /// forward pass, so the backward's recompute skips the self-attention kernel (about a fifth of a block's
    /// recompute at 32k tokens). Costs `b · seq · dim` compute-dtype values plus `b · heads · seq` f32 per block
    /// (the planner's `kept_attention_bytes`). They wait where `saved_inputs` says, as the saved inputs do.
    pub keep_attention: bool,
    /// With `keep_attention`: keep the self-attention's projected output too (its output projection's), so the
    /// recompute also skips that product. `b · seq · dim` compute-dtype values more per block (the planner's
    /// `kept_projection_bytes`).
    pub keep_projection: bool,
    /// No checkpointing (manual backward only): keep every block's whole tape from the forward, so the backward
    /// recomputes nothing. Costs all of every block's intermediates until its backward (tens of GiB at 32k
    /// tokens; little for short sequences, where it moves the backward off the critical path of streaming).
    /// Saved inputs are not kept separately (they are in the tapes), so `saved_inputs` does not apply.
    pub keep_tapes: bool,
}

fn check_interrupt(options: &StepOptions) -> std::result::Result<(), StepError> {
    match options.interrupted {
        Some(f) if f() => Err(StepError::Interrupted),
        _ => Ok(()),
    }
}

/// [`try_checkpointed_step`] with every failure as a candle error (benchmarks and tests, which branch on none).
pub fn checkpointed_step<M: TrainableModel>(
    model: &M,
    inputs: &M::Inputs,
    target: &LossTarget,
    vars: &[Var],
    options: &StepOptions,
) -> Result<StepOutput> {
    try_checkpointed_step(model, inputs, target, vars, options).map_err(StepError::into_candle)
}

/// The checkpointed step of any [`TrainableModel`]. `vars` are the trainable variables (LoRA down/up). A stop
/// between blocks, a device allocation failure and a non-finite loss come back as their [`StepError`] variants.
// The step's forward, head and backward share its stashes, tapes and accumulators; it is the GPU-measured hot
// path (bench/RESULTS.md), so it is split only together with a re-measure on the device.
#[allow(clippy::too_many_lines)]
pub fn try_checkpointed_step<M: TrainableModel>(
    model: &M,
    inputs: &M::Inputs,
    target: &LossTarget,
    vars: &[Var],
    options: &StepOptions,
) -> std::result::Result<StepOutput, StepError> {
    let prepared = model.prepare(inputs)?;
    let head_inputs = prepared.detached();
    let shared = head_inputs.shared();

    let n = model.num_blocks();
    let order: Vec<usize> = (0..n).chain((0..n).rev()).collect();
    model.begin_blocks(&order, false)?;
    let manual = options.backward == BlockBackward::Manual;
    let keep = options.keep_attention && manual;
    let mut saved = SavedInputs::new(model.device(), options.saved_inputs)?;
    // Kept values wait where the saved inputs do (in RAM, a block's output comes back a block ahead); a step that
    // keeps none makes no stash for them.
    let mut kept = KeptValues::new(model.device(), options.saved_inputs)?;
    let mut kept_count = 0;
    let mut tapes = Vec::new();
    let mut xs = head_inputs.block_input().clone();
    for i in 0..n {
        check_interrupt(options)?;
        if options.keep_tapes && manual {
            let (next, tape) = model.block(i)?.forward_with_tape(&xs, shared)?;
            tapes.push(tape);
            xs = next;
            continue;
        }
        // Saved before the block runs: a copy to the host overlaps the block.
        saved.push(xs.clone())?;
        let block = model.block(i)?;
        let (next, value) = if keep {
            let (next, value) = block.forward_untracked(&xs, shared, options.keep_projection)?;
            (next, Some(value))
        } else if manual {
            block.forward_checkpointed(&xs, shared)?
        } else {
            (block.forward_untracked(&xs, shared, false)?.0, None)
        };
        if let Some(value) = value {
            kept.push(value)?;
            kept_count += 1;
        }
        xs = next;
    }
    // The backward takes one kept value per block, last block first.
    if kept_count != 0 && kept_count != n {
        return Err(StepError::Candle(candle_core::Error::Msg(format!(
            "the blocks kept values for {kept_count} of {n} blocks (a block type keeps one at every block or none)"
        ))));
    }

    let last = Var::from_tensor(&xs)?;
    drop(xs);
    let outs = model.finish(last.as_tensor(), &head_inputs)?;
    let loss = flow_loss(&outs, target)?;
    let loss_value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    if !loss_value.is_finite() {
        return Err(StepError::NonFiniteLoss(loss_value));
    }
    let store = loss.backward()?;
    let mut acc: Vec<Option<Tensor>> = vec![None; vars.len()];
    accumulate(&mut acc, vars, &store)?;
    let mut grad = match store.get(last.as_tensor()) {
        Some(g) => g.detach(),
        None => last.as_tensor().zeros_like()?,
    };
    drop((store, outs, loss, last));

    let slots: HashMap<TensorId, usize> = vars
        .iter()
        .enumerate()
        .map(|(i, v)| (v.as_tensor().id(), i))
        .collect();
    for (i, tape) in tapes.into_iter().enumerate().rev() {
        check_interrupt(options)?;
        let grads = model.block(i)?.backward(tape, &grad)?;
        accumulate_params(&mut acc, &slots, &grads.params)?;
        grad = grads.input;
    }
    // Checkpointed blocks (none when the tapes were kept).
    for i in (0..saved.len()).rev() {
        check_interrupt(options)?;
        let block = model.block(i)?;
        let input = saved.pop()?;
        grad = match options.backward {
            BlockBackward::Manual => {
                let tape = block.recompute(&input, shared, kept.pop()?.as_ref())?;
                let grads = block.backward(tape, &grad)?;
                accumulate_params(&mut acc, &slots, &grads.params)?;
                grads.input
            }
            BlockBackward::Autograd => {
                autograd_block_backward(block.as_ref(), &input, shared, &grad, vars, &mut acc)?
            }
        };
    }

    let input_grads = if options.return_input_grads {
        Some(input_grads(
            model,
            (inputs, prepared.block_input()),
            &grad,
            vars,
            &mut acc,
        )?)
    } else {
        None
    };
    Ok(StepOutput {
        loss: loss_value,
        grads: finish_grads(acc, vars)?,
        input_grads,
    })
}

/// The gradients of the model's latent inputs, from `grad`, the gradient of the first block's input
/// (`block_input`): one more backward through the embedding, whose LoRA gradients are added to `acc`.
fn input_grads<M: TrainableModel>(
    model: &M,
    (inputs, block_input): (&M::Inputs, &Tensor),
    grad: &Tensor,
    vars: &[Var],
    acc: &mut [Option<Tensor>],
) -> Result<Vec<Tensor>> {
    let surrogate = (block_input.to_dtype(DType::F32)? * grad.to_dtype(DType::F32)?)?.sum_all()?;
    let store = surrogate.backward()?;
    accumulate(acc, vars, &store)?;
    model
        .latents(inputs)
        .iter()
        .map(|x| store.get(x).cloned().map_or_else(|| x.zeros_like(), Ok))
        .collect()
}

/// The loss alone, forward only (validation): every block runs without an autograd graph on detached inputs and
/// nothing is kept for a backward, so memory is one block's activations and nothing outlives the call. A
/// non-finite loss is returned as it is (validation reports it).
pub fn forward_loss<M: TrainableModel>(
    model: &M,
    inputs: &M::Inputs,
    target: &LossTarget,
    interrupted: Option<&dyn Fn() -> bool>,
) -> std::result::Result<f32, StepError> {
    let options = StepOptions {
        interrupted,
        ..Default::default()
    };
    let prepared = model.prepare(inputs)?.detached();
    let n = model.num_blocks();
    let order: Vec<usize> = (0..n).collect();
    model.begin_blocks(&order, false)?;
    let mut xs = prepared.block_input().clone();
    for i in 0..n {
        check_interrupt(&options)?;
        xs = model
            .block(i)?
            .forward_untracked(&xs, prepared.shared(), false)?
            .0;
    }
    let outs = model
        .finish(&xs.detach(), &prepared)?
        .iter()
        .map(Tensor::detach)
        .collect::<Vec<_>>();
    Ok(flow_loss(&outs, target)?
        .to_dtype(DType::F32)?
        .to_scalar::<f32>()?)
}

/// Recomputes `block` with gradient tracking from its saved `input`, back-propagates `grad` through candle's
/// autograd (surrogate loss `sum(out · grad)`), adds the LoRA gradients to `acc` and returns the input's gradient.
fn autograd_block_backward<B: TrainableBlock>(
    block: &B,
    input: &Tensor,
    shared: &B::Shared,
    grad: &Tensor,
    vars: &[Var],
    acc: &mut [Option<Tensor>],
) -> Result<Tensor> {
    let input = Var::from_tensor(input)?;
    let out = block.forward(input.as_tensor(), shared)?;
    let surrogate = (out.to_dtype(DType::F32)? * grad.to_dtype(DType::F32)?)?.sum_all()?;
    let store = surrogate.backward()?;
    accumulate(acc, vars, &store)?;
    match store.get(input.as_tensor()) {
        Some(g) => Ok(g.detach()),
        None => input.as_tensor().zeros_like(),
    }
}
