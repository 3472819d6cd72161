//! The LoRA gradients of the image-to-video step (tiny Wan2.1 I2V with `y` and CLIP tokens): the checkpointed
//! step in every backward mode equals the whole-graph backward, and matches finite differences of the loss.

use candle_core::{Device, Result, Tensor};

use crate::train::i2v_tests::tiny_i2v;
use crate::train::step::{
    checkpointed_step, whole_graph_step, BlockBackward, LossTarget, StepOptions,
};
use crate::train::step_testkit::{check_lora_gradients_by_finite_differences, random_targets};
use framesmith_models::wan::random::random_inputs;
use framesmith_models::wan::WanInputs;
use framesmith_nn::testing::rel;

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
    let full = whole_graph_step(&model, &inputs, &target, &vars)?;
    for (backward, keep_attention, keep_tapes) in [
        (BlockBackward::Autograd, false, false),
        (BlockBackward::Manual, false, false),
        (BlockBackward::Manual, true, false),
        (BlockBackward::Manual, false, true),
    ] {
        let options = StepOptions {
            backward,
            keep_attention,
            keep_tapes,
            ..Default::default()
        };
        let ckpt = checkpointed_step(&model, &inputs, &target, &vars, &options)?;
        assert!((ckpt.loss - full.loss).abs() <= 1e-6 * full.loss.abs());
        for (a, b) in ckpt.grads.iter().zip(&full.grads) {
            let r = rel(a, b)?;
            assert!(r <= 1e-5, "{backward:?}: LoRA gradient differs: rel {r}");
            assert!(b.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0);
        }
    }
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
