//! The hand-written backward of the Qwen-Image blocks against candle's autograd, with a LoRA on every linear: each
//! block alone (also after recomputes that reuse kept values), and the whole model driven as the checkpointed step
//! drives it (embeddings under autograd, blocks by hand, head under autograd); and the fixture's weight gradients
//! from diffusers reached through the hand-written blocks, via identity LoRAs.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, TensorId, Var};

use crate::fixtures::assert_close;
use crate::qwen_image::testkit::Case;
use crate::qwen_image::{Prepared, QwenImageInputs, QwenImageTransformer};
use crate::trainable::testing;
use crate::trainable::TrainableModel;
use framesmith_nn::lora::Lora;
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::testing::rel;
use framesmith_nn::vb::Vb;

/// The fixture's model with LoRAs (random, non-zero `up`, multiplier ≠ 1) on every block linear.
fn model_with_loras(case: &Case) -> anyhow::Result<(QwenImageTransformer, Vec<Var>)> {
    with_loras(case.model()?)
}

/// `model` with LoRAs (random, non-zero `up`, multiplier ≠ 1, the same for the same model) on every block linear.
fn with_loras(mut model: QwenImageTransformer) -> anyhow::Result<(QwenImageTransformer, Vec<Var>)> {
    let vars = testing::random_loras(&mut model)?;
    Ok((model, vars))
}

/// Every block both ways: output, input gradient and every LoRA gradient against candle's autograd (a block keeps
/// its four gated branches' outputs).
fn check_blocks(case_name: &str) -> anyhow::Result<()> {
    let case = Case::load(case_name)?;
    let (model, vars) = model_with_loras(&case)?;
    testing::check_blocks(&model, &case.model_inputs()?, &vars, &|_| 4)
}

#[test]
fn hand_written_block_backward_matches_autograd_with_a_text_mask() -> anyhow::Result<()> {
    check_blocks("t2i")
}

#[test]
fn hand_written_block_backward_matches_autograd_with_two_images() -> anyhow::Result<()> {
    check_blocks("edit")
}

/// Gradients of `sum(out · probe)` the way the checkpointed step computes them: the embeddings under autograd,
/// then the blocks without a graph, the head under autograd on the last block's detached output, the blocks'
/// hand-written backward from their saved inputs, and the embeddings' backward from the first block's input
/// gradient. Returns the gradients by tensor id (LoRA factors and the inputs' variables).
fn checkpointed_grads(
    model: &QwenImageTransformer,
    inputs: &QwenImageInputs,
    probe: &Tensor,
) -> anyhow::Result<HashMap<TensorId, Tensor>> {
    let head = |xs: &Tensor, prepared: &Prepared| {
        // A training step's head keeps the target image's rows only (the loss never covers a conditioning
        // image) …
        let target = TrainableModel::finish(model, xs, prepared)?;
        assert_eq!(target[0].dim(0)?, inputs.img_grids[0].tokens());
        // … the official head every image row, as the fixtures' probe does.
        Ok(QwenImageTransformer::finish(model, xs, prepared)?)
    };
    testing::checkpointed_grads(model, inputs, head, probe, &[&inputs.img, &inputs.txt])
}

/// `inputs` with `img` and `txt` as variables, so their gradients are reported.
fn with_input_vars(inputs: QwenImageInputs) -> anyhow::Result<(QwenImageInputs, [Var; 2])> {
    let img = Var::from_tensor(&inputs.img)?;
    let txt = Var::from_tensor(&inputs.txt)?;
    let inputs = QwenImageInputs {
        img: img.as_tensor().clone(),
        txt: txt.as_tensor().clone(),
        ..inputs
    };
    Ok((inputs, [img, txt]))
}

#[test]
fn the_checkpointed_model_gradients_match_autograd() -> anyhow::Result<()> {
    let case = Case::load("t2i")?;
    let (model, vars) = model_with_loras(&case)?;
    let (inputs, input_vars) = with_input_vars(case.model_inputs()?)?;
    let probe = case.input("probe")?;
    let reference = (model.forward(&inputs)? * probe)?.sum_all()?.backward()?;
    let ours = checkpointed_grads(&model, &inputs, probe)?;
    for var in vars.iter().chain(&input_vars) {
        let t = var.as_tensor();
        let want = reference
            .get(t)
            .ok_or_else(|| anyhow::anyhow!("no reference gradient"))?;
        let got = ours
            .get(&t.id())
            .ok_or_else(|| anyhow::anyhow!("no hand-written gradient for a {:?}", t.dims()))?;
        let r = rel(got, want)?;
        assert!(r <= 1e-5, "gradient of a {:?}: rel {r}", t.dims());
    }
    Ok(())
}

#[test]
fn a_streamed_block_trains_as_a_resident_one() -> anyhow::Result<()> {
    let case = Case::load("edit")?;
    let (resident, resident_vars) = model_with_loras(&case)?;
    let vb = Vb::from_tensors(case.weights.clone(), DType::F32, &Device::Cpu);
    let streamed = QwenImageTransformer::new_streamed(
        &case.model_config()?,
        &vb,
        &[1],
        &OffloadOptions::default(),
    )?;
    let (streamed, streamed_vars) = with_loras(streamed)?;
    let streamer = streamed
        .streamer()
        .ok_or_else(|| anyhow::anyhow!("no streamer"))?;
    assert!(streamer.is_streamed(1) && !streamer.is_streamed(0));
    let inputs = case.model_inputs()?;
    let probe = case.input("probe")?;
    assert_eq!(
        rel(&streamed.forward(&inputs)?, &resident.forward(&inputs)?)?,
        0.0
    );
    let want = checkpointed_grads(&resident, &inputs, probe)?;
    let got = checkpointed_grads(&streamed, &inputs, probe)?;
    for (a, b) in streamed_vars.iter().zip(&resident_vars) {
        let pick = |grads: &HashMap<TensorId, Tensor>, v: &Var| {
            grads
                .get(&v.as_tensor().id())
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("no gradient"))
        };
        assert_eq!(rel(&pick(&got, a)?, &pick(&want, b)?)?, 0.0);
    }
    Ok(())
}

/// The fixture's gradients of the inputs and of the first block's linear weights (diffusers', in PyTorch),
/// reached through the hand-written blocks: identity LoRAs make ∂L/∂up equal ∂L/∂W.
fn check_fixture_gradients(name: &str) -> anyhow::Result<()> {
    let case = Case::load(name)?;
    let mut model = case.model()?;
    let mut ups = Vec::new();
    for (path, linear) in model.linears_mut() {
        if !case.expected.contains_key(&format!("grad.{path}.weight")) {
            continue;
        }
        let dims = [linear.in_dim(), linear.out_dim()];
        let lora = Lora::identity(dims, DType::F32, &Device::Cpu)?;
        ups.push((path, lora.up.clone()));
        linear.set_lora(Some(lora));
    }
    assert_eq!(ups.len(), 14, "every linear of the first block");
    let (inputs, [img, txt]) = with_input_vars(case.model_inputs()?)?;
    let grads = checkpointed_grads(&model, &inputs, case.input("probe")?)?;
    let get = |var: &Var| -> anyhow::Result<&Tensor> {
        grads
            .get(&var.as_tensor().id())
            .ok_or_else(|| anyhow::anyhow!("no gradient"))
    };
    let mut worst = 0f64;
    for (key, var) in [("grad.img", &img), ("grad.txt", &txt)] {
        worst = worst.max(assert_close(
            key,
            get(var)?,
            case.expected(key)?,
            1e-4,
            1e-4,
        )?);
    }
    for (path, up) in &ups {
        let key = format!("grad.{path}.weight");
        worst = worst.max(assert_close(
            &key,
            get(up)?,
            case.expected(&key)?,
            1e-4,
            1e-4,
        )?);
    }
    eprintln!("{name}: hand-written gradients within {worst:.2e} of diffusers'");
    Ok(())
}

#[test]
fn hand_written_gradients_match_diffusers_with_a_text_mask() -> anyhow::Result<()> {
    check_fixture_gradients("t2i")
}

#[test]
fn hand_written_gradients_match_diffusers_with_two_images() -> anyhow::Result<()> {
    check_fixture_gradients("edit")
}
