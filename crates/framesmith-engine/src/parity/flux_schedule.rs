//! Parity for fixture kind `flux_schedule` (the official `sampling.py`): shifted and unshifted timestep
//! schedules with their μ, noise shape, packing, ids, unpacking, and the Euler loop with a fake model
//! (pred = a·img − b·t), for the triples and sizes listed in `config.json`.

use anyhow::Context;
use candle_core::{Device, Tensor};

use super::{compare, Fixture, ParityRow};
use framesmith_models::flux::sampling::{
    denoise, latent_size, prepare, schedule, shift_mu, unpack, Shift,
};

/// Schedules are f32 values and match to about one ulp.
const SCHEDULE_TOL: f64 = 1e-6;

fn usize_of(v: &serde_json::Value, what: &str) -> anyhow::Result<usize> {
    v.as_u64()
        .map(|n| n as usize)
        .with_context(|| format!("config.json: `{what}` is not a number"))
}

/// Runs every function a `flux_schedule` fixture covers and compares every expected tensor.
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let mut rows = Vec::new();
    let specs = fixture.config["schedules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for spec in &specs {
        let (steps, seq) = (
            usize_of(&spec[0], "steps")?,
            usize_of(&spec[1], "image_seq_len")?,
        );
        let shifted = spec[2].as_bool().unwrap_or(false);
        let key = format!(
            "n{steps}_seq{seq}_{}",
            if shifted { "shift" } else { "noshift" }
        );
        let ts = schedule(steps, seq, shifted.then(Shift::default));
        let got = Tensor::new(ts.as_slice(), &Device::Cpu)?;
        rows.push(compare(
            &format!("schedule.{key}"),
            &got,
            fixture.expected(&format!("schedule.{key}"))?,
            SCHEDULE_TOL,
        )?);
        if let Some(mu) = fixture.expected.get(&format!("mu.{key}")) {
            let got = Tensor::new(&[shift_mu(seq, 0.5, 1.15)], &Device::Cpu)?;
            rows.push(compare(&format!("mu.{key}"), &got, mu, 1e-12)?);
        }
    }
    let Ok(noise) = fixture.input("noise") else {
        return Ok(rows);
    };
    let cfg = &fixture.config["noise"];
    let (height, width) = (
        usize_of(&cfg["height"], "noise.height")?,
        usize_of(&cfg["width"], "noise.width")?,
    );
    let [h, w] = latent_size(height, width);
    anyhow::ensure!(
        noise.dims()[2..] == [h, w],
        "noise is {:?}, but a {height}×{width} image has a {h}×{w} latent",
        noise.dims()
    );
    let txt_len = fixture
        .input("txt")
        .and_then(|t| Ok(t.dim(1)?))
        .unwrap_or(0);
    let [packed, img_ids, txt_ids] = prepare(noise, txt_len)?;
    for (name, got) in [
        ("packed", &packed),
        ("img_ids", &img_ids),
        ("txt_ids", &txt_ids),
    ] {
        rows.push(compare(name, got, fixture.expected(name)?, SCHEDULE_TOL)?);
    }
    rows.push(compare(
        "unpacked",
        &unpack(&packed, height, width)?,
        fixture.expected("unpacked")?,
        SCHEDULE_TOL,
    )?);
    rows.extend(check_loop(fixture, &packed)?);
    Ok(rows)
}

/// The official `denoise` with the fixture's fake model, every step's input, time and prediction compared.
fn check_loop(fixture: &Fixture, packed: &Tensor) -> anyhow::Result<Vec<ParityRow>> {
    let lp = &fixture.config["loop"];
    let steps = usize_of(&lp["steps"], "loop.steps")?;
    let (a, b) = (
        lp["a"].as_f64().unwrap_or(0.0),
        lp["b"].as_f64().unwrap_or(0.0),
    );
    let guidance = lp["guidance"].as_f64().unwrap_or(0.0) as f32;
    let shift = lp["shift"].as_bool().unwrap_or(false).then(Shift::default);
    let ts = schedule(steps, packed.dim(1)?, shift);
    let mut rows = vec![compare(
        "loop.timesteps",
        &Tensor::new(ts.as_slice(), &Device::Cpu)?,
        fixture.expected("loop.timesteps")?,
        SCHEDULE_TOL,
    )?];
    let mut seen: Vec<(String, Tensor)> = Vec::new();
    let mut k = 0;
    let out = denoise(packed, &ts, guidance, |img, t, g| {
        let pred = ((img * a)?
            - (t * b)?
                .reshape((t.dim(0)?, 1, 1))?
                .broadcast_as(img.shape())?)?;
        seen.push((format!("loop.img_{k}"), img.clone()));
        seen.push((format!("loop.t_{k}"), t.clone()));
        seen.push((format!("loop.pred_{k}"), pred.clone()));
        if k == 0 {
            seen.push(("loop.guidance".into(), g.clone()));
        }
        k += 1;
        Ok(pred)
    })?;
    seen.push(("loop.out".into(), out));
    for (name, got) in &seen {
        rows.push(compare(name, got, fixture.expected(name)?, SCHEDULE_TOL)?);
    }
    Ok(rows)
}
