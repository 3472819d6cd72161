//! AdamW over candle `Var`s (the LoRA weights) with f32 moments, exactly as `torch.optim.AdamW` (decoupled weight
//! decay, bias correction), plus gradient clipping by global norm and a state export/import as named tensors so a
//! resumed run continues bit-exactly.

use std::collections::HashMap;

use candle_core::{bail, DType, Device, Result, Tensor, Var};
use framesmith_nn::optim::{adamw_update_all, sums_of_squares, AdamWTensors, AdamWUpdate};

use framesmith_config::training::AdamWConfig;

/// Added to the norm before dividing, as `torch.nn.utils.clip_grad_norm_` does.
const CLIP_EPS: f64 = 1e-6;

/// Name of the step-count tensor in an exported state.
pub const STEP_KEY: &str = "step";

/// What one `AdamW::step` did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOutcome {
    /// The parameters were updated.
    Applied {
        /// Global L2 norm of the gradients before clipping.
        grad_norm: f64,
        /// Factor the gradients were multiplied by (1 when not clipped).
        clip_scale: f64,
    },
    /// A gradient was NaN or infinite: parameters, moments and the step count are untouched.
    Skipped { grad_norm: f64 },
}

/// A parameter and its moments. The moments are updated in place (`Var::set`), like the parameter: the same
/// device buffers every step, so the optimizer does not leave its state scattered through the memory pool between
/// the step's transient allocations (which grew the pool's reserved memory step after step).
struct Slot {
    name: String,
    var: Var,
    exp_avg: Var,
    exp_avg_sq: Var,
}

/// AdamW over named trainable variables.
pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    step: u64,
}

impl AdamW {
    /// An optimizer over `params` (name, variable), with zero moments and step 0. Names must be unique: they key
    /// the exported state.
    pub fn new(params: Vec<(String, Var)>, cfg: AdamWConfig) -> Result<Self> {
        let mut slots = Vec::with_capacity(params.len());
        let mut seen = std::collections::HashSet::new();
        for (name, var) in params {
            if !seen.insert(name.clone()) {
                bail!("AdamW: parameter name `{name}` appears twice");
            }
            let zeros = || Var::zeros(var.shape(), DType::F32, var.device());
            slots.push(Slot {
                name,
                exp_avg: zeros()?,
                exp_avg_sq: zeros()?,
                var,
            });
        }
        Ok(Self {
            cfg,
            slots,
            step: 0,
        })
    }

    /// Updates completed so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// The optimized variables, in order.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.slots.iter().map(|s| (s.name.as_str(), &s.var))
    }

    /// One update with learning rate `lr`; `grads[i]` belongs to the i-th parameter. Computes the global gradient
    /// norm first: when it is not finite nothing changes and `Skipped` is returned; otherwise the gradients are
    /// clipped to `max_grad_norm` and torch.optim.AdamW's update is applied.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<StepOutcome> {
        if grads.len() != self.slots.len() {
            bail!(
                "AdamW: {} gradients for {} parameters",
                grads.len(),
                self.slots.len()
            );
        }
        let grad_norm = global_grad_norm(grads)?;
        if !grad_norm.is_finite() {
            return Ok(StepOutcome::Skipped { grad_norm });
        }
        let clip_scale = clip_scale(grad_norm, self.cfg.max_grad_norm);
        let step = self.step + 1;
        // Scalars as torch computes them: Python floats (f64), cast to f32 inside the kernels.
        let update = AdamWUpdate::at_step(
            step,
            lr,
            (self.cfg.beta1, self.cfg.beta2),
            self.cfg.eps,
            self.cfg.weight_decay,
            clip_scale,
        );
        let items: Vec<_> = self
            .slots
            .iter()
            .zip(grads)
            .map(|(slot, grad)| AdamWTensors {
                param: slot.var.as_tensor(),
                grad,
                exp_avg: slot.exp_avg.as_tensor(),
                exp_avg_sq: slot.exp_avg_sq.as_tensor(),
            })
            .collect();
        adamw_update_all(&items, &update)?;
        self.step = step;
        Ok(StepOutcome::Applied {
            grad_norm,
            clip_scale,
        })
    }

    /// The state as named tensors: `{name}.exp_avg`, `{name}.exp_avg_sq` (f32) per parameter and `step`
    /// (one i64), copied to the CPU (the moments change in place at the next step). Parameters themselves are
    /// saved with the LoRA.
    pub fn export_state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(2 * self.slots.len() + 1);
        let step = i64::try_from(self.step).unwrap_or(i64::MAX);
        out.push((STEP_KEY.to_string(), Tensor::new(&[step], &Device::Cpu)?));
        for slot in &self.slots {
            for (suffix, moment) in [("exp_avg", &slot.exp_avg), ("exp_avg_sq", &slot.exp_avg_sq)] {
                let host = moment.as_tensor().to_device(&Device::Cpu)?;
                // On the CPU `to_device` shares the buffer: copy it, so the export never changes later.
                let host = if moment.device().is_cpu() {
                    host.copy()?
                } else {
                    host
                };
                out.push((format!("{}.{suffix}", slot.name), host));
            }
        }
        Ok(out)
    }

    /// Restores a state written by `export_state` (moments are moved to each parameter's device). Every parameter
    /// must be present with its shape; nothing changes when anything is missing or wrong.
    pub fn import_state(&mut self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        let step = match tensors.get(STEP_KEY) {
            Some(t) => match t
                .to_dtype(DType::I64)?
                .flatten_all()?
                .to_vec1::<i64>()?
                .as_slice()
            {
                [step] if *step >= 0 => *step as u64,
                _ => bail!("optimizer state: `{STEP_KEY}` must hold one non-negative count"),
            },
            None => bail!("optimizer state: `{STEP_KEY}` is missing"),
        };
        let mut moments = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            let load = |suffix: &str| -> Result<Tensor> {
                let key = format!("{}.{suffix}", slot.name);
                let Some(t) = tensors.get(&key) else {
                    bail!("optimizer state: `{key}` is missing")
                };
                if t.shape() != slot.var.shape() || t.dtype() != DType::F32 {
                    bail!(
                        "optimizer state: `{key}` is {:?} {:?}, expected {:?} F32",
                        t.shape(),
                        t.dtype(),
                        slot.var.shape()
                    );
                }
                t.to_device(slot.var.device())
            };
            moments.push((load("exp_avg")?, load("exp_avg_sq")?));
        }
        for (slot, (exp_avg, exp_avg_sq)) in self.slots.iter_mut().zip(moments) {
            slot.exp_avg.set(&exp_avg)?;
            slot.exp_avg_sq.set(&exp_avg_sq)?;
        }
        self.step = step;
        Ok(())
    }
}

/// The factor `torch.nn.utils.clip_grad_norm_` multiplies by: max_norm / (norm + 1e-6), when that is below 1.
fn clip_scale(grad_norm: f64, max_grad_norm: Option<f64>) -> f64 {
    match max_grad_norm {
        Some(max) if max > 0.0 => (max / (grad_norm + CLIP_EPS)).min(1.0),
        _ => 1.0,
    }
}

/// Global L2 norm of all gradients (accumulated in f64 over per-tensor f32 sums of squares, computed together and
/// read in one host transfer). NaN or infinity when any gradient holds one.
pub fn global_grad_norm(grads: &[Tensor]) -> Result<f64> {
    let total: f64 = sums_of_squares(grads)?.iter().map(|&s| f64::from(s)).sum();
    Ok(total.sqrt())
}

/// Clips gradients to a global L2 norm as `torch.nn.utils.clip_grad_norm_`: returns the (possibly scaled)
/// gradients and the norm before clipping. Non-finite norms leave the gradients as they are.
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> Result<(Vec<Tensor>, f64)> {
    let norm = global_grad_norm(grads)?;
    let scale = if norm.is_finite() {
        clip_scale(norm, Some(max_norm))
    } else {
        1.0
    };
    let clipped = if scale == 1.0 {
        grads.to_vec()
    } else {
        grads
            .iter()
            .map(|g| (g * scale)?.to_dtype(g.dtype()))
            .collect::<Result<Vec<_>>>()?
    };
    Ok((clipped, norm))
}

// Tests may unwrap (STYLE.md: no unwrap outside tests); the crate-wide lint does not know about tests.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const P0: [f32; 6] = [0.5, -1.0, 2.0, 0.0, 0.25, -0.75];
    const GRADS: [[f32; 6]; 3] = [
        [0.1, -0.2, 0.3, -0.4, 0.5, 0.0],
        [-0.05, 0.1, 0.2, 0.3, -0.1, 0.01],
        [0.2, 0.2, -0.1, 0.0, 0.05, -0.3],
    ];
    const LRS: [f64; 3] = [1e-2, 5e-3, 2e-3];

    fn cfg() -> AdamWConfig {
        AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default()
        }
    }

    fn param(values: &[f32]) -> Var {
        let t = Tensor::from_slice(values, (2, 3), &Device::Cpu).unwrap();
        Var::from_tensor(&t).unwrap()
    }

    fn grad(values: &[f32]) -> Tensor {
        Tensor::from_slice(values, (2, 3), &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    fn assert_close(got: &[f32], expected: &[f64], what: &str) {
        for (i, (g, w)) in got.iter().zip(expected).enumerate() {
            let tol = 2e-6 * w.abs().max(1e-3);
            assert!((f64::from(*g) - w).abs() <= tol, "{what}[{i}]: {g} vs {w}");
        }
    }

    fn slot_values(opt: &AdamW) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let s = &opt.slots[0];
        (
            values(s.var.as_tensor()),
            values(s.exp_avg.as_tensor()),
            values(s.exp_avg_sq.as_tensor()),
        )
    }

    #[test]
    fn first_step_moves_each_weight_by_lr() {
        // Step 1: m̂ = g and v̂ = g², so p1 = p0·(1 − lr·wd) − lr·g / (|g| + eps).
        let var = param(&P0);
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], cfg()).unwrap();
        opt.step(&[grad(&GRADS[0])], 1e-2).unwrap();
        let expected: Vec<f64> = P0
            .iter()
            .zip(GRADS[0])
            .map(|(&p, g)| {
                let (p, g) = (f64::from(p), f64::from(g));
                p * (1.0 - 1e-3) - 1e-2 * g / (g.abs() + 1e-8)
            })
            .collect();
        assert_close(&values(var.as_tensor()), &expected, "p1");
        assert_eq!(opt.step_count(), 1);
    }

    #[test]
    fn three_steps_match_torch_adamw() {
        // Expected values: torch.optim.AdamW's single-tensor algorithm replayed in float32 with numpy.
        let var = param(&P0);
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], cfg()).unwrap();
        for (g, lr) in GRADS.iter().zip(LRS) {
            let out = opt.step(&[grad(g)], lr).unwrap();
            assert!(matches!(out, StepOutcome::Applied { clip_scale, .. } if clip_scale == 1.0));
        }
        let (p, m, v) = slot_values(&opt);
        assert_close(
            &p,
            &[
                0.486509770154953,
                -0.987521767616272,
                1.980654001235962,
                0.010577634908258915,
                0.23611649870872498,
                -0.7512069940567017,
            ],
            "param",
        );
        assert_close(
            &m,
            &[
                0.023600002750754356,
                0.012799999676644802,
                0.03230000287294388,
                -0.00540000107139349,
                0.0364999994635582,
                -0.029100000858306885,
            ],
            "exp_avg",
        );
        assert_close(
            &v,
            &[
                5.247751687420532e-05,
                8.991005597636104e-05,
                0.00013978010974824429,
                0.00024959020083770156,
                0.00026199023704975843,
                9.009990753838792e-05,
            ],
            "exp_avg_sq",
        );
    }

    #[test]
    fn clipping_scales_to_the_global_norm() {
        let g = [grad(&GRADS[0][..]), grad(&[0.0; 6])];
        let norm = global_grad_norm(&g).unwrap();
        assert!((norm - 0.55f64.sqrt()).abs() < 1e-6, "{norm}");
        let (clipped, before) = clip_grad_norm(&g, 0.5).unwrap();
        assert_eq!(before, norm);
        let after = global_grad_norm(&clipped).unwrap();
        assert!((after - 0.5).abs() < 1e-5, "{after}");
        let (same, _) = clip_grad_norm(&g, 10.0).unwrap();
        assert_eq!(values(&same[0]), values(&g[0]));

        let var = param(&P0);
        let clip = AdamWConfig {
            max_grad_norm: Some(0.5),
            ..cfg()
        };
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], clip).unwrap();
        let out = opt.step(&[grad(&GRADS[0])], LRS[0]).unwrap();
        let StepOutcome::Applied {
            grad_norm,
            clip_scale,
        } = out
        else {
            panic!("skipped: {out:?}")
        };
        assert!((grad_norm - 0.55f64.sqrt()).abs() < 1e-6);
        assert!((clip_scale - 0.5 / (0.55f64.sqrt() + 1e-6)).abs() < 1e-6);
        for (g, lr) in GRADS[1..].iter().zip(&LRS[1..]) {
            opt.step(&[grad(g)], *lr).unwrap();
        }
        assert_close(
            &values(var.as_tensor()),
            &[
                0.48744919896125793,
                -0.9887192249298096,
                1.9805772304534912,
                0.009301173500716686,
                0.23659029603004456,
                -0.7512069940567017,
            ],
            "clipped param",
        );
    }

    #[test]
    fn non_finite_gradients_skip_without_touching_anything() {
        let var = param(&P0);
        let other = param(&P0);
        let mut opt = AdamW::new(
            vec![("w".into(), var.clone()), ("u".into(), other.clone())],
            cfg(),
        )
        .unwrap();
        opt.step(&[grad(&GRADS[0]), grad(&GRADS[1])], 1e-2).unwrap();
        let before = slot_values(&opt);
        let before_other = values(other.as_tensor());
        for bad in [f32::NAN, f32::INFINITY] {
            let mut g = GRADS[1];
            g[2] = bad;
            // The finite gradient comes first: it must not be applied either.
            let out = opt.step(&[grad(&GRADS[2]), grad(&g)], 1e-2).unwrap();
            assert!(matches!(out, StepOutcome::Skipped { .. }), "{out:?}");
            assert_eq!(slot_values(&opt), before);
            assert_eq!(values(other.as_tensor()), before_other);
            assert_eq!(opt.step_count(), 1);
        }
        let out = opt.step(&[grad(&GRADS[2]), grad(&GRADS[2])], 1e-2).unwrap();
        assert!(matches!(out, StepOutcome::Applied { .. }));
        assert_eq!(opt.step_count(), 2);
    }

    #[test]
    fn export_import_resumes_bit_exactly() {
        let var = param(&P0);
        let mut a = AdamW::new(vec![("w".into(), var.clone())], cfg()).unwrap();
        a.step(&[grad(&GRADS[0])], LRS[0]).unwrap();
        a.step(&[grad(&GRADS[1])], LRS[1]).unwrap();
        let state: HashMap<String, Tensor> = a.export_state().unwrap().into_iter().collect();
        assert_eq!(state.len(), 3);

        let resumed = param(&values(var.as_tensor()));
        let mut b = AdamW::new(vec![("w".into(), resumed.clone())], cfg()).unwrap();
        b.import_state(&state).unwrap();
        assert_eq!(b.step_count(), 2);
        a.step(&[grad(&GRADS[2])], LRS[2]).unwrap();
        b.step(&[grad(&GRADS[2])], LRS[2]).unwrap();
        let (pa, ma, va) = slot_values(&a);
        let (pb, mb, vb) = slot_values(&b);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&pa), bits(&pb));
        assert_eq!(bits(&ma), bits(&mb));
        assert_eq!(bits(&va), bits(&vb));
    }

    #[test]
    fn an_export_does_not_change_with_later_steps() {
        // The moments change in place: an exported state must be a copy, not a view of them.
        let var = param(&P0);
        let mut opt = AdamW::new(vec![("w".into(), var)], cfg()).unwrap();
        opt.step(&[grad(&GRADS[0])], LRS[0]).unwrap();
        let state = opt.export_state().unwrap();
        let exported: Vec<Vec<f32>> = state[1..].iter().map(|(_, t)| values(t)).collect();
        let (_, m, v) = slot_values(&opt);
        assert_eq!(exported, vec![m.clone(), v.clone()]);
        opt.step(&[grad(&GRADS[1])], LRS[1]).unwrap();
        let (_, m2, _) = slot_values(&opt);
        assert_ne!(m2, m, "the step must change the moments");
        let after: Vec<Vec<f32>> = state[1..].iter().map(|(_, t)| values(t)).collect();
        assert_eq!(after, exported);
    }

    #[test]
    fn import_rejects_incomplete_state_and_changes_nothing() {
        let mut opt = AdamW::new(vec![("w".into(), param(&P0))], cfg()).unwrap();
        opt.step(&[grad(&GRADS[0])], 1e-2).unwrap();
        let before = slot_values(&opt);
        let full: HashMap<String, Tensor> = opt.export_state().unwrap().into_iter().collect();

        let mut missing = full.clone();
        missing.remove("w.exp_avg_sq");
        let err = opt.import_state(&missing).unwrap_err().to_string();
        assert!(err.contains("w.exp_avg_sq"), "{err}");

        let mut wrong = full.clone();
        wrong.insert(
            "w.exp_avg".into(),
            Tensor::zeros((3, 2), DType::F32, &Device::Cpu).unwrap(),
        );
        wrong.insert(STEP_KEY.into(), Tensor::new(&[9i64], &Device::Cpu).unwrap());
        assert!(opt.import_state(&wrong).is_err());
        assert_eq!(slot_values(&opt), before);
        assert_eq!(opt.step_count(), 1);
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let params = vec![("w".into(), param(&P0)), ("w".into(), param(&P0))];
        assert!(AdamW::new(params, cfg()).is_err());
    }

    #[test]
    fn bf16_parameters_keep_their_dtype() {
        let t = Tensor::from_slice(&P0, (2, 3), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let var = Var::from_tensor(&t).unwrap();
        let mut opt = AdamW::new(vec![("w".into(), var.clone())], cfg()).unwrap();
        opt.step(&[grad(&GRADS[0])], 1e-2).unwrap();
        assert_eq!(var.dtype(), DType::BF16);
        assert_eq!(opt.slots[0].exp_avg.dtype(), DType::F32);
        let moved = var.as_tensor().to_dtype(DType::F32).unwrap();
        assert!(values(&moved)[0] < 0.5);
    }
}
