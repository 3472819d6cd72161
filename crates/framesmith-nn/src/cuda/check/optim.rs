//! Device checks of the in-place AdamW passes (`nn::optim`) against the CPU's.

use candle_core::{DType, Device, Result, Var};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{compare, CheckOutcome};
use crate::init;

/// The in-place AdamW passes against the CPU's, for f32 and bf16 parameters and gradients, with clipping and
/// weight decay: the same roundings, so the same bits (the tolerance only admits a last-place difference).
pub fn optim_checks(dev: &Device) -> Result<Vec<CheckOutcome>> {
    use crate::optim::{adamw_update, AdamWUpdate};
    let rng = &mut StdRng::seed_from_u64(29);
    let mut out = Vec::new();
    let shape = (301, 129);
    for (param_dtype, grad_dtype, grad_scale, decay) in [
        (DType::F32, DType::F32, 1.0, 1.0),
        (DType::F32, DType::BF16, 0.37, 0.999),
        (DType::BF16, DType::F32, 1.0, 0.99),
    ] {
        let p0 = init::randn(&mut *rng, shape, 0.0, 1.0, &Device::Cpu)?.to_dtype(param_dtype)?;
        let g = init::randn(&mut *rng, shape, 0.0, 0.1, &Device::Cpu)?.to_dtype(grad_dtype)?;
        let m0 = init::randn(&mut *rng, shape, 0.0, 0.01, &Device::Cpu)?;
        let v0 = init::randn(&mut *rng, shape, 0.0, 0.01, &Device::Cpu)?.sqr()?;
        let u = AdamWUpdate {
            decay,
            ..AdamWUpdate::at_step(5, 2e-4, (0.9, 0.999), 1e-8, 0.0, grad_scale)
        };
        let on = |d: &Device| -> Result<[Var; 3]> {
            Ok([
                Var::from_tensor(&p0.to_device(d)?)?,
                Var::from_tensor(&m0.to_device(d)?)?,
                Var::from_tensor(&v0.to_device(d)?)?,
            ])
        };
        let [cp, cm, cv] = on(&Device::Cpu)?;
        adamw_update(cp.as_tensor(), &g, cm.as_tensor(), cv.as_tensor(), &u)?;
        let [gp, gm, gv] = on(dev)?;
        adamw_update(
            gp.as_tensor(),
            &g.to_device(dev)?,
            gm.as_tensor(),
            gv.as_tensor(),
            &u,
        )?;
        let name =
            format!("adamw_update {param_dtype:?} param, {grad_dtype:?} grad, clip {grad_scale}");
        out.push(compare(
            format!("{name} param"),
            gp.as_tensor(),
            cp.as_tensor(),
            1e-7,
        )?);
        out.push(compare(
            format!("{name} exp_avg"),
            gm.as_tensor(),
            cm.as_tensor(),
            1e-7,
        )?);
        out.push(compare(
            format!("{name} exp_avg_sq"),
            gv.as_tensor(),
            cv.as_tensor(),
            1e-7,
        )?);
    }
    Ok(out)
}
