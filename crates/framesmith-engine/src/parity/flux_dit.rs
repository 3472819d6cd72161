//! Parity for fixture kind `flux_dit` (FLUX.1 dev / schnell / Kontext DiT): the RoPE table, the conditioning
//! vector, the first double- and single-stream block outputs, the output, and the gradients of the inputs and of
//! every Linear weight the fixture lists; sizes read from `config.json`.

use anyhow::Context;
use candle_core::{DType, Device, Tensor, Var};

use super::{attach_identity_loras, compare, Fixture, ParityRow, GRAD_REL_TOL, OUTPUT_REL_TOL};
use framesmith_models::flux::{Flux, FluxConfig, FluxInputs};
use framesmith_nn::vb::Vb;

/// Runs the DiT of a `flux_dit` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let dev = Device::Cpu;
    let cfg = FluxConfig::from_json(&fixture.config["init"].to_string())
        .context("config.json `init` is not FluxParams")?;
    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &dev);
    let mut model = Flux::new(&cfg, &vb)?;
    let weight_grads = attach_all_identity_loras(&mut model, fixture)?;

    let img = Var::from_tensor(fixture.input("img")?)?;
    let txt = Var::from_tensor(fixture.input("txt")?)?;
    let inputs = FluxInputs {
        img: img.as_tensor().clone(),
        img_ids: fixture.input("img_ids")?.clone(),
        txt: txt.as_tensor().clone(),
        txt_ids: fixture.input("txt_ids")?.clone(),
        timesteps: fixture.input("timesteps")?.clone(),
        y: fixture.input("y")?.clone(),
        guidance: fixture.inputs.get("guidance").cloned(),
    };
    let mut rows = Vec::new();
    let mut row = |name: &str, got: &Tensor, tol: f64| -> anyhow::Result<()> {
        if let Some(expected) = fixture.expected.get(name) {
            rows.push(compare(name, got, expected, tol)?);
        }
        Ok(())
    };
    let prepared = model.prepare(&inputs)?;
    row(
        "pe",
        &prepared.blocks.rope.official_layout()?,
        OUTPUT_REL_TOL,
    )?;
    row("vec", &prepared.blocks.vec, OUTPUT_REL_TOL)?;
    let t = prepared.blocks.txt_len;
    let mut xs = prepared.xs.clone();
    for (i, block) in model.blocks.iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 && cfg.depth > 0 {
            row("double_block0_txt", &xs.narrow(1, 0, t)?, OUTPUT_REL_TOL)?;
            row(
                "double_block0_img",
                &xs.narrow(1, t, xs.dim(1)? - t)?,
                OUTPUT_REL_TOL,
            )?;
        }
        if i == cfg.depth {
            row("single_block0_out", &xs, OUTPUT_REL_TOL)?;
        }
    }
    let out = model.finish(&xs, &prepared)?;
    row("out", &out, OUTPUT_REL_TOL)?;

    let Ok(probe) = fixture.input("probe") else {
        return Ok(rows);
    };
    let grads = (&out * probe)?.sum_all()?.backward()?;
    let mut grad_row = |name: &str, var: &Var| -> anyhow::Result<()> {
        let got = grads
            .get(var.as_tensor())
            .cloned()
            .map_or_else(|| var.as_tensor().zeros_like(), Ok)?;
        row(name, &got, GRAD_REL_TOL)
    };
    grad_row("grad.img", &img)?;
    grad_row("grad.txt", &txt)?;
    for (path, up) in &weight_grads {
        grad_row(&format!("grad.{path}.weight"), up)?;
    }
    Ok(rows)
}

/// [`attach_identity_loras`] on the DiT, checked to cover every weight gradient the fixture holds.
fn attach_all_identity_loras(
    model: &mut Flux,
    fixture: &Fixture,
) -> anyhow::Result<Vec<(String, Var)>> {
    let out = attach_identity_loras(model.linears_mut(), fixture)?;
    let listed = fixture
        .expected
        .keys()
        .filter(|k| k.starts_with("grad.") && k.ends_with(".weight"))
        .count();
    anyhow::ensure!(
        listed == out.len(),
        "the fixture has {listed} weight gradients, the model matched {} of them",
        out.len()
    );
    Ok(out)
}
