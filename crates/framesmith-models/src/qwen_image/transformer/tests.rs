//! Parity of the Qwen-Image transformer with diffusers (`tests/fixtures/qwen_image`): RoPE tables, timestep
//! embedding, the first block's inputs and outputs, the output, and the gradients of the inputs and of every
//! linear weight of the first block; and the checks failing when the text mask is dropped or a weight is changed.

use candle_core::{DType, Device, Tensor, Var};

use super::txt_lens_from_mask;
use crate::fixtures::assert_close;
use crate::qwen_image::rope::RopeTable;
use crate::qwen_image::testkit::Case;
use crate::qwen_image::{QwenImageInputs, QwenImageTransformer};
use framesmith_nn::lora::Lora;
use framesmith_nn::vb::Vb;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

/// A full-rank LoRA whose `down` is the identity (scale 1, `up` = 0) on every linear the fixture has a weight
/// gradient for: ∂L/∂up = ∂L/∂W, while the frozen base stays off candle's autograd path.
fn identity_loras(
    model: &mut QwenImageTransformer,
    case: &Case,
) -> anyhow::Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (path, linear) in model.linears_mut() {
        if !case.expected.contains_key(&format!("grad.{path}.weight")) {
            continue;
        }
        let lora = Lora::identity(
            [linear.in_dim(), linear.out_dim()],
            DType::F32,
            &Device::Cpu,
        )?;
        let up = lora.up.clone();
        linear.set_lora(Some(lora));
        out.push((path, up));
    }
    Ok(out)
}

/// One stream's table as diffusers keeps it: [seq_len, head_dim / 2] (the same for every sample).
fn official_table(table: &RopeTable) -> anyhow::Result<(Tensor, Tensor)> {
    let (_, l, _, half) = table.cos.dims4()?;
    let first = |t: &Tensor| t.get(0)?.reshape((l, half));
    Ok((first(&table.cos)?, first(&table.sin)?))
}

/// Runs the case's forward pass with every intermediate checked; returns the output and the largest error seen.
fn check_forward(
    case: &Case,
    model: &QwenImageTransformer,
    inputs: &QwenImageInputs,
) -> anyhow::Result<(Tensor, f64)> {
    let prepared = model.prepare(inputs)?;
    let rope = &prepared.blocks.rope;
    let mut worst = 0f64;
    for (stream, table) in [("img", &rope.img), ("txt", &rope.txt)] {
        let (cos, sin) = official_table(table)?;
        let key = |part: &str| format!("rope.{stream}_{part}");
        assert_close(&key("cos"), &cos, case.expected(&key("cos"))?, 1e-6, 1e-6)?;
        assert_close(&key("sin"), &sin, case.expected(&key("sin"))?, 1e-6, 1e-6)?;
    }
    let temb = &prepared.blocks.temb;
    worst = worst.max(assert_close(
        "temb",
        temb,
        case.expected("temb")?,
        ATOL,
        RTOL,
    )?);

    let t = prepared.blocks.txt_len;
    let split = |xs: &Tensor| -> candle_core::Result<(Tensor, Tensor)> {
        Ok((xs.narrow(1, t, xs.dim(1)? - t)?, xs.narrow(1, 0, t)?))
    };
    let (img, txt) = split(&prepared.xs)?;
    worst = worst.max(assert_close(
        "block0.in_img",
        &img,
        case.expected("block0.in_img")?,
        ATOL,
        RTOL,
    )?);
    worst = worst.max(assert_close(
        "block0.in_txt",
        &txt,
        case.expected("block0.in_txt")?,
        ATOL,
        RTOL,
    )?);

    let mut xs = prepared.xs.clone();
    for (i, block) in model.transformer_blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 {
            let (img, txt) = split(&xs)?;
            worst = worst.max(assert_close(
                "block0.img",
                &img,
                case.expected("block0.img")?,
                ATOL,
                RTOL,
            )?);
            worst = worst.max(assert_close(
                "block0.txt",
                &txt,
                case.expected("block0.txt")?,
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
    anyhow::ensure!(
        !weight_grads.is_empty(),
        "{name}: no weight gradients matched"
    );

    let img = Var::from_tensor(case.input("img")?)?;
    let txt = Var::from_tensor(case.input("txt")?)?;
    let inputs = QwenImageInputs {
        img: img.as_tensor().clone(),
        txt: txt.as_tensor().clone(),
        ..case.model_inputs()?
    };
    let (out, worst) = check_forward(&case, &model, &inputs)?;

    let inputs = [("grad.img", &img), ("grad.txt", &txt)];
    let tols = ((ATOL, RTOL), (ATOL, RTOL));
    let worst_grad = case.check_probe_gradients(name, &out, &inputs, &weight_grads, tols)?;
    eprintln!("{name}: max abs error {worst:.2e} (forward), {worst_grad:.2e} (gradients)");
    Ok(())
}

#[test]
fn text_to_image_with_a_text_mask_matches_diffusers() -> anyhow::Result<()> {
    check_case("t2i")
}

#[test]
fn edit_style_second_image_matches_diffusers() -> anyhow::Result<()> {
    check_case("edit")
}

#[test]
fn dropping_the_text_mask_breaks_parity() -> anyhow::Result<()> {
    let case = Case::load("t2i")?;
    let model = case.model()?;
    let mut inputs = case.model_inputs()?;
    anyhow::ensure!(inputs.txt_lens.is_some(), "t2i has a text mask");
    inputs.txt_lens = None;
    let out = model.forward(&inputs)?;
    // The first sample has no padding: it is unchanged. The second attends to its padding now.
    assert_close(
        "out[0]",
        &out.get(0)?,
        &case.expected("out")?.get(0)?,
        ATOL,
        RTOL,
    )?;
    let err = assert_close(
        "out[1]",
        &out.get(1)?,
        &case.expected("out")?.get(1)?,
        ATOL,
        RTOL,
    );
    anyhow::ensure!(err.is_err(), "ignoring the mask changed nothing");
    Ok(())
}

#[test]
fn a_perturbed_weight_breaks_parity() -> anyhow::Result<()> {
    let mut case = Case::load("edit")?;
    let key = "transformer_blocks.1.attn.norm_added_k.weight";
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
fn bf16_weights_and_inputs_stay_near_the_f32_reference() -> anyhow::Result<()> {
    let case = Case::load("t2i")?;
    let vb = Vb::from_tensors(case.weights.clone(), DType::BF16, &Device::Cpu);
    let model = QwenImageTransformer::new(&case.model_config()?, &vb)?;
    let f32_inputs = case.model_inputs()?;
    let inputs = QwenImageInputs {
        img: f32_inputs.img.to_dtype(DType::BF16)?,
        txt: f32_inputs.txt.to_dtype(DType::BF16)?,
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

#[test]
fn masks_become_lengths_only_when_padding_comes_last() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let mask = Tensor::new(&[[1i64, 1, 1], [1, 0, 0]], &dev)?;
    assert_eq!(txt_lens_from_mask(&mask)?, vec![3, 1]);
    let holes = Tensor::new(&[[1u8, 0, 1]], &dev)?;
    let err = txt_lens_from_mask(&holes)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("sample 0"), "{err}");
    Ok(())
}
