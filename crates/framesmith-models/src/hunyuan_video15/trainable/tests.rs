//! HunyuanVideo 1.5 trained as the checkpointed step drives it (embeddings under autograd, blocks by their
//! hand-written backward, head under autograd): the fixture's gradients from diffusers — of the latents, both
//! texts, the image embeds and every linear weight of the first block, via identity LoRAs — for T2V and I2V; a
//! streamed block training exactly as a resident one; and the LoRA targets named as musubi-tuner names them.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, TensorId, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::super::testkit::{diffusers_grad_key, Case};
use super::super::{HunyuanVideo15Inputs, HunyuanVideo15Transformer, Prepared};
use crate::fixtures::assert_close;
use crate::trainable::testing;
use crate::trainable::{attach_model_loras, TrainableModel};
use framesmith_nn::init::randn;
use framesmith_nn::lora::{Lora, LoraSpec};
use framesmith_nn::offload::OffloadOptions;
use framesmith_nn::testing::rel;

/// Gradients of `sum(out · probe)` as the checkpointed step computes them, by tensor id (LoRA factors and the
/// inputs' variables).
fn checkpointed_grads(
    model: &HunyuanVideo15Transformer,
    inputs: &HunyuanVideo15Inputs,
    probe: &Tensor,
) -> anyhow::Result<HashMap<TensorId, Tensor>> {
    let head = |xs: &Tensor, prepared: &Prepared| {
        Ok(Tensor::stack(
            &TrainableModel::finish(model, xs, prepared)?,
            0,
        )?)
    };
    let glyph = inputs.byt5.as_ref().map(|g| &g.states);
    let vars = [
        Some(&inputs.latents),
        Some(&inputs.txt.states),
        glyph,
        inputs.image_embeds.as_ref(),
    ];
    let vars: Vec<&Tensor> = vars.into_iter().flatten().collect();
    testing::checkpointed_grads(model, inputs, head, probe, &vars)
}

/// The case's inputs with the latents, both texts and the image embeds as variables, keyed by the fixture's
/// gradient names.
fn with_input_vars(
    case: &Case,
) -> anyhow::Result<(HunyuanVideo15Inputs, Vec<(&'static str, Var)>)> {
    let mut inputs = case.model_inputs()?;
    let latents = Var::from_tensor(&inputs.latents)?;
    let txt = Var::from_tensor(&inputs.txt.states)?;
    inputs.latents = latents.as_tensor().clone();
    inputs.txt.states = txt.as_tensor().clone();
    let mut vars = vec![("grad.hidden_states", latents), ("grad.txt", txt)];
    if let Some(glyph) = inputs.byt5.as_mut() {
        let var = Var::from_tensor(&glyph.states)?;
        glyph.states = var.as_tensor().clone();
        vars.push(("grad.byt5", var));
    }
    if let Some(image) = inputs.image_embeds.as_mut() {
        let var = Var::from_tensor(image)?;
        *image = var.as_tensor().clone();
        vars.push(("grad.image_embeds", var));
    }
    Ok((inputs, vars))
}

/// The fixture's gradients reached through the hand-written blocks.
fn check_fixture_gradients(name: &str) -> anyhow::Result<()> {
    let case = Case::load(name)?;
    let mut model = case.model()?;
    let mut checked = Vec::new();
    for (path, linear) in model.linears_mut() {
        let Some(key) = diffusers_grad_key(&path).filter(|k| case.expected.contains_key(k)) else {
            continue;
        };
        let lora = Lora::identity(
            [linear.in_dim(), linear.out_dim()],
            DType::F32,
            &Device::Cpu,
        )?;
        checked.push((key, lora.up.clone()));
        linear.set_lora(Some(lora));
    }
    assert_eq!(checked.len(), 14, "every linear of the first block");
    let (inputs, vars) = with_input_vars(&case)?;
    let grads = checkpointed_grads(&model, &inputs, case.input("probe")?)?;
    let mut worst = 0f64;
    let all = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(checked.iter().map(|(k, v)| (k.clone(), v)));
    for (key, var) in all {
        let Some(want) = case.expected.get(&key) else {
            // T2V: the image embeds are zeros and get no gradient in diffusers' record.
            anyhow::ensure!(key == "grad.image_embeds", "{name}: no expected {key}");
            continue;
        };
        let got = grads
            .get(&var.as_tensor().id())
            .ok_or_else(|| anyhow::anyhow!("{name}: no gradient for {key}"))?;
        worst = worst.max(assert_close(&key, got, want, 1e-4, 1e-4)?);
    }
    eprintln!("{name}: hand-written gradients within {worst:.2e} of diffusers'");
    Ok(())
}

#[test]
fn hand_written_gradients_match_diffusers_for_text_to_video() -> anyhow::Result<()> {
    check_fixture_gradients("t2v")
}

#[test]
fn hand_written_gradients_match_diffusers_for_image_to_video() -> anyhow::Result<()> {
    check_fixture_gradients("i2v")
}

/// `model` with LoRAs (random, non-zero `up`, the same for the same model) on every block linear.
fn with_loras(
    mut model: HunyuanVideo15Transformer,
) -> anyhow::Result<(HunyuanVideo15Transformer, Vec<Var>)> {
    let mut vars = Vec::new();
    let rng = &mut StdRng::seed_from_u64(11);
    for (_, linear) in model.linears_mut() {
        let lora = Lora::new(
            [linear.in_dim(), linear.out_dim(), 4],
            8.0,
            DType::F32,
            &Device::Cpu,
            rng,
        )?;
        lora.up
            .set(&randn(rng, lora.up.shape(), 0.0, 0.1, &Device::Cpu)?)?;
        vars.extend([lora.down.clone(), lora.up.clone()]);
        linear.set_lora(Some(lora));
    }
    Ok((model, vars))
}

#[test]
fn a_streamed_block_trains_as_a_resident_one() -> anyhow::Result<()> {
    let case = Case::load("i2v")?;
    let (resident, resident_vars) = with_loras(case.model()?)?;
    let streamed = HunyuanVideo15Transformer::new_streamed(
        &case.model_config()?,
        &case.vb(DType::F32)?,
        &[0],
        &OffloadOptions::default(),
    )?;
    let (streamed, streamed_vars) = with_loras(streamed)?;
    let streamer = streamed
        .streamer()
        .ok_or_else(|| anyhow::anyhow!("no streamer"))?;
    assert!(streamer.is_streamed(0) && !streamer.is_streamed(1));
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

#[test]
fn lora_targets_are_every_double_block_linear_by_its_official_name() -> anyhow::Result<()> {
    let case = Case::load("t2v")?;
    let mut model = case.model()?;
    let spec = LoraSpec {
        rank: 4,
        alpha: 4.0,
        dtype: DType::F32,
        include_patterns: vec![],
        exclude_patterns: vec![],
        seed: 1,
        kind: Default::default(),
    };
    let set = attach_model_loras(&mut model, &spec)?;
    let names: Vec<String> = set.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(names.len(), 2 * 14, "14 linears in each of the 2 blocks");
    for name in [
        "double_blocks.0.img_attn_q",
        "double_blocks.1.txt_mod.linear",
        "double_blocks.1.txt_mlp.fc2",
    ] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
    Ok(())
}
