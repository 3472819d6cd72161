//! The Wan training step as one whole-graph backward through candle's autograd (every activation kept): the
//! reference `train::step`'s checkpointed step is tested against.

use candle_core::{DType, Result, Tensor, Var};
use framesmith_models::wan::{WanInputs, WanModel};

use crate::train::step::{accumulate, finish_grads, flow_loss, LossTarget, StepOutput};

/// The same step as one whole-graph backward (every activation kept): the reference the checkpointed step is
/// tested against, and a baseline for memory comparisons (`tests/step_memory.rs`).
pub fn whole_graph_step(
    model: &WanModel,
    inputs: &WanInputs,
    target: &LossTarget,
    vars: &[Var],
) -> Result<StepOutput> {
    if model.streamer().is_some() {
        candle_core::bail!("the whole-graph step cannot run on a model that streams blocks");
    }
    let outs = model.forward(inputs)?;
    let loss = flow_loss(&outs, target)?;
    let loss_value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    let store = loss.backward()?;
    let mut acc: Vec<Option<Tensor>> = vec![None; vars.len()];
    accumulate(&mut acc, vars, &store)?;
    let input_grads = inputs
        .latents
        .iter()
        .map(|x| store.get(x).cloned().map_or_else(|| x.zeros_like(), Ok))
        .collect::<Result<Vec<_>>>()?;
    Ok(StepOutput {
        loss: loss_value,
        grads: finish_grads(acc, vars)?,
        input_grads: Some(input_grads),
    })
}
