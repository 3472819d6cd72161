//! Parity for fixture kind `ltx2_transformer` (the LTX-2 / LTX-2.3 transformer's video stream against ltx-core's
//! `LTXModel` called without audio, `bench/reference/ltx2.py`): the AdaLN rows, the first block's output, the
//! velocity, and the gradients of the latents, the text and every block linear weight the fixture lists; weights
//! in the fixture's layout (ltx-core's names, bare or as the single file stores them).

use anyhow::Context;
use candle_core::{DType, Device, Tensor, Var};

use super::{attach_identity_loras, compare, grad_rows, Fixture, ParityRow, OUTPUT_REL_TOL};
use framesmith_models::ltx2::{Ltx2Config, Ltx2Inputs, Ltx2Transformer};
use framesmith_nn::vb::Vb;

/// The model of the fixture, in f32 on the CPU.
fn model(fixture: &Fixture) -> anyhow::Result<Ltx2Transformer> {
    let cfg = Ltx2Config::from_transformer_json(&fixture.config["init"])
        .context("config.json `init` is not an LTX-2 transformer config")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &Device::Cpu);
    let vb = if fixture.config["call"]["layout"] == "single_file" {
        vb.pp("model.diffusion_model")
    } else {
        vb
    };
    Ok(Ltx2Transformer::load(&vb, &cfg)?)
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

/// Runs the transformer of an `ltx2_transformer` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let mut model = model(fixture)?;
    let weight_grads = attach_identity_loras(model.linears_mut(), fixture)?;
    let latent = Var::from_tensor(fixture.input("latent")?)?;
    let context = Var::from_tensor(fixture.input("context")?)?;
    let inputs = Ltx2Inputs {
        latents: latent.as_tensor().clone(),
        sigmas: fixture.input("sigma")?.to_vec1::<f32>()?,
        positions: fixture.input("positions")?.clone(),
        context: context.as_tensor().clone(),
        context_lens: Some(lens(fixture.input("context_mask")?)?),
    };
    let mut rows = Vec::new();
    let prepared = model.prepare(&inputs)?;
    let first_token = fixture.expected("timestep")?.narrow(1, 0, 1)?;
    rows.push(compare(
        "timestep",
        &prepared.blocks.timestep,
        &first_token,
        OUTPUT_REL_TOL,
    )?);
    let mut xs = prepared.xs.clone();
    for (i, block) in model.transformer_blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 {
            rows.push(compare(
                "block0.out",
                &xs,
                fixture.expected("block0.out")?,
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
    let all = [("grad.latent", &latent), ("grad.context", &context)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(
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
        // timestep, block0.out, out, two input gradients and 10 (LTX-2) or 12 (LTX-2.3) weight gradients.
        assert_cases_pass_and_a_perturbed_row_fails(
            "ltx2",
            &[("ltx2_t2v", 15), ("ltx23_t2v", 17)],
            ("ltx23_t2v", "out"),
        )
    }
}
