//! The LoRA gradients of the image-to-video step (tiny Wan2.1 I2V with `y` and CLIP tokens): the checkpointed
//! step in every backward mode equals the whole-graph backward, and matches finite differences of the loss.

use candle_core::{Device, Result, Tensor};

use crate::family::wan::step_testkit::{
    check_every_backward_equals_whole_graph, check_lora_gradients_by_finite_differences,
    random_targets,
};
use crate::family::wan::tests::i2v::tiny_i2v;
use crate::train::step::LossTarget;
use framesmith_models::wan::random::random_inputs;
use framesmith_models::wan::WanInputs;

/// Random I2V inputs (two samples of different sizes, `y` and CLIP features) and random targets.
fn batch(cfg: &framesmith_models::wan::WanConfig) -> Result<(WanInputs, Vec<Tensor>)> {
    let inputs = random_inputs(cfg, &[[2, 4, 6], [1, 4, 4]], 12, &Device::Cpu)?;
    let targets = random_targets(&inputs, 13)?;
    Ok((inputs, targets))
}

#[test]
fn i2v_checkpointed_step_equals_whole_graph_backward() -> Result<()> {
    let (model, vars) = tiny_i2v(&[])?;
    let (inputs, targets) = batch(model.config())?;
    assert!(inputs.y.is_some() && inputs.clip.is_some());
    let weights = [1.0, 0.7];
    let target = LossTarget {
        targets: &targets,
        weights: Some(&weights),
        skip_frames: 0,
    };
    check_every_backward_equals_whole_graph(&model, &inputs, &target, &vars)?;
    Ok(())
}

#[test]
fn i2v_lora_gradients_match_finite_differences() -> Result<()> {
    let (model, vars) = tiny_i2v(&[])?;
    let (inputs, targets) = batch(model.config())?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    check_lora_gradients_by_finite_differences(&model, &inputs, &target, &vars, 14)
}
