//! FLUX.1 through the model-agnostic checkpointed step (DESIGN.md §4.8: a family adds an implementation, not a
//! branch in the step): the loss and every LoRA gradient, with the hand-written block backward and with candle's
//! autograd per block, equal autograd through the whole model.

use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::parity::Fixture;
use crate::train::step::{checkpointed_step, flow_loss, BlockBackward, LossTarget, StepOptions};
use framesmith_models::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::init::randn;
use framesmith_nn::lora::Lora;
use framesmith_nn::testing::rel;
use framesmith_nn::vb::Vb;

fn model_with_loras(fixture: &Fixture, rng: &mut StdRng) -> anyhow::Result<(Flux, Vec<Var>)> {
    let cfg = FluxConfig::from_json(&fixture.config["init"].to_string())?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let mut model = Flux::new(&cfg, &vb)?;
    let mut vars = Vec::new();
    for (_, linear) in model.linears_mut() {
        let dims = [linear.in_dim(), linear.out_dim(), 4];
        let lora = Lora::new(dims, 4.0, DType::F32, &Device::Cpu, rng)?;
        lora.up
            .set(&randn(rng, lora.up.shape(), 0.0, 0.05, &Device::Cpu)?)?;
        vars.extend([lora.down.clone(), lora.up.clone()]);
        linear.set_lora(Some(lora));
    }
    Ok((model, vars))
}

#[test]
fn flux_checkpointed_step_matches_autograd_through_the_model() -> anyhow::Result<()> {
    let dir = framesmith_models::fixtures::case_dir("flux", "flux_dit");
    let fixture = Fixture::load(&dir)?;
    let rng = &mut StdRng::seed_from_u64(3);
    let (model, vars) = model_with_loras(&fixture, rng)?;
    let inputs = FluxInputs {
        img: fixture.input("img")?.clone(),
        img_ids: fixture.input("img_ids")?.clone(),
        txt: fixture.input("txt")?.clone(),
        txt_ids: fixture.input("txt_ids")?.clone(),
        timesteps: fixture.input("timesteps")?.clone(),
        y: fixture.input("y")?.clone(),
        guidance: fixture.inputs.get("guidance").cloned(),
    };
    let (b, l, c) = inputs.img.dims3()?;
    let targets = (0..b)
        .map(|_| randn(rng, (l, c), 0.0, 1.0, &Device::Cpu))
        .collect::<candle_core::Result<Vec<Tensor>>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };

    let out = model.forward(&inputs)?;
    let outs = (0..b)
        .map(|i| out.get(i))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let loss = flow_loss(&outs, &target)?;
    let store = loss.backward()?;
    let want_loss = loss.to_scalar::<f32>()?;

    for backward in [BlockBackward::Manual, BlockBackward::Autograd] {
        let options = StepOptions {
            backward,
            ..Default::default()
        };
        let step = checkpointed_step(&model, &inputs, &target, &vars, &options)?;
        assert!(
            (step.loss - want_loss).abs() <= 1e-6 * want_loss.abs().max(1.0),
            "{backward:?}: loss {} vs {want_loss}",
            step.loss
        );
        let mut worst = 0f64;
        for (var, got) in vars.iter().zip(&step.grads) {
            let want = store
                .get(var.as_tensor())
                .ok_or_else(|| anyhow::anyhow!("no reference gradient"))?;
            worst = worst.max(rel(got, want)?);
        }
        eprintln!(
            "{backward:?}: worst LoRA gradient rel {worst:.2e} over {} factors",
            vars.len()
        );
        assert!(worst <= 1e-5, "{backward:?}: LoRA gradient rel {worst}");
    }
    Ok(())
}

/// An FP8 base (`model.base_dtype = "fp8"`): the blocks' linears are quantised, the embeddings are not, and the
/// checkpointed step runs with a loss close to the dense model's.
#[test]
fn an_fp8_flux_step_quantises_the_block_linears_and_stays_close_to_dense() -> anyhow::Result<()> {
    use framesmith_nn::fp8::Fp8Scale;
    use framesmith_nn::linear::BaseWeight;

    let dir = framesmith_models::fixtures::case_dir("flux", "flux_dit");
    let fixture = Fixture::load(&dir)?;
    let cfg = FluxConfig::from_json(&fixture.config["init"].to_string())?;
    let inputs = FluxInputs {
        img: fixture.input("img")?.clone(),
        img_ids: fixture.input("img_ids")?.clone(),
        txt: fixture.input("txt")?.clone(),
        txt_ids: fixture.input("txt_ids")?.clone(),
        timesteps: fixture.input("timesteps")?.clone(),
        y: fixture.input("y")?.clone(),
        guidance: fixture.inputs.get("guidance").cloned(),
    };
    let (b, l, c) = inputs.img.dims3()?;
    let rng = &mut StdRng::seed_from_u64(8);
    let targets = (0..b)
        .map(|_| randn(rng, (l, c), 0.0, 1.0, &Device::Cpu))
        .collect::<candle_core::Result<Vec<Tensor>>>()?;
    let target = LossTarget {
        targets: &targets,
        weights: None,
        skip_frames: 0,
    };
    let run = |fp8: Option<Fp8Scale>| -> anyhow::Result<(Flux, f32, Vec<Tensor>)> {
        let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu).with_fp8(fp8);
        let mut model = Flux::new(&cfg, &vb)?;
        let mut vars = Vec::new();
        for (k, (_, linear)) in model.linears_mut().into_iter().enumerate() {
            let rng = &mut StdRng::seed_from_u64(50 + k as u64);
            let down = randn(rng, (4, linear.in_dim()), 0.0, 0.1, &Device::Cpu)?;
            let up = randn(rng, (linear.out_dim(), 4), 0.0, 0.05, &Device::Cpu)?;
            let lora = Lora::from_tensors(&down, &up, 4.0)?;
            vars.extend([lora.down.clone(), lora.up.clone()]);
            linear.set_lora(Some(lora));
        }
        let step = checkpointed_step(&model, &inputs, &target, &vars, &StepOptions::default())?;
        Ok((model, step.loss, step.grads))
    };
    let (_, dense_loss, dense_grads) = run(None)?;
    for scale in [Fp8Scale::Tensor, Fp8Scale::Channel, Fp8Scale::Block64] {
        let (mut model, loss, grads) = run(Some(scale))?;
        assert!(matches!(model.img_in.base(), BaseWeight::Dense(_)));
        assert!(matches!(model.txt_in.base(), BaseWeight::Dense(_)));
        for (path, linear) in model.linears_mut() {
            assert!(
                matches!(linear.base(), BaseWeight::Fp8(_)),
                "{scale:?}: {path} is not FP8"
            );
        }
        assert!(loss.is_finite());
        assert_ne!(loss, dense_loss, "{scale:?}: FP8 changed nothing");
        let r = ((loss - dense_loss) / dense_loss).abs();
        eprintln!("{scale:?}: loss {loss} vs dense {dense_loss} (rel {r:.2e})");
        assert!(r <= 1e-2, "{scale:?}: loss rel {r}");
        // Over all LoRA gradients together (a single small one may move more with quantised weights).
        let (mut diff, mut norm) = (0f64, 0f64);
        for (a, g) in dense_grads.iter().zip(&grads) {
            diff += (g - a)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            norm += a.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
        let r = (diff / norm).sqrt();
        eprintln!("{scale:?}: LoRA gradients rel {r:.2e}");
        assert!(r <= 0.2, "{scale:?}: LoRA gradients rel {r}");
    }
    Ok(())
}
