//! Parity of the LTX-2 / LTX-2.3 video stream with ltx-core (`tests/fixtures/ltx2`): the AdaLN rows, the
//! embedded timestep, the prompt AdaLN (LTX-2.3), the RoPE tables, the projected text, the first block's input
//! and output, the velocity, and the gradients of the latents, the text and every video linear of the first
//! block; and the checks failing when a weight is changed or the text padding is attended.

use candle_core::{DType, Device, Tensor, Var};

use super::super::testkit;
use super::Ltx2Transformer;
use crate::fixtures::{assert_close, FixtureCase};
use framesmith_nn::lora::Lora;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

/// A full-rank identity LoRA on every linear of the first block: ∂L/∂up = ∂L/∂W.
fn identity_loras(model: &mut Ltx2Transformer) -> anyhow::Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (path, linear) in model.linears_mut() {
        if !path.starts_with("transformer_blocks.0.") {
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

/// The first token's row of a per-token reference tensor [b, tokens, w] as [b, 1, w].
fn first_row(t: &Tensor) -> candle_core::Result<Tensor> {
    t.narrow(1, 0, 1)
}

fn check_case(name: &str) -> anyhow::Result<()> {
    let case = testkit::load(name)?;
    let mut model = testkit::model(&case)?;
    let weights = identity_loras(&mut model)?;
    let base = testkit::inputs(&case)?;
    let latent = Var::from_tensor(&base.latents)?;
    let context = Var::from_tensor(&base.context)?;
    let inputs = super::Ltx2Inputs {
        latents: latent.as_tensor().clone(),
        context: context.as_tensor().clone(),
        ..base
    };
    let prepared = model.prepare(&inputs)?;
    let blocks = &prepared.blocks;
    let want = |k: &str| case.expected(k);
    let mut worst = 0f64;
    let mut check = |k: &str, got: &Tensor, want: &Tensor| -> anyhow::Result<()> {
        worst = worst.max(assert_close(k, got, want, ATOL, RTOL)?);
        Ok(())
    };
    check("timestep", &blocks.timestep, &first_row(want("timestep")?)?)?;
    check(
        "embedded_timestep",
        &prepared.embedded,
        &first_row(want("embedded_timestep")?)?,
    )?;
    if let Some(p) = &blocks.prompt_timestep {
        check("prompt_timestep", p, want("prompt_timestep")?)?;
    }
    // ltx-core's tables are [b, heads, tokens, d/2].
    let rope = &blocks.rope;
    assert_close(
        "rope.cos",
        &rope.cos()?.transpose(1, 2)?,
        want("rope.cos")?,
        1e-5,
        1e-5,
    )?;
    assert_close(
        "rope.sin",
        &rope.sin()?.transpose(1, 2)?,
        want("rope.sin")?,
        1e-5,
        1e-5,
    )?;
    check("context", &blocks.context, want("context")?)?;
    check("block0.in", &prepared.xs, want("block0.in")?)?;
    let mut xs = prepared.xs.clone();
    for (i, block) in model.transformer_blocks.iter().enumerate() {
        xs = block.forward(&xs, blocks)?;
        if i == 0 {
            check("block0.out", &xs, want("block0.out")?)?;
        }
    }
    let out = model.finish(&xs, &prepared)?;
    check("out", &out, want("out")?)?;
    let worst_grad = case.check_probe_gradients(
        name,
        &out,
        &[("grad.latent", &latent), ("grad.context", &context)],
        &weights,
        ((ATOL, RTOL), (ATOL, RTOL)),
    )?;
    eprintln!("{name}: max abs error {worst:.2e} (forward), {worst_grad:.2e} (gradients)");
    Ok(())
}

#[test]
fn ltx2_text_to_video_matches_ltx_core() -> anyhow::Result<()> {
    check_case("ltx2_t2v")
}

#[test]
fn ltx23_text_to_video_from_the_single_file_layout_matches_ltx_core() -> anyhow::Result<()> {
    check_case("ltx23_t2v")
}

fn out_error(
    case: &FixtureCase,
    model: &Ltx2Transformer,
    lens: Option<Vec<usize>>,
) -> anyhow::Result<bool> {
    let inputs = super::Ltx2Inputs {
        context_lens: lens,
        ..testkit::inputs(case)?
    };
    let out = model.forward(&inputs)?;
    Ok(assert_close("out", &out, case.expected("out")?, ATOL, RTOL).is_err())
}

#[test]
fn a_perturbed_weight_breaks_parity() -> anyhow::Result<()> {
    for (name, key) in [
        ("ltx2_t2v", "transformer_blocks.1.attn1.k_norm.weight"),
        (
            "ltx23_t2v",
            "model.diffusion_model.transformer_blocks.1.prompt_scale_shift_table",
        ),
    ] {
        let mut case = testkit::load(name)?;
        let w = case
            .weights
            .get(key)
            .ok_or_else(|| anyhow::anyhow!("no {key}"))?;
        let bumped = (w * 1.01)?;
        case.weights.insert(key.into(), bumped);
        let model = testkit::model(&case)?;
        let lens = testkit::inputs(&case)?.context_lens;
        anyhow::ensure!(
            out_error(&case, &model, lens)?,
            "{name}: a changed {key} went unnoticed"
        );
    }
    Ok(())
}

#[test]
fn attending_to_the_text_padding_breaks_parity() -> anyhow::Result<()> {
    let case = testkit::load("ltx2_t2v")?;
    let model = testkit::model(&case)?;
    anyhow::ensure!(!out_error(
        &case,
        &model,
        testkit::inputs(&case)?.context_lens
    )?);
    anyhow::ensure!(
        out_error(&case, &model, None)?,
        "the padded text changed nothing"
    );
    Ok(())
}

#[test]
fn bf16_weights_and_inputs_stay_near_the_f32_reference() -> anyhow::Result<()> {
    for name in ["ltx2_t2v", "ltx23_t2v"] {
        let case = testkit::load(name)?;
        let model =
            Ltx2Transformer::load(&testkit::vb(&case, DType::BF16), &testkit::config(&case)?)?;
        let f32_inputs = testkit::inputs(&case)?;
        let inputs = super::Ltx2Inputs {
            latents: f32_inputs.latents.to_dtype(DType::BF16)?,
            context: f32_inputs.context.to_dtype(DType::BF16)?,
            ..f32_inputs
        };
        let out = model.forward(&inputs)?;
        assert_eq!(out.dtype(), DType::BF16);
        let r = framesmith_nn::testing::rel(&out.to_dtype(DType::F32)?, case.expected("out")?)?;
        anyhow::ensure!(
            r < 2e-2,
            "{name}: bf16 output is {r:.3e} away from the f32 reference"
        );
    }
    Ok(())
}
