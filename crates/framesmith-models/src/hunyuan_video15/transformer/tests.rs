//! Parity of the HunyuanVideo 1.5 transformer with diffusers (`tests/fixtures/hunyuan_video15`): RoPE tables,
//! timestep embedding, the refined text, the first block's latent rows, the output, and the gradients of the
//! inputs and of every linear weight of the first block (T2V with diffusers' key names, I2V with the official
//! ones); and the checks failing when a weight is changed or the glyph mask is dropped.

use candle_core::{DType, Device, Tensor, Var};

use super::super::testkit::{diffusers_grad_key, Case};
use super::{HunyuanVideo15Inputs, HunyuanVideo15Transformer};
use crate::fixtures::assert_close;
use framesmith_nn::lora::Lora;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

/// A full-rank identity LoRA on every block linear the fixture has a weight gradient for: ∂L/∂up = ∂L/∂W.
fn identity_loras(
    model: &mut HunyuanVideo15Transformer,
    case: &Case,
) -> anyhow::Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (path, linear) in model.linears_mut() {
        let Some(key) = diffusers_grad_key(&path).filter(|k| case.expected.contains_key(k)) else {
            continue;
        };
        let lora = Lora::identity(
            [linear.in_dim(), linear.out_dim()],
            DType::F32,
            &Device::Cpu,
        )?;
        let up = lora.up.clone();
        linear.set_lora(Some(lora));
        out.push((key, up));
    }
    Ok(out)
}

/// The valid rows of each sample of `xs` [b, l, d] for `lens`, concatenated.
fn valid_rows(xs: &Tensor, lens: &[usize]) -> candle_core::Result<Tensor> {
    let rows = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| xs.get(i)?.narrow(0, 0, n))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&rows, 0)
}

/// The case's forward with its intermediates checked; returns the output and the largest error seen.
fn check_forward(
    case: &Case,
    model: &HunyuanVideo15Transformer,
    inputs: &HunyuanVideo15Inputs,
) -> anyhow::Result<(Tensor, f64)> {
    let prepared = model.prepare(inputs)?;
    let (_, l, _, half) = prepared.blocks.rope.img.cos.dims4()?;
    let first = |t: &Tensor| t.get(0)?.reshape((l, half))?.repeat((1, 1));
    // diffusers repeats each angle for both channels of a pair.
    let pairs = |t: Tensor| -> candle_core::Result<Tensor> {
        t.unsqueeze(2)?.repeat((1, 1, 2))?.reshape((l, 2 * half))
    };
    let rope = &prepared.blocks.rope.img;
    assert_close(
        "rope.cos",
        &pairs(first(&rope.cos)?)?,
        case.expected("rope.cos")?,
        1e-6,
        1e-6,
    )?;
    assert_close(
        "rope.sin",
        &pairs(first(&rope.sin)?)?,
        case.expected("rope.sin")?,
        1e-6,
        1e-6,
    )?;
    let mut worst = 0f64;
    let temb = &prepared.blocks.temb;
    worst = worst.max(assert_close(
        "temb",
        temb,
        case.expected("temb")?,
        ATOL,
        RTOL,
    )?);
    let refined = model
        .txt_in
        .forward(&inputs.txt.states, &inputs.timesteps, &inputs.txt.lens)?;
    worst = worst.max(assert_close(
        "refiner",
        &valid_rows(&refined, &inputs.txt.lens)?,
        &valid_rows(case.expected("refiner")?, &inputs.txt.lens)?,
        ATOL,
        RTOL,
    )?);
    let t = prepared.blocks.txt_len;
    let img_rows = |xs: &Tensor| xs.narrow(1, t, xs.dim(1)? - t);
    worst = worst.max(assert_close(
        "block0.in_img",
        &img_rows(&prepared.xs)?,
        case.expected("block0.in_img")?,
        ATOL,
        RTOL,
    )?);
    let mut xs = prepared.xs.clone();
    for (i, block) in model.double_blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 {
            worst = worst.max(assert_close(
                "block0.img",
                &img_rows(&xs)?,
                case.expected("block0.img")?,
                ATOL,
                RTOL,
            )?);
        }
    }
    let out = model.finish(&xs, &prepared)?;
    worst = worst.max(assert_close(
        "out",
        &out,
        case.expected("out")?,
        ATOL,
        RTOL,
    )?);
    assert_close("forward", &model.forward(inputs)?, &out, 0.0, 0.0)?;
    Ok((out, worst))
}

fn check_case(name: &str) -> anyhow::Result<()> {
    let case = Case::load(name)?;
    let mut model = case.model()?;
    let weight_grads = identity_loras(&mut model, &case)?;
    let base = case.model_inputs()?;
    let latents = Var::from_tensor(&base.latents)?;
    let txt = Var::from_tensor(&base.txt.states)?;
    let byt5_in = base
        .byt5
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no glyph input"))?;
    let byt5 = Var::from_tensor(&byt5_in.states)?;
    let image = Var::from_tensor(case.input("image_embeds")?)?;
    let inputs = HunyuanVideo15Inputs {
        latents: latents.as_tensor().clone(),
        txt: super::TextStates {
            states: txt.as_tensor().clone(),
            lens: base.txt.lens.clone(),
        },
        byt5: Some(super::TextStates {
            states: byt5.as_tensor().clone(),
            lens: byt5_in.lens,
        }),
        image_embeds: Some(image.as_tensor().clone()),
        ..base
    };
    let (out, worst) = check_forward(&case, &model, &inputs)?;

    let loss = (&out * case.input("probe")?)?.sum_all()?;
    let grads = loss.backward()?;
    let mut worst_grad = 0f64;
    let mut vars = vec![
        ("grad.hidden_states", &latents),
        ("grad.txt", &txt),
        ("grad.byt5", &byt5),
    ];
    if case.expected.contains_key("grad.image_embeds") {
        vars.push(("grad.image_embeds", &image));
    }
    let checked: Vec<(String, &Var)> = vars
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(weight_grads.iter().map(|(k, v)| (k.clone(), v)))
        .collect();
    for (key, var) in &checked {
        let got = grads
            .get(var.as_tensor())
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("{name}: no gradient for {key}"))?;
        worst_grad = worst_grad.max(assert_close(key, &got, case.expected(key)?, ATOL, RTOL)?);
    }
    let expected_grads = case
        .expected
        .keys()
        .filter(|k| k.starts_with("grad."))
        .count();
    anyhow::ensure!(
        expected_grads == checked.len(),
        "{name}: {expected_grads} gradients expected, {} checked",
        checked.len()
    );
    eprintln!("{name}: max abs error {worst:.2e} (forward), {worst_grad:.2e} (gradients)");
    Ok(())
}

#[test]
fn text_to_video_with_masks_matches_diffusers() -> anyhow::Result<()> {
    check_case("t2v")
}

#[test]
fn image_to_video_from_official_keys_matches_diffusers() -> anyhow::Result<()> {
    check_case("i2v")
}

#[test]
fn a_perturbed_weight_breaks_parity() -> anyhow::Result<()> {
    let mut case = Case::load("i2v")?;
    let key = "double_blocks.1.txt_attn_k_norm.weight";
    let w = case
        .weights
        .get(key)
        .ok_or_else(|| anyhow::anyhow!("no {key}"))?;
    let bumped = (w * 1.01)?;
    case.weights.insert(key.into(), bumped);
    let out = case.model()?.forward(&case.model_inputs()?)?;
    let err = assert_close("out", &out, case.expected("out")?, ATOL, RTOL);
    anyhow::ensure!(err.is_err(), "a changed weight went unnoticed");
    Ok(())
}

#[test]
fn dropping_the_glyph_mask_breaks_parity() -> anyhow::Result<()> {
    let case = Case::load("t2v")?;
    let model = case.model()?;
    let mut inputs = case.model_inputs()?;
    let glyph = inputs
        .byt5
        .as_mut()
        .ok_or_else(|| anyhow::anyhow!("no glyph input"))?;
    glyph.lens = vec![glyph.states.dim(1)?; glyph.lens.len()];
    let out = model.forward(&inputs)?;
    let err = assert_close("out", &out, case.expected("out")?, ATOL, RTOL);
    anyhow::ensure!(
        err.is_err(),
        "attending to the glyph padding changed nothing"
    );
    Ok(())
}

#[test]
fn bf16_weights_and_inputs_stay_near_the_f32_reference() -> anyhow::Result<()> {
    let case = Case::load("t2v")?;
    let model = HunyuanVideo15Transformer::new(&case.model_config()?, &case.vb(DType::BF16)?)?;
    let f32_inputs = case.model_inputs()?;
    let bf16 = |t: &super::TextStates| -> candle_core::Result<super::TextStates> {
        Ok(super::TextStates {
            states: t.states.to_dtype(DType::BF16)?,
            lens: t.lens.clone(),
        })
    };
    let inputs = HunyuanVideo15Inputs {
        latents: f32_inputs.latents.to_dtype(DType::BF16)?,
        txt: bf16(&f32_inputs.txt)?,
        byt5: f32_inputs.byt5.as_ref().map(bf16).transpose()?,
        image_embeds: None,
        ..f32_inputs
    };
    let out = model.forward(&inputs)?;
    assert_eq!(out.dtype(), DType::BF16);
    let want = case.expected("out")?;
    let diff = (out.to_dtype(DType::F32)? - want)?;
    let norm =
        |t: &Tensor| -> candle_core::Result<f32> { t.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>() };
    let rel = norm(&diff)? / norm(want)?;
    anyhow::ensure!(
        rel < 2e-2,
        "bf16 output is {rel:.3e} away from the f32 reference"
    );
    Ok(())
}
