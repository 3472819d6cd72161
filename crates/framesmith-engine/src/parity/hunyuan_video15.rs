//! Parity for fixture kind `hunyuan_video15_transformer` (the HunyuanVideo 1.5 transformer against diffusers'
//! `HunyuanVideo15Transformer3DModel`, `bench/reference/hunyuan_video15.py`): the timestep embedding, the first
//! block's latent rows, the output, and the gradients of the inputs and of every block linear weight the fixture
//! lists; weights in the fixture's `layout` (diffusers or official names).

use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device, Var};

use super::{compare, grad_rows, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::hunyuan_video15::layout::{diffusers_block_path, KeyLayout, LayoutSource};
use framesmith_models::hunyuan_video15::transformer::TextStates;
use framesmith_models::hunyuan_video15::{
    HunyuanVideo15Config, HunyuanVideo15Inputs, HunyuanVideo15Transformer,
};
use framesmith_nn::lora::Lora;
use framesmith_nn::vb::Vb;

/// The model of the fixture, in f32 on the CPU.
fn model(fixture: &Fixture) -> anyhow::Result<HunyuanVideo15Transformer> {
    let mut cfg = HunyuanVideo15Config::from_json(&fixture.config["init"].to_string())
        .context("config.json `init` is not HunyuanVideo15Transformer3DModel's arguments")?;
    if let Some(hidden) = fixture.config["byt5_hidden"].as_u64() {
        cfg.byt5_hidden_dim = hidden as usize;
    }
    let layout = match fixture.config["layout"].as_str() {
        Some("official") => KeyLayout::Official,
        Some("comfyui") => KeyLayout::ComfyUi,
        _ => KeyLayout::Diffusers,
    };
    let source = LayoutSource::new(Arc::new(fixture.weights.clone()), layout);
    let vb = Vb::from_source(Arc::new(source), DType::F32, &Device::Cpu);
    Ok(HunyuanVideo15Transformer::new(&cfg, &vb)?)
}

/// An identity LoRA on every block linear whose weight gradient the fixture holds (diffusers' names); returns
/// each gradient's key with its `up`.
fn identity_loras(
    model: &mut HunyuanVideo15Transformer,
    fixture: &Fixture,
) -> anyhow::Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (path, linear) in model.linears_mut() {
        let Some(key) = diffusers_block_path(&path).map(|p| format!("grad.{p}.weight")) else {
            continue;
        };
        if fixture.expected.contains_key(&key) {
            let dims = [linear.in_dim(), linear.out_dim()];
            let lora = Lora::identity(dims, DType::F32, &Device::Cpu)?;
            out.push((key, lora.up.clone()));
            linear.set_lora(Some(lora));
        }
    }
    Ok(out)
}

/// Runs the transformer of a `hunyuan_video15_transformer` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let mut model = model(fixture)?;
    let weight_grads = identity_loras(&mut model, fixture)?;
    let var = |name: &str| -> anyhow::Result<Var> { Ok(Var::from_tensor(fixture.input(name)?)?) };
    let (latents, txt, byt5, image) = (
        var("hidden_states")?,
        var("txt")?,
        var("byt5")?,
        var("image_embeds")?,
    );
    let inputs = HunyuanVideo15Inputs {
        latents: latents.as_tensor().clone(),
        timesteps: fixture.input("timesteps")?.clone(),
        txt: TextStates::from_mask(txt.as_tensor().clone(), fixture.input("txt_mask")?)?,
        byt5: Some(TextStates::from_mask(
            byt5.as_tensor().clone(),
            fixture.input("byt5_mask")?,
        )?),
        image_embeds: Some(image.as_tensor().clone()),
    };
    let mut rows = Vec::new();
    let prepared = model.prepare(&inputs)?;
    rows.push(compare(
        "temb",
        &prepared.blocks.temb,
        fixture.expected("temb")?,
        OUTPUT_REL_TOL,
    )?);
    let t = prepared.blocks.txt_len;
    let mut xs = prepared.xs.clone();
    for (i, block) in model.double_blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 {
            let img = xs.narrow(1, t, xs.dim(1)? - t)?;
            rows.push(compare(
                "block0.img",
                &img,
                fixture.expected("block0.img")?,
                OUTPUT_REL_TOL,
            )?);
        }
    }
    let out = model.finish(&xs, &prepared)?;
    rows.push(compare(
        "out",
        &out,
        fixture.expected("out")?,
        OUTPUT_REL_TOL,
    )?);
    let grads = (&out * fixture.input("probe")?)?.sum_all()?.backward()?;
    let inputs = [
        ("grad.hidden_states", &latents),
        ("grad.txt", &txt),
        ("grad.byt5", &byt5),
        ("grad.image_embeds", &image),
    ];
    let all = inputs
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .chain(weight_grads.iter().map(|(k, v)| (k.clone(), v)));
    rows.extend(grad_rows(fixture, &grads, all)?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_cases_pass_and_a_perturbed_row_fails;

    #[test]
    fn both_cases_pass_and_a_perturbed_output_fails() -> anyhow::Result<()> {
        assert_cases_pass_and_a_perturbed_row_fails(
            "hunyuan_video15",
            &[("t2v", 20), ("i2v", 21)],
            ("i2v", "out"),
        )
    }
}
