//! Parity of the flow-matching schedulers (`flow_unipc`, `flow_dpmpp` fixtures): schedules for every
//! `[steps, shift]` pair and a sampling loop driven by the fixture's affine fake model.

use anyhow::{bail, Context};
use candle_core::{DType, Tensor};
use serde_json::Value;

use super::{compare, compare_exact, Fixture, ParityRow, OUTPUT_REL_TOL};
use crate::generate::sampler::{
    retrieve_timesteps, sampling_sigmas, FlowDpmSolverScheduler, FlowScheduler, FlowUniPcScheduler,
    SchedulerConfig,
};

/// Which official scheduler class and which sampling path a fixture exercises (the fixtures' names for what
/// generation calls a [`Solver`](crate::generate::sampler::Solver)).
#[derive(Clone, Copy)]
enum OfficialScheduler {
    /// `FlowUniPCMultistepScheduler` with `set_timesteps(steps, shift=shift)`.
    UniPc,
    /// `FlowDPMSolverMultistepScheduler` with `get_sampling_sigmas` + `retrieve_timesteps`.
    DpmPp,
}

fn number(v: &Value, what: &str) -> anyhow::Result<f64> {
    v.as_f64()
        .with_context(|| format!("fixture config: `{what}` is not a number"))
}

fn config_number(config: &Value, path: &[&str]) -> anyhow::Result<f64> {
    let mut v = config;
    for key in path {
        v = v
            .get(key)
            .with_context(|| format!("fixture config: missing `{}`", path.join(".")))?;
    }
    number(v, &path.join("."))
}

/// The `n<steps>_shift<shift>` key suffix, the shift written without a trailing `.0`.
fn schedule_key(steps: usize, shift: f64) -> String {
    if shift.fract() == 0.0 {
        format!("n{steps}_shift{}", shift as i64)
    } else {
        format!("n{steps}_shift{shift}")
    }
}

fn scheduler_config(config: &Value) -> anyhow::Result<SchedulerConfig> {
    let init = config
        .get("init")
        .context("fixture config: missing `init`")?;
    if init.get("use_dynamic_shifting").and_then(Value::as_bool) == Some(true) {
        bail!("fixture config: dynamic shifting is not supported");
    }
    let mut cfg = SchedulerConfig::default();
    if let Some(n) = init.get("num_train_timesteps") {
        cfg.num_train_timesteps = number(n, "init.num_train_timesteps")? as usize;
    }
    if let Some(s) = init.get("shift") {
        cfg.shift = number(s, "init.shift")?;
    }
    if let Some(o) = init.get("solver_order") {
        cfg.solver_order = number(o, "init.solver_order")? as usize;
    }
    Ok(cfg)
}

/// A fresh scheduler set up for `steps` and `shift` along the official sampling path of `solver`.
fn scheduler(
    solver: OfficialScheduler,
    cfg: &SchedulerConfig,
    steps: usize,
    shift: f64,
) -> candle_core::Result<Box<dyn FlowScheduler>> {
    match solver {
        OfficialScheduler::UniPc => {
            let mut s = FlowUniPcScheduler::new(cfg.clone());
            s.set_timesteps(steps, shift)?;
            Ok(Box::new(s))
        }
        OfficialScheduler::DpmPp => {
            let mut s = FlowDpmSolverScheduler::new(cfg.clone());
            retrieve_timesteps(&mut s, &sampling_sigmas(steps, shift))?;
            Ok(Box::new(s))
        }
    }
}

fn schedule_rows(
    fixture: &Fixture,
    name: &str,
    sched: &dyn FlowScheduler,
) -> anyhow::Result<Vec<ParityRow>> {
    let sigmas = Tensor::new(sched.sigmas(), &candle_core::Device::Cpu)?;
    Ok(vec![
        compare_exact(
            &format!("timesteps.{name}"),
            sched.timesteps(),
            fixture.expected(&format!("timesteps.{name}"))?,
        )?,
        compare(
            &format!("sigmas.{name}"),
            &sigmas,
            fixture.expected(&format!("sigmas.{name}"))?,
            OUTPUT_REL_TOL,
        )?,
    ])
}

/// Compares the fixture's schedules and sampling loop (`kind` `flow_unipc` or `flow_dpmpp`).
pub fn check(fixture: &Fixture) -> anyhow::Result<Vec<ParityRow>> {
    let solver = match fixture.kind() {
        "flow_unipc" => OfficialScheduler::UniPc,
        "flow_dpmpp" => OfficialScheduler::DpmPp,
        other => bail!("not a scheduler fixture: kind `{other}`"),
    };
    let cfg = scheduler_config(&fixture.config)?;
    let mut rows = Vec::new();
    let schedules = fixture
        .config
        .get("schedules")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for pair in &schedules {
        let (steps, shift) = match pair.as_array().map(Vec::as_slice) {
            Some([n, s]) => (
                number(n, "schedules[i][0]")? as usize,
                number(s, "schedules[i][1]")?,
            ),
            _ => bail!("fixture config: `schedules` entries must be [steps, shift]"),
        };
        let sched = scheduler(solver, &cfg, steps, shift)?;
        rows.extend(schedule_rows(
            fixture,
            &schedule_key(steps, shift),
            sched.as_ref(),
        )?);
    }
    if fixture.config.get("loop").is_some() {
        rows.extend(loop_rows(fixture, solver, &cfg)?);
    }
    Ok(rows)
}

/// The sampling loop: `model_out = a·x − b·t`, then `x = step(model_out, t, x)`, compared at every step.
fn loop_rows(
    fixture: &Fixture,
    solver: OfficialScheduler,
    cfg: &SchedulerConfig,
) -> anyhow::Result<Vec<ParityRow>> {
    let c = &fixture.config;
    let steps = config_number(c, &["loop", "steps"])? as usize;
    let shift = config_number(c, &["loop", "shift"])?;
    let a = config_number(c, &["loop", "a"])?;
    let b = config_number(c, &["loop", "b"])?;
    let mut sched = scheduler(solver, cfg, steps, shift)?;
    let mut rows = Vec::new();
    let sigmas = Tensor::new(sched.sigmas(), &candle_core::Device::Cpu)?;
    rows.push(compare_exact(
        "loop.timesteps",
        sched.timesteps(),
        fixture.expected("loop.timesteps")?,
    )?);
    rows.push(compare(
        "loop.sigmas",
        &sigmas,
        fixture.expected("loop.sigmas")?,
        OUTPUT_REL_TOL,
    )?);
    let mut x = fixture.input("x0")?.to_dtype(DType::F32)?;
    let timesteps = sched.timesteps().to_vec();
    for (k, &t) in timesteps.iter().enumerate() {
        let model_out = ((&x * a)? - b * f64::from(t as f32))?;
        let name = format!("model_out_{k}");
        if let Some(expected) = fixture.expected.get(&name) {
            rows.push(compare(&name, &model_out, expected, OUTPUT_REL_TOL)?);
        }
        // The official call adds a batch dimension; the schedulers are shape-agnostic.
        x = sched
            .step(&model_out.unsqueeze(0)?, t, &x.unsqueeze(0)?)?
            .squeeze(0)?;
        rows.push(compare(
            &format!("step_{k}"),
            &x,
            fixture.expected(&format!("step_{k}"))?,
            OUTPUT_REL_TOL,
        )?);
    }
    Ok(rows)
}

/// Checks a fixture case and asserts every row passed, printing the rows.
#[cfg(test)]
pub(crate) fn assert_case_passes(case: &str) -> anyhow::Result<Vec<ParityRow>> {
    let rows = super::check_fixture(&framesmith_models::fixtures::wan_case(case))?;
    for row in &rows {
        println!("{row}");
    }
    assert!(!rows.is_empty(), "{case}: no rows");
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.name.as_str())
        .collect();
    assert!(failed.is_empty(), "{case}: failed rows {failed:?}");
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(case: &str) -> anyhow::Result<()> {
        let rows = assert_case_passes(case)?;
        assert!(
            rows.iter().any(|r| r.name.starts_with("step_")),
            "{case}: no loop rows"
        );
        Ok(())
    }

    #[test]
    fn schedule_keys_drop_trailing_zero() {
        assert_eq!(schedule_key(50, 5.0), "n50_shift5");
        assert_eq!(schedule_key(20, 12.0), "n20_shift12");
        assert_eq!(schedule_key(8, 3.5), "n8_shift3.5");
    }

    #[test]
    fn flow_unipc_schedule_fixture() -> anyhow::Result<()> {
        run("flow_unipc_schedule")
    }

    #[test]
    fn flow_dpmpp_schedule_fixture() -> anyhow::Result<()> {
        run("flow_dpmpp_schedule")
    }
}
