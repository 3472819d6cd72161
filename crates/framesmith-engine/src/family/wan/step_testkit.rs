//! Helpers of the training-step tests (T2V, I2V, streamed): random LoRAs on a model's linears, random targets for a
//! batch, and the finite-difference check of the step's LoRA gradients.

use candle_core::{DType, Result, Tensor, Var};
use rand::{rngs::StdRng, SeedableRng};

pub use super::whole_graph::whole_graph_step;
use crate::train::step::{checkpointed_step, flow_loss, BlockBackward, LossTarget, StepOptions};
use framesmith_models::wan::{WanInputs, WanModel};
use framesmith_nn::init::randn;
use framesmith_nn::lora::Lora;
use framesmith_nn::testing::rel;

/// A rank-4 LoRA (alpha 4, factors drawn from N(0, 0.1²) seeded by `seed`) on every linear of `model`; returns its
/// `Var`s, down then up for each linear, in the model's order.
pub fn attach_random_loras(model: &mut WanModel, seed: u64) -> Result<Vec<Var>> {
    let rng = &mut StdRng::seed_from_u64(seed);
    let dev = model.device().clone();
    let mut vars = Vec::new();
    for (_, linear) in model.linears_mut() {
        let (inp, out) = (linear.in_dim(), linear.out_dim());
        let lora = Lora::from_tensors(
            &randn(rng, (4, inp), 0.0, 0.1, &dev)?,
            &randn(rng, (out, 4), 0.0, 0.1, &dev)?,
            4.0,
        )?;
        vars.push(lora.down.clone());
        vars.push(lora.up.clone());
        linear.set_lora(Some(lora));
    }
    Ok(vars)
}

/// Standard-normal targets of the batch's latent shapes, seeded by `seed`.
pub fn random_targets(inputs: &WanInputs, seed: u64) -> Result<Vec<Tensor>> {
    let rng = &mut StdRng::seed_from_u64(seed);
    inputs
        .latents
        .iter()
        .map(|x| randn(rng, x.shape(), 0.0, 1.0, x.device()))
        .collect()
}

/// Checks the checkpointed step's LoRA gradients against central finite differences of the loss along one random
/// direction over every LoRA parameter (seeded by `seed`): relative error under 2%.
pub fn check_lora_gradients_by_finite_differences(
    model: &WanModel,
    inputs: &WanInputs,
    target: &LossTarget,
    vars: &[Var],
    seed: u64,
) -> Result<()> {
    let out = checkpointed_step(model, inputs, target, vars, &StepOptions::default())?;
    let rng = &mut StdRng::seed_from_u64(seed);
    let dirs = vars
        .iter()
        .map(|v| randn(rng, v.shape(), 0.0, 1.0, v.device()))
        .collect::<Result<Vec<_>>>()?;
    let analytic: f64 = out
        .grads
        .iter()
        .zip(&dirs)
        .map(|(g, d)| Ok((g * d)?.sum_all()?.to_scalar::<f32>()? as f64))
        .sum::<Result<f64>>()?;
    let originals = vars
        .iter()
        .map(|v| v.as_tensor().copy())
        .collect::<Result<Vec<_>>>()?;
    // The loss (a few units, f32 ulp ~2e-7) moves by only ~1e-4 or less either way, so an f32 loss would put
    // percent-level noise on the difference: it is summed in f64 (`flow_loss` on f64 outputs).
    let eps = 1e-3;
    let loss_at = |sign: f64| -> Result<f64> {
        for ((v, o), d) in vars.iter().zip(&originals).zip(&dirs) {
            v.set(&(o + (d * (sign * eps))?)?)?;
        }
        let outs = model
            .forward(inputs)?
            .iter()
            .map(|o| o.to_dtype(DType::F64))
            .collect::<Result<Vec<_>>>()?;
        flow_loss(&outs, target)?.to_scalar::<f64>()
    };
    let numeric = (loss_at(1.0)? - loss_at(-1.0)?) / (2.0 * eps);
    for (v, o) in vars.iter().zip(&originals) {
        v.set(o)?;
    }
    let err = (numeric - analytic).abs() / analytic.abs().max(1e-6);
    eprintln!("directional derivative: finite differences {numeric:.6e}, analytic {analytic:.6e}");
    assert!(
        err < 2e-2,
        "finite differences {numeric} vs analytic {analytic} (rel {err})"
    );
    Ok(())
}

/// The checkpointed step with every backward (autograd, hand-written, keeping attention, keeping tapes) gives the
/// whole-graph backward's loss (1e-6 relative) and LoRA gradients (1e-5 relative), none of them zero.
pub fn check_every_backward_equals_whole_graph(
    model: &WanModel,
    inputs: &WanInputs,
    target: &LossTarget,
    vars: &[Var],
) -> Result<()> {
    let full = whole_graph_step(model, inputs, target, vars)?;
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
        let ckpt = checkpointed_step(model, inputs, target, vars, &options)?;
        assert!((ckpt.loss - full.loss).abs() <= 1e-6 * full.loss.abs());
        for (a, b) in ckpt.grads.iter().zip(&full.grads) {
            let r = rel(a, b)?;
            assert!(r <= 1e-5, "{backward:?}: LoRA gradient differs: rel {r}");
            assert!(b.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0);
        }
    }
    Ok(())
}
