//! The checkpointed step on a tiny Wan model: every backward mode and checkpointing setting gives the
//! whole-graph step's loss and LoRA gradients, which match finite differences; skipped start frames stay out of
//! the loss; a non-finite loss and a failed allocation are typed errors.

use candle_core::{DType, Device, Result, Tensor, Var};

use crate::family::wan::step_testkit::{attach_random_loras, random_targets, whole_graph_step};
use crate::train::step::*;
use framesmith_models::wan::random::{random_inputs, random_weights};
use framesmith_models::wan::{WanConfig, WanInputs, WanModel};
use framesmith_nn::offload::SavedPlacement;
use framesmith_nn::testing::rel;
use framesmith_nn::vb::Vb;

/// A tiny model with LoRAs on every block linear whose `up` is random (not zero), so every LoRA parameter
/// gets a gradient.
fn tiny_model_with_loras(layers: usize) -> Result<(WanModel, Vec<Var>)> {
    let dev = Device::Cpu;
    let cfg = WanConfig::tiny(layers);
    let vb = Vb::from_tensors(random_weights(&cfg, 7, DType::F32, &dev)?, DType::F32, &dev);
    let mut model = WanModel::new(&cfg, vb, &Default::default())?;
    let vars = attach_random_loras(&mut model, 11)?;
    Ok((model, vars))
}

fn batch(model: &WanModel) -> Result<(WanInputs, Vec<Tensor>)> {
    let cfg = model.config();
    let mut inputs = random_inputs(cfg, &[[2, 4, 6], [1, 4, 4]], 3, &Device::Cpu)?;
    inputs.latents = inputs
        .latents
        .iter()
        .map(|x| Var::from_tensor(x).map(|v| v.as_tensor().clone()))
        .collect::<Result<_>>()?;
    let targets = random_targets(&inputs, 5)?;
    Ok((inputs, targets))
}

#[test]
fn checkpointed_step_equals_whole_graph_backward() -> Result<()> {
    let (model, vars) = tiny_model_with_loras(3)?;
    let (inputs, targets) = batch(&model)?;
    let weights = [1.0, 0.5];
    let target = LossTarget {
        targets: &targets,
        weights: Some(&weights),
        skip_frames: 0,
    };
    let full = whole_graph_step(&model, &inputs, &target, &vars)?;
    let modes = [
        (BlockBackward::Autograd, false, false, false),
        (BlockBackward::Manual, false, false, false),
        (BlockBackward::Manual, true, false, false),
        (BlockBackward::Manual, true, true, false),
        (BlockBackward::Manual, false, false, true),
    ];
    for (backward, keep_attention, keep_projection, keep_tapes) in modes {
        let options = StepOptions {
            return_input_grads: true,
            backward,
            keep_attention,
            keep_projection,
            keep_tapes,
            ..Default::default()
        };
        let ckpt = checkpointed_step(&model, &inputs, &target, &vars, &options)?;
        assert!((ckpt.loss - full.loss).abs() <= 1e-6 * full.loss.abs());
        assert_eq!(ckpt.grads.len(), full.grads.len());
        for (a, b) in ckpt.grads.iter().zip(&full.grads) {
            let r = rel(a, b)?;
            assert!(r <= 1e-5, "{backward:?}: LoRA gradient differs: rel {r}");
            assert!(
                b.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0,
                "a LoRA parameter got no gradient"
            );
        }
        let (ci, fi) = (
            ckpt.input_grads.unwrap_or_default(),
            full.input_grads.clone().unwrap_or_default(),
        );
        assert_eq!(ci.len(), 2);
        for (a, b) in ci.iter().zip(&fi) {
            assert!(rel(a, b)? <= 1e-5, "{backward:?}: input gradient differs");
        }
    }
    Ok(())
}

#[test]
fn kept_attention_in_ram_gives_the_step_of_kept_attention_on_the_device() -> Result<()> {
    let (model, vars) = tiny_model_with_loras(3)?;
    let (inputs, targets) = batch(&model)?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let step = |saved_inputs, keep_projection| {
        let options = StepOptions {
            keep_attention: true,
            keep_projection,
            saved_inputs,
            ..Default::default()
        };
        checkpointed_step(&model, &inputs, &target, &vars, &options)
    };
    let on_device = step(SavedPlacement::Device, false)?;
    for (placement, keep_projection) in [
        (SavedPlacement::PageLocked, false),
        (SavedPlacement::Pageable, false),
        (SavedPlacement::Device, true),
        (SavedPlacement::PageLocked, true),
        (SavedPlacement::Pageable, true),
    ] {
        let in_ram = step(placement, keep_projection)?;
        assert_eq!(in_ram.loss, on_device.loss, "{placement:?}");
        for (a, b) in in_ram.grads.iter().zip(&on_device.grads) {
            assert_eq!(
                a.flatten_all()?.to_vec1::<f32>()?,
                b.flatten_all()?.to_vec1::<f32>()?,
                "{placement:?} (projection kept: {keep_projection}): a block recomputed with another \
                 block's attention"
            );
        }
    }
    Ok(())
}

#[test]
fn lora_gradients_match_finite_differences() -> Result<()> {
    let (model, vars) = tiny_model_with_loras(2)?;
    let (inputs, targets) = batch(&model)?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    crate::family::wan::step_testkit::check_lora_gradients_by_finite_differences(
        &model, &inputs, &target, &vars, 9,
    )
}

#[test]
fn stops_non_finite_losses_and_allocation_failures_are_typed() -> Result<()> {
    let (model, vars) = tiny_model_with_loras(2)?;
    let (inputs, targets) = batch(&model)?;
    let nan_targets = targets
        .iter()
        .map(|t| t * f64::NAN)
        .collect::<Result<Vec<_>>>()?;
    let target = |targets| LossTarget {
        targets,
        weights: None,
        skip_frames: 0,
    };
    let step = |targets, options: &StepOptions| {
        try_checkpointed_step(&model, &inputs, &target(targets), &vars, options)
    };
    let stop = || true;
    let stopping = StepOptions {
        interrupted: Some(&stop),
        ..Default::default()
    };
    assert!(matches!(
        step(&targets, &stopping),
        Err(StepError::Interrupted)
    ));
    let err = step(&nan_targets, &StepOptions::default()).err();
    assert!(
        matches!(err, Some(StepError::NonFiniteLoss(l)) if l.is_nan()),
        "{err:?}"
    );
    assert!(step(&targets, &StepOptions::default()).is_ok());
    // What candle's error said on the H200 when a CUDA allocation failed.
    let driver =
        candle_core::Error::Msg("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into());
    assert!(matches!(StepError::from(driver), StepError::OutOfMemory(_)));
    let other = candle_core::Error::Msg("shape mismatch".into());
    assert!(matches!(StepError::from(other), StepError::Candle(_)));
    Ok(())
}

#[test]
fn skipped_start_frames_are_left_out_of_the_loss() -> Result<()> {
    let dev = Device::Cpu;
    let out = Tensor::zeros((2, 3, 2, 2), DType::F32, &dev)?;
    // The first frame is far off, the other two are off by 1 everywhere.
    let first = Tensor::full(100f32, (2, 1, 2, 2), &dev)?;
    let rest = Tensor::ones((2, 2, 2, 2), DType::F32, &dev)?;
    let targets = [Tensor::cat(&[&first, &rest], 1)?];
    let loss = |skip_frames| {
        let target = LossTarget {
            targets: &targets,
            weights: None,
            skip_frames,
        };
        flow_loss(std::slice::from_ref(&out), &target)?.to_scalar::<f32>()
    };
    assert_eq!(loss(1)?, 1.0);
    assert!(loss(0)? > 1000.0);
    assert!(loss(3).is_err(), "nothing left to train on");
    Ok(())
}
