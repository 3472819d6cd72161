//! Parity for fixture kind `wan_dit`: forward outputs, block-0 output, the RoPE table, input gradients and the
//! gradient of every block Linear weight, for any case in the fixture format (sizes read from `config.json`).

use anyhow::Context;
use candle_core::{DType, Device, Tensor, Var};

use super::{attach_identity_loras, compare, Fixture, ParityRow, GRAD_REL_TOL, OUTPUT_REL_TOL};
use framesmith_models::wan::{rope, Generation, Timesteps, WanConfig, WanInputs, WanModel};
use framesmith_nn::vb::Vb;

/// The fixture's model configuration (Wan2.1 or Wan2.2, from its `source`), batch and sequence length.
fn fixture_call(fixture: &Fixture) -> anyhow::Result<(WanConfig, usize, usize)> {
    let source = fixture
        .config
        .get("source")
        .and_then(|s| s.as_str())
        .unwrap_or("");
    let generation = if source.contains("Wan2.2") {
        Generation::Wan22
    } else {
        Generation::Wan21
    };
    let cfg = WanConfig::from_json(&fixture.config.to_string(), generation)
        .context("fixture config.json")?;
    let batch = fixture.config["call"]["batch"]
        .as_u64()
        .context("config.json has no call.batch")? as usize;
    let seq_len = fixture.config["call"]["seq_len"]
        .as_u64()
        .context("config.json has no call.seq_len")? as usize;
    Ok((cfg, batch, seq_len))
}

/// The fixture's inputs `{prefix}_0` … `{prefix}_{batch - 1}` as variables (their gradients are compared); `None`
/// when it has none.
fn input_vars(fixture: &Fixture, prefix: &str, batch: usize) -> anyhow::Result<Option<Vec<Var>>> {
    if !fixture.inputs.contains_key(&format!("{prefix}_0")) {
        return Ok(None);
    }
    (0..batch)
        .map(|i| Ok(Var::from_tensor(fixture.input(&format!("{prefix}_{i}"))?)?))
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

/// Runs the DiT of a `wan_dit` fixture and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let dev = Device::Cpu;
    let (cfg, batch, seq_len) = fixture_call(fixture)?;

    let vb = Vb::from_tensors(fixture.weights.clone(), DType::F32, &dev);
    let mut model = WanModel::new(&cfg, vb, &Default::default())?;
    let weight_grads = attach_identity_loras(model.linears_mut(), fixture)?;

    let x_vars = input_vars(fixture, "x", batch)?.context("the fixture has no x_0")?;
    let y_vars = input_vars(fixture, "y", batch)?;
    let context = (0..batch)
        .map(|i| fixture.input(&format!("context_{i}")).cloned())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let inputs = WanInputs {
        latents: x_vars.iter().map(|v| v.as_tensor().clone()).collect(),
        timesteps: timesteps(fixture.input("t")?)?,
        context,
        seq_len: Some(seq_len),
        clip: fixture.inputs.get("clip_fea").cloned(),
        y: y_vars
            .as_ref()
            .map(|v| v.iter().map(|v| v.as_tensor().clone()).collect()),
    };

    let mut rows = Vec::new();
    let prepared = model.prepare(&inputs)?;
    let mut xs = prepared.x.clone();
    for (i, block) in model.blocks().iter().enumerate() {
        xs = block.forward(&xs, &prepared.blocks)?;
        if i == 0 {
            if let Ok(expected) = fixture.expected("block0_out") {
                rows.push(compare("block0_out", &xs, expected, OUTPUT_REL_TOL)?);
            }
        }
    }
    let outs = model.finish(&xs, &prepared)?;
    let mut loss = Tensor::zeros((), DType::F32, &dev)?;
    for (i, out) in outs.iter().enumerate() {
        rows.push(compare(
            &format!("out_{i}"),
            out,
            fixture.expected(&format!("out_{i}"))?,
            OUTPUT_REL_TOL,
        )?);
        if let Ok(probe) = fixture.input(&format!("probe_{i}")) {
            loss = (loss + (out * probe)?.sum_all()?)?;
        }
    }
    if let Ok(expected) = fixture.expected("freqs") {
        rows.push(compare(
            "freqs",
            &rope::freqs_tensor(cfg.head_dim())?,
            expected,
            OUTPUT_REL_TOL,
        )?);
    }

    let grads = loss.backward()?;
    let mut grad_row = |name: &str, var: &Var| -> anyhow::Result<()> {
        if let Some(expected) = fixture.expected.get(name) {
            let got = grads
                .get(var.as_tensor())
                .cloned()
                .map_or_else(|| Tensor::zeros_like(expected), Ok)?;
            rows.push(compare(name, &got, expected, GRAD_REL_TOL)?);
        }
        Ok(())
    };
    for (i, v) in x_vars.iter().enumerate() {
        grad_row(&format!("grad.x_{i}"), v)?;
    }
    for (i, v) in y_vars.iter().flatten().enumerate() {
        grad_row(&format!("grad.y_{i}"), v)?;
    }
    for (path, up) in &weight_grads {
        grad_row(&format!("grad.{path}.weight"), up)?;
    }
    Ok(rows)
}

fn timesteps(t: &Tensor) -> anyhow::Result<Timesteps> {
    let t = t.to_dtype(DType::F64)?;
    Ok(match t.rank() {
        1 => Timesteps::PerSample(t.to_vec1::<f64>()?),
        2 => Timesteps::PerToken(t.to_vec2::<f64>()?),
        r => anyhow::bail!("timestep tensor `t` has rank {r}, expected 1 or 2"),
    })
}
