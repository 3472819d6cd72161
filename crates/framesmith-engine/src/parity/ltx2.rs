//! Parity for fixture kind `ltx2_transformer` (the LTX-2 / LTX-2.3 transformer against ltx-core's `LTXModel`):
//! called without audio (`bench/reference/ltx2.py`), the video stream's AdaLN rows, first block output, velocity,
//! and the gradients of the latents, the text and every block linear weight the fixture lists; called with audio
//! (`bench/reference/ltx2_av.py`, the fixture's `call` has `audio_frames`), both streams' of each, both
//! first-block outputs and velocities, and the gradients of both latents and both texts. Per-token timesteps
//! (first-frame conditioning: the inputs' `timesteps` 0 on a sample's leading tokens, its σ on the rest) are run
//! as such, and the video's AdaLN rows compared at every token. Weights in the fixture's layout (ltx-core's
//! names, bare or as the single file stores them).

use anyhow::Context;
use candle_core::{DType, Device, Tensor, Var};

use super::{attach_identity_loras, compare, grad_rows, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::ltx2::{Ltx2AudioInputs, Ltx2Config, Ltx2Inputs, Ltx2Transformer};
use framesmith_nn::vb::Vb;

/// Whether the fixture runs both streams.
fn is_joint(fixture: &Fixture) -> bool {
    fixture.config["call"].get("audio_frames").is_some()
}

/// The model of the fixture, in f32 on the CPU (with its audio stream for a joint fixture).
fn model(fixture: &Fixture) -> anyhow::Result<Ltx2Transformer> {
    let cfg = Ltx2Config::from_transformer_json(&fixture.config["init"])
        .context("config.json `init` is not an LTX-2 transformer config")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let vb = if fixture.config["call"]["layout"] == "single_file" {
        vb.pp("model.diffusion_model")
    } else {
        vb
    };
    Ok(if is_joint(fixture) {
        Ltx2Transformer::load_av(&vb, &cfg)?
    } else {
        Ltx2Transformer::load(&vb, &cfg)?
    })
}

/// Valid text tokens per sample of a 0 / 1 mask [b, len] whose ones come first.
fn lens(mask: &Tensor) -> anyhow::Result<Vec<usize>> {
    let rows = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    rows.iter()
        .map(|row| {
            let n = row.iter().take_while(|&&m| m > 0.5).count();
            anyhow::ensure!(
                row[n..].iter().all(|&m| m <= 0.5),
                "the text mask has padding before valid tokens"
            );
            Ok(n)
        })
        .collect()
}

/// The leading conditioned tokens of each sample of per-token `timesteps` [b, tokens]: those at 0 before the rest,
/// which must all be the sample's σ (empty when no sample has any).
fn conditioned_tokens(timesteps: &Tensor, sigmas: &[f32]) -> anyhow::Result<Vec<usize>> {
    let rows = timesteps.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    anyhow::ensure!(
        rows.len() == sigmas.len(),
        "{} timestep rows for {} sigmas",
        rows.len(),
        sigmas.len()
    );
    let mut out = Vec::with_capacity(rows.len());
    for (row, &sigma) in rows.iter().zip(sigmas) {
        let n = if sigma == 0.0 {
            0
        } else {
            row.iter().take_while(|&&t| t == 0.0).count()
        };
        anyhow::ensure!(
            row[n..].iter().all(|&t| t == sigma),
            "per-token timesteps other than 0 on leading tokens and σ on the rest (first-frame conditioning) are \
             not supported"
        );
        out.push(n);
    }
    if out.iter().all(|&n| n == 0) {
        out.clear();
    }
    Ok(out)
}

/// Runs the transformer of an `ltx2_transformer` fixture and compares every expected tensor.
// One fixture's rows, compared in the order the model makes them (both streams of a joint fixture).
#[allow(clippy::too_many_lines)]
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let mut model = model(fixture)?;
    let weight_grads = attach_identity_loras(model.linears_mut(), fixture)?;
    let var = |name: &str| -> anyhow::Result<Var> { Ok(Var::from_tensor(fixture.input(name)?)?) };
    let (latent, context) = (var("latent")?, var("context")?);
    let joint = is_joint(fixture);
    let audio_vars = if joint {
        Some((var("audio_latent")?, var("audio_context")?))
    } else {
        None
    };
    let audio = match &audio_vars {
        Some((l, c)) => Some(Ltx2AudioInputs {
            latents: l.as_tensor().clone(),
            positions: fixture.input("audio_positions")?.clone(),
            context: c.as_tensor().clone(),
        }),
        None => None,
    };
    let sigmas = fixture.input("sigma")?.to_vec1::<f32>()?;
    let conditioned = conditioned_tokens(fixture.input("timesteps")?, &sigmas)?;
    let inputs = Ltx2Inputs {
        latents: latent.as_tensor().clone(),
        sigmas,
        positions: fixture.input("positions")?.clone(),
        context: context.as_tensor().clone(),
        context_lens: Some(lens(fixture.input("context_mask")?)?),
        audio,
        conditioned_tokens: conditioned,
    };
    let mut rows = Vec::new();
    let prepared = model.prepare(&inputs)?;
    let first_token =
        |key: &str| -> anyhow::Result<Tensor> { Ok(fixture.expected(key)?.narrow(1, 0, 1)?) };
    // The video's rows: at every token with per-token timesteps, else the first token's (all tokens share it).
    let blocks = &prepared.blocks;
    let video_rows = |key: &str, rows: &Tensor| -> anyhow::Result<ParityRow> {
        match blocks.pick {
            Some(_) => compare(
                key,
                &blocks.per_token(rows)?,
                fixture.expected(key)?,
                OUTPUT_REL_TOL,
            ),
            None => compare(key, rows, &first_token(key)?, OUTPUT_REL_TOL),
        }
    };
    rows.push(video_rows("timestep", &blocks.timestep)?);
    if let Some(ai) = &prepared.blocks.audio {
        rows.push(video_rows("cross_scale_shift_timestep", &ai.video_cross)?);
        for (key, got) in [
            ("audio.timestep", &ai.timestep),
            ("audio.cross_scale_shift_timestep", &ai.audio_cross),
        ] {
            rows.push(compare(key, got, &first_token(key)?, OUTPUT_REL_TOL)?);
        }
        for (key, got) in [
            ("cross_gate_timestep", &ai.video_gate),
            ("audio.cross_gate_timestep", &ai.audio_gate),
        ] {
            rows.push(compare(key, got, fixture.expected(key)?, OUTPUT_REL_TOL)?);
        }
    }
    let mut xs = prepared.xs.clone();
    for (i, block) in model.transformer_blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i != 0 {
            continue;
        }
        match &prepared.blocks.audio {
            Some(ai) => {
                let (v, a) = ai.unpack(&xs)?;
                rows.push(compare(
                    "block0.out",
                    &v,
                    fixture.expected("block0.out")?,
                    OUTPUT_REL_TOL,
                )?);
                let want = fixture.expected("audio.block0.out")?;
                rows.push(compare("audio.block0.out", &a, want, OUTPUT_REL_TOL)?);
            }
            None => rows.push(compare(
                "block0.out",
                &xs,
                fixture.expected("block0.out")?,
                OUTPUT_REL_TOL,
            )?),
        }
    }
    let (out, audio_out) = model.finish_streams(&xs, &prepared)?;
    rows.push(compare(
        "out",
        &out,
        fixture.expected("out")?,
        OUTPUT_REL_TOL,
    )?);
    let mut loss = (&out * fixture.input("probe")?)?.sum_all()?;
    if let Some(a) = &audio_out {
        rows.push(compare(
            "audio.out",
            a,
            fixture.expected("audio.out")?,
            OUTPUT_REL_TOL,
        )?);
        loss = (loss + (a * fixture.input("audio_probe")?)?.sum_all()?)?;
    }
    let grads = loss.backward()?;
    let mut all: Vec<(String, &Var)> = vec![
        ("grad.latent".into(), &latent),
        ("grad.context".into(), &context),
    ];
    if let Some((l, c)) = &audio_vars {
        all.extend([
            ("grad.audio_latent".to_string(), l),
            ("grad.audio_context".to_string(), c),
        ]);
    }
    all.extend(
        weight_grads
            .iter()
            .map(|(path, v)| (format!("grad.{path}.weight"), v)),
    );
    rows.extend(grad_rows(fixture, &grads, all)?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_cases_pass_and_a_perturbed_row_fails;

    #[test]
    fn both_releases_pass_and_a_perturbed_output_fails() -> anyhow::Result<()> {
        // timestep, block0.out, out, two input gradients and 10 (LTX-2) or 12 (LTX-2.3) weight gradients; joint:
        // 6 AdaLN rows, 2 block outputs, 2 velocities, 4 input gradients and 28 (LTX-2) or 34 (LTX-2.3) weight
        // gradients (both streams' linears and both audio-video cross-attentions').
        assert_cases_pass_and_a_perturbed_row_fails(
            "ltx2",
            &[
                ("ltx2_t2v", 15),
                ("ltx23_t2v", 17),
                ("ltx2_av", 42),
                ("ltx23_av", 48),
                ("ltx23_i2v", 17),
                ("ltx2_av_i2v", 42),
            ],
            ("ltx23_t2v", "out"),
        )
    }

    #[test]
    fn a_perturbed_first_frame_conditioned_case_fails() -> anyhow::Result<()> {
        // The per-token AdaLN rows and the velocity of a conditioned case.
        assert_cases_pass_and_a_perturbed_row_fails("ltx2", &[], ("ltx23_i2v", "timestep"))?;
        assert_cases_pass_and_a_perturbed_row_fails("ltx2", &[], ("ltx2_av_i2v", "out"))
    }

    #[test]
    fn a_perturbed_audio_velocity_fails() -> anyhow::Result<()> {
        assert_cases_pass_and_a_perturbed_row_fails("ltx2", &[], ("ltx2_av", "audio.out"))
    }
}
