//! Parity for fixture kind `ltx2_sampling` (LTX-2's text-to-video sampling against ltx-core's components driven as
//! the official trainer's validation drives them: `bench/reference/ltx2_sampling.py`): `LTX2Scheduler`'s sigmas
//! (the pipelines' call, and the token-count shift for the clip's tokens), step 0's denoised latents for the
//! prompt and the negative prompt and their guided mix (CFG and the rescale), and the tokens after every Euler
//! step, through the same functions `framesmith generate` and samples run ([`crate::family::ltx2::pipeline`],
//! [`crate::family::ltx2::denoise`]). A joint case (`call.audio_frames`) denoises the audio stream with the video
//! (its own noise, contexts and guidance, `audio_*` tensors); an image-to-video case (input `first_frame`, the clean
//! first-frame tokens) keeps them clean at timestep 0.

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use crate::family::ltx2::denoise::{denoise_tokens, ClipTokens, Guidance, Ltx2Context, Ltx2Prompt};
use crate::family::ltx2::pipeline::{guide, scheduler_sigmas, GUIDANCE_RESCALE};
use framesmith_models::ltx2::{Ltx2Config, Ltx2Transformer};
use framesmith_nn::vb::Vb;

/// Relative tolerance for the sigmas (float32 arithmetic replayed step for step).
const SIGMA_REL_TOL: f64 = 1e-6;

/// A `call` field as a count.
fn count(fixture: &Fixture, key: &str) -> anyhow::Result<usize> {
    fixture.config["call"][key]
        .as_u64()
        .map(|v| v as usize)
        .with_context(|| format!("config.json `call.{key}` is not a count"))
}

/// The fixture's text context `name` of both streams (`audio_{name}` too for a joint case).
fn context(fixture: &Fixture, name: &str, joint: bool) -> anyhow::Result<Ltx2Context> {
    Ok(Ltx2Context {
        video: fixture.input(name)?.clone(),
        audio: if joint {
            Some(fixture.input(&format!("audio_{name}"))?.clone())
        } else {
            None
        },
    })
}

/// The tokens the fixture starts from: its noise (with the clean first frame in front for image-to-video), and
/// for a joint case the audio noise.
fn start_of(fixture: &Fixture, latent: [usize; 3], joint: bool) -> anyhow::Result<ClipTokens> {
    let f32_input =
        |name: &str| -> anyhow::Result<Tensor> { Ok(fixture.input(name)?.to_dtype(DType::F32)?) };
    let first_frame = fixture
        .inputs
        .contains_key("first_frame")
        .then(|| f32_input("first_frame"))
        .transpose()?;
    let mut video = f32_input("noise")?;
    if let Some(lead) = &first_frame {
        let (n, all) = (lead.dim(1)?, video.dim(1)?);
        video = Tensor::cat(&[lead, &video.narrow(1, n, all - n)?], 1)?;
    }
    Ok(ClipTokens {
        video,
        latent,
        audio: joint.then(|| f32_input("audio_noise")).transpose()?,
        first_frame,
    })
}

/// The scheduler's sigmas for `steps` (the pipelines' call, and for `tokens`) against the fixture's.
fn sigma_rows(fixture: &Fixture, steps: usize, tokens: usize) -> anyhow::Result<Vec<ParityRow>> {
    let as_tensor = |s: &[f32]| Tensor::from_slice(s, s.len(), &Device::Cpu);
    Ok(vec![
        compare(
            "sigmas",
            &as_tensor(&scheduler_sigmas(steps, None))?,
            fixture.expected("sigmas")?,
            SIGMA_REL_TOL,
        )?,
        compare(
            "sigmas_tokens",
            &as_tensor(&scheduler_sigmas(steps, Some(tokens)))?,
            fixture.expected("sigmas_tokens")?,
            SIGMA_REL_TOL,
        )?,
    ])
}

/// The guidance of the fixture's call: the video's, and the audio's for a joint case.
fn guidance_of(fixture: &Fixture, joint: bool) -> anyhow::Result<Guidance> {
    let call = &fixture.config["call"];
    let scale = |key: &str| {
        call[key]
            .as_f64()
            .with_context(|| format!("config.json `call.{key}`"))
    };
    anyhow::ensure!(
        call["rescale_scale"].as_f64() == Some(GUIDANCE_RESCALE),
        "the fixture's rescale is not the official {GUIDANCE_RESCALE}"
    );
    Ok(Guidance {
        video: scale("cfg_scale")?,
        audio: if joint {
            scale("audio_cfg_scale")?
        } else {
            1.0
        },
    })
}

/// Runs the sampling an `ltx2_sampling` fixture describes and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = Ltx2Config::from_transformer_json(&fixture.config["init"])
        .context("config.json `init` is not an LTX-2 transformer config")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let joint = fixture.config["call"].get("audio_frames").is_some();
    let vb = vb.pp("model.diffusion_model");
    let model = if joint {
        Ltx2Transformer::load_av(&vb, &cfg)?
    } else {
        Ltx2Transformer::load(&vb, &cfg)?
    };
    let (steps, f, h, w) = (
        count(fixture, "steps")?,
        count(fixture, "frames")?,
        count(fixture, "height")?,
        count(fixture, "width")?,
    );
    let guidance = guidance_of(fixture, joint)?;
    let mut rows = sigma_rows(fixture, steps, f * h * w)?;
    let sigmas = scheduler_sigmas(steps, None);
    let prompt = Ltx2Prompt {
        text: context(fixture, "context", joint)?,
        negative: Some(context(fixture, "negative_context", joint)?),
    };
    let start = start_of(fixture, [f, h, w], joint)?;
    let run = |prompt: &Ltx2Prompt, sigmas: &[f32]| {
        denoise_tokens(
            &model,
            prompt,
            start.clone(),
            (sigmas, guidance),
            (DType::F32, &|| false),
        )
    };
    // Step 0's denoised latents: a step to σ_next = 0 from σ₀ is exactly the denoised latents.
    let alone = |text: &Ltx2Context| Ltx2Prompt {
        text: text.clone(),
        negative: None,
    };
    let cond = run(&alone(&prompt.text), &[sigmas[0], 0.0])?;
    let uncond = run(
        &context(fixture, "negative_context", joint).map(|c| alone(&c))?,
        &[sigmas[0], 0.0],
    )?;
    let mut got = vec![
        ("denoised.0".to_string(), cond.video.clone()),
        ("uncond.0".to_string(), uncond.video.clone()),
        (
            "guided.0".to_string(),
            guide(
                &cond.video,
                &uncond.video,
                (guidance.video, GUIDANCE_RESCALE),
            )?,
        ),
    ];
    if let (Some(c), Some(u)) = (&cond.audio, &uncond.audio) {
        got.push(("audio_denoised.0".into(), c.clone()));
        got.push(("audio_uncond.0".into(), u.clone()));
        got.push((
            "audio_guided.0".into(),
            guide(c, u, (guidance.audio, GUIDANCE_RESCALE))?,
        ));
    }
    for k in 1..=steps {
        let out = run(&prompt, &sigmas[..=k])?;
        got.push((format!("latent.{k}"), out.video));
        if let Some(audio) = out.audio {
            got.push((format!("audio_latent.{k}"), audio));
        }
    }
    for (name, t) in &got {
        rows.push(compare(name, t, fixture.expected(name)?, OUTPUT_REL_TOL)?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_cases_pass_and_a_perturbed_row_fails, failed_when_bumped};

    /// Text-to-video (8 rows), and both streams from a first frame (8 + the audio's 3 at step 0 and 3 latents).
    #[test]
    fn sampling_matches_ltx_core_and_a_perturbed_reference_fails() -> anyhow::Result<()> {
        assert_cases_pass_and_a_perturbed_row_fails(
            "ltx2",
            &[("sampling_ltx23", 8), ("sampling_ltx23_av_i2v", 14)],
            ("sampling_ltx23", "latent.3"),
        )?;
        let av = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../framesmith-models/tests/fixtures/ltx2/sampling_ltx23_av_i2v");
        let files = ["config.json", "weights.safetensors", "inputs.safetensors"];
        for row in ["audio_latent.3", "latent.2"] {
            assert_eq!(failed_when_bumped(&av, &files, row)?, vec![row.to_string()]);
        }
        Ok(())
    }
}
