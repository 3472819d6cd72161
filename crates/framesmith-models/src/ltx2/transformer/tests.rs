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

/// Our video timestep `rows` and ltx-core's per-token `want` as compared: every token's row with per-token
/// timesteps, the first token's (every token shares it) without.
fn video_rows(
    blocks: &super::BlockInputs,
    rows: &Tensor,
    want: &Tensor,
) -> candle_core::Result<(Tensor, Tensor)> {
    match blocks.pick {
        Some(_) => Ok((blocks.per_token(rows)?, want.clone())),
        None => Ok((rows.clone(), first_row(want)?)),
    }
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
    let (got, rows) = video_rows(blocks, &blocks.timestep, want("timestep")?)?;
    check("timestep", &got, &rows)?;
    let (got, rows) = video_rows(blocks, &prepared.embedded, want("embedded_timestep")?)?;
    check("embedded_timestep", &got, &rows)?;
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

/// A joint case's tensors against ltx-core's: both streams' AdaLN rows and the audio-video rows, the RoPE tables
/// (each stream's and the cross-modal ones), the projected texts, the first block's inputs and outputs, both
/// velocities, and the gradients of the probe loss for both latents, both texts and every block-0 linear.
// Every expected tensor of the case, compared in the order the model makes them.
#[allow(clippy::too_many_lines)]
fn check_joint_case(name: &str) -> anyhow::Result<()> {
    let case = testkit::load(name)?;
    let mut model = testkit::model(&case)?;
    let weights = identity_loras(&mut model)?;
    let base = testkit::inputs(&case)?;
    let audio = base
        .audio
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{name} is not a joint case"))?;
    let vars = [
        Var::from_tensor(&base.latents)?,
        Var::from_tensor(&base.context)?,
        Var::from_tensor(&audio.latents)?,
        Var::from_tensor(&audio.context)?,
    ];
    let inputs = super::Ltx2Inputs {
        latents: vars[0].as_tensor().clone(),
        context: vars[1].as_tensor().clone(),
        audio: Some(super::Ltx2AudioInputs {
            latents: vars[2].as_tensor().clone(),
            positions: audio.positions.clone(),
            context: vars[3].as_tensor().clone(),
        }),
        ..base
    };
    let prepared = model.prepare(&inputs)?;
    let blocks = &prepared.blocks;
    let ai = blocks
        .audio
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no audio inputs"))?;
    let want = |k: &str| case.expected(k);
    let mut worst = 0f64;
    let mut check = |k: &str, got: &Tensor, want: &Tensor| -> anyhow::Result<()> {
        worst = worst.max(assert_close(k, got, want, ATOL, RTOL)?);
        Ok(())
    };
    let (got, rows) = video_rows(blocks, &blocks.timestep, want("timestep")?)?;
    check("timestep", &got, &rows)?;
    check(
        "audio.timestep",
        &ai.timestep,
        &first_row(want("audio.timestep")?)?,
    )?;
    let audio_embedded = prepared
        .audio_embedded
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no audio embedding"))?;
    check(
        "audio.embedded_timestep",
        audio_embedded,
        &first_row(want("audio.embedded_timestep")?)?,
    )?;
    if let Some(p) = &ai.prompt_timestep {
        check("audio.prompt_timestep", p, want("audio.prompt_timestep")?)?;
    }
    let key = "cross_scale_shift_timestep";
    let (got, rows) = video_rows(blocks, &ai.video_cross, want(key)?)?;
    check(key, &got, &rows)?;
    let key = "audio.cross_scale_shift_timestep";
    check(key, &ai.audio_cross, &first_row(want(key)?)?)?;
    check(
        "cross_gate_timestep",
        &ai.video_gate,
        want("cross_gate_timestep")?,
    )?;
    check(
        "audio.cross_gate_timestep",
        &ai.audio_gate,
        want("audio.cross_gate_timestep")?,
    )?;
    for (prefix, table) in [
        ("audio.rope", &ai.rope),
        ("cross_rope", &ai.video_cross_rope),
        ("audio.cross_rope", &ai.audio_cross_rope),
    ] {
        let cos = table.cos()?.transpose(1, 2)?;
        assert_close(
            &format!("{prefix}.cos"),
            &cos,
            want(&format!("{prefix}.cos"))?,
            1e-5,
            1e-5,
        )?;
        let sin = table.sin()?.transpose(1, 2)?;
        assert_close(
            &format!("{prefix}.sin"),
            &sin,
            want(&format!("{prefix}.sin"))?,
            1e-5,
            1e-5,
        )?;
    }
    check("context", &blocks.context, want("context")?)?;
    check("audio.context", &ai.context, want("audio.context")?)?;
    let (v0, a0) = ai.unpack(&prepared.xs)?;
    check("block0.in", &v0, want("block0.in")?)?;
    check("audio.block0.in", &a0, want("audio.block0.in")?)?;
    let mut xs = prepared.xs.clone();
    for (i, block) in model.transformer_blocks.iter().enumerate() {
        xs = block.forward(&xs, blocks)?;
        if i == 0 {
            let (v, a) = ai.unpack(&xs)?;
            check("block0.out", &v, want("block0.out")?)?;
            check("audio.block0.out", &a, want("audio.block0.out")?)?;
        }
    }
    let (out, audio_out) = model.finish_streams(&xs, &prepared)?;
    let audio_out = audio_out.ok_or_else(|| anyhow::anyhow!("no audio velocity"))?;
    check("out", &out, want("out")?)?;
    check("audio.out", &audio_out, want("audio.out")?)?;
    let loss = ((&out * case.input("probe")?)?.sum_all()?
        + (&audio_out * case.input("audio_probe")?)?.sum_all()?)?;
    let grads = loss.backward()?;
    let grad = |v: &Var| {
        grads
            .get(v.as_tensor())
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no gradient"))
    };
    for (key, var) in [
        "grad.latent",
        "grad.context",
        "grad.audio_latent",
        "grad.audio_context",
    ]
    .iter()
    .zip(&vars)
    {
        worst = worst.max(assert_close(key, &grad(var)?, want(key)?, ATOL, RTOL)?);
    }
    let expected_weights = case
        .expected
        .keys()
        .filter(|k| k.starts_with("grad.transformer_blocks."))
        .count();
    anyhow::ensure!(
        expected_weights == weights.len(),
        "{name}: {expected_weights} weight gradients expected, {} block-0 linears",
        weights.len()
    );
    for (path, up) in &weights {
        let key = format!("grad.{path}.weight");
        worst = worst.max(assert_close(&key, &grad(up)?, want(&key)?, ATOL, RTOL)?);
    }
    eprintln!("{name}: max abs error {worst:.2e}");
    Ok(())
}

#[test]
fn ltx2_audio_video_matches_ltx_core() -> anyhow::Result<()> {
    check_joint_case("ltx2_av")
}

#[test]
fn ltx23_first_frame_conditioning_matches_ltx_core() -> anyhow::Result<()> {
    // Per-token timesteps: the first sample's first latent frame at timestep 0, the second sample at σ.
    check_case("ltx23_i2v")
}

#[test]
fn ltx2_audio_video_first_frame_conditioning_matches_ltx_core() -> anyhow::Result<()> {
    check_joint_case("ltx2_av_i2v")
}

#[test]
fn no_conditioned_token_is_the_text_to_video_pass_exactly() -> anyhow::Result<()> {
    // All-zero counts take the one-timestep path: bit-identical to giving none.
    for name in ["ltx23_t2v", "ltx2_av"] {
        let case = testkit::load(name)?;
        let model = testkit::model(&case)?;
        let plain = model.forward(&testkit::inputs(&case)?)?;
        let zeros = super::Ltx2Inputs {
            conditioned_tokens: vec![0, 0],
            ..testkit::inputs(&case)?
        };
        assert!(model.prepare(&zeros)?.blocks.pick.is_none(), "{name}");
        let same = model.forward(&zeros)?;
        assert_eq!(framesmith_nn::testing::rel(&plain, &same)?, 0.0, "{name}");
    }
    Ok(())
}

#[test]
fn conditioned_tokens_change_the_velocity_of_their_sample_only() -> anyhow::Result<()> {
    // The reference case run without its conditioning leaves the unconditioned sample's output as it is and
    // moves the conditioned one's away from ltx-core's.
    let case = testkit::load("ltx23_i2v")?;
    let model = testkit::model(&case)?;
    let inputs = super::Ltx2Inputs {
        conditioned_tokens: Vec::new(),
        ..testkit::inputs(&case)?
    };
    let out = model.forward(&inputs)?;
    let want = case.expected("out")?;
    assert!(assert_close("out[0]", &out.get(0)?, &want.get(0)?, ATOL, RTOL).is_err());
    assert_close("out[1]", &out.get(1)?, &want.get(1)?, ATOL, RTOL)?;
    Ok(())
}

#[test]
fn ltx23_audio_video_matches_ltx_core() -> anyhow::Result<()> {
    check_joint_case("ltx23_av")
}

#[test]
fn a_model_read_with_audio_runs_text_to_video_as_before() -> anyhow::Result<()> {
    // The LTX-2.3 T2V fixture's file holds the audio stream too (LTX-2's was made without the audio caption
    // projection); read with it, a batch without audio computes the video stream alone, exactly as the
    // video-only model does.
    let name = "ltx23_t2v";
    let case = testkit::load(name)?;
    let joint =
        Ltx2Transformer::load_av(&testkit::vb(&case, DType::F32), &testkit::config(&case)?)?;
    assert!(joint.has_audio());
    let video_only = testkit::model(&case)?;
    let inputs = testkit::inputs(&case)?;
    let (a, b) = (joint.forward(&inputs)?, video_only.forward(&inputs)?);
    assert_eq!(framesmith_nn::testing::rel(&a, &b)?, 0.0, "{name}");
    assert!(joint.prepare(&inputs)?.blocks.audio.is_none());
    Ok(())
}

#[test]
fn audio_latents_need_the_audio_stream() -> anyhow::Result<()> {
    let case = testkit::load("ltx2_av")?;
    let video_only =
        Ltx2Transformer::load(&testkit::vb(&case, DType::F32), &testkit::config(&case)?)?;
    let message = video_only
        .prepare(&testkit::inputs(&case)?)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(message.contains("without its audio stream"), "{message}");
    Ok(())
}
