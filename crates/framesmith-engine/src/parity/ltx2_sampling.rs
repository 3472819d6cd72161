//! Parity for fixture kind `ltx2_sampling` (LTX-2's text-to-video sampling against ltx-core's components driven as
//! the official trainer's validation drives them: `bench/reference/ltx2_sampling.py`): `LTX2Scheduler`'s sigmas
//! (the pipelines' call, and the token-count shift for the clip's tokens), step 0's denoised latents for the
//! prompt and the negative prompt and their guided mix (CFG and the rescale), and the tokens after every Euler
//! step, through the same functions `framesmith generate` and samples run ([`crate::family::ltx2::pipeline`]).

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::{compare, Fixture, ParityRow, OUTPUT_REL_TOL};
use crate::family::ltx2::pipeline::{
    denoise_tokens, guide, scheduler_sigmas, Ltx2Prompt, GUIDANCE_RESCALE,
};
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

/// Runs the sampling an `ltx2_sampling` fixture describes and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let cfg = Ltx2Config::from_transformer_json(&fixture.config["init"])
        .context("config.json `init` is not an LTX-2 transformer config")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let model = Ltx2Transformer::load(&vb.pp("model.diffusion_model"), &cfg)?;
    let call = &fixture.config["call"];
    let (steps, f, h, w) = (
        count(fixture, "steps")?,
        count(fixture, "frames")?,
        count(fixture, "height")?,
        count(fixture, "width")?,
    );
    let scale = call["cfg_scale"]
        .as_f64()
        .context("config.json `call.cfg_scale`")?;
    anyhow::ensure!(
        call["rescale_scale"].as_f64() == Some(GUIDANCE_RESCALE),
        "the fixture's rescale is not the official {GUIDANCE_RESCALE}"
    );
    let sigmas = scheduler_sigmas(steps, None);
    let as_tensor = |s: &[f32]| Tensor::from_slice(s, s.len(), &Device::Cpu);
    let mut rows = vec![
        compare(
            "sigmas",
            &as_tensor(&sigmas)?,
            fixture.expected("sigmas")?,
            SIGMA_REL_TOL,
        )?,
        compare(
            "sigmas_tokens",
            &as_tensor(&scheduler_sigmas(steps, Some(f * h * w)))?,
            fixture.expected("sigmas_tokens")?,
            SIGMA_REL_TOL,
        )?,
    ];
    let prompt = Ltx2Prompt {
        text: fixture.input("context")?.clone(),
        negative: Some(fixture.input("negative_context")?.clone()),
    };
    let noise = fixture.input("noise")?.to_dtype(DType::F32)?;
    // Step 0's denoised latents: a step to σ_next = 0 from σ₀ is exactly the denoised latents.
    let denoised_at = |prompt: &Ltx2Prompt| -> anyhow::Result<Tensor> {
        denoise_tokens(
            &model,
            prompt,
            (noise.clone(), [f, h, w]),
            (&[sigmas[0], 0.0], 1.0),
            (DType::F32, &|| false),
        )
    };
    let alone = |text: &Tensor| Ltx2Prompt {
        text: text.clone(),
        negative: None,
    };
    let cond = denoised_at(&alone(&prompt.text))?;
    let uncond = denoised_at(&alone(fixture.input("negative_context")?))?;
    let guided = guide(&cond, &uncond, (scale, GUIDANCE_RESCALE))?;
    for (name, got) in [
        ("denoised.0", &cond),
        ("uncond.0", &uncond),
        ("guided.0", &guided),
    ] {
        rows.push(compare(name, got, fixture.expected(name)?, OUTPUT_REL_TOL)?);
    }
    for k in 1..=steps {
        let got = denoise_tokens(
            &model,
            &prompt,
            (noise.clone(), [f, h, w]),
            (&sigmas[..=k], scale),
            (DType::F32, &|| false),
        )?;
        let name = format!("latent.{k}");
        rows.push(compare(
            &name,
            &got,
            fixture.expected(&name)?,
            OUTPUT_REL_TOL,
        )?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_cases_pass_and_a_perturbed_row_fails;

    #[test]
    fn sampling_matches_ltx_core_and_a_perturbed_reference_fails() -> anyhow::Result<()> {
        assert_cases_pass_and_a_perturbed_row_fails(
            "ltx2",
            &[("sampling_ltx23", 8)],
            ("sampling_ltx23", "latent.3"),
        )
    }
}
