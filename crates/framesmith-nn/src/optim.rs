//! AdamW's update applied in place: the two moments from the gradient, then the parameter, three passes over each
//! tensor with no allocation (a candle composition takes about twenty kernels and as many fresh buffers per
//! tensor, which for hundreds of LoRA tensors costs more than the update itself). Computes what
//! `torch.optim.AdamW`'s single-tensor path computes in f32, each product and sum rounded on its own, on the CPU
//! and (`kernels/optim.cu`) on CUDA. An optimizer's step runs all its tensors at once ([`adamw_update_all`], one
//! fused launch on CUDA) after their sums of squares for the gradient norm ([`sums_of_squares`], one launch and
//! one read).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Tensor};

/// One AdamW update's scalars, as torch computes them in Python floats (f64); the passes use them in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWUpdate {
    /// Factor applied to the gradient first (gradient clipping), 1 for none.
    pub grad_scale: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// `1 − lr · weight_decay` (decoupled weight decay), 1 for none.
    pub decay: f64,
    /// `√(1 − beta2^step)`.
    pub bias_correction2_sqrt: f64,
    /// `lr / (1 − beta1^step)`.
    pub step_size: f64,
}

/// The f32 scalars every implementation uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalars {
    pub grad_scale: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub decay: f32,
    pub inv_bc2_sqrt: f32,
    pub eps: f32,
    pub step_size: f32,
}

impl AdamWUpdate {
    /// The update of step `step` (1-based) at learning rate `lr`, its scalars as torch computes them in Python
    /// floats: bias corrections `1 − β^step`, decay `1 − lr · weight_decay`, the gradient scaled by `grad_scale`.
    pub fn at_step(
        step: u64,
        lr: f64,
        (beta1, beta2): (f64, f64),
        eps: f64,
        weight_decay: f64,
        grad_scale: f64,
    ) -> Self {
        Self {
            grad_scale,
            beta1,
            beta2,
            eps,
            decay: 1.0 - lr * weight_decay,
            bias_correction2_sqrt: (1.0 - beta2.powf(step as f64)).sqrt(),
            step_size: lr / (1.0 - beta1.powf(step as f64)),
        }
    }

    pub(crate) fn scalars(&self) -> Scalars {
        Scalars {
            grad_scale: self.grad_scale as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            decay: self.decay as f32,
            inv_bc2_sqrt: (1.0 / self.bias_correction2_sqrt) as f32,
            eps: self.eps as f32,
            step_size: self.step_size as f32,
        }
    }
}

/// One parameter's tensors for [`adamw_update_all`]: as [`adamw_update`] takes them.
#[derive(Clone, Copy, Debug)]
pub struct AdamWTensors<'a> {
    pub param: &'a Tensor,
    pub grad: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
}

/// Applies one AdamW update in place: `exp_avg` and `exp_avg_sq` (f32) from `grad`, then `param` (f32 or bf16).
/// All four tensors have one shape, live on one device and are contiguous; `grad` is f32 or bf16.
pub fn adamw_update(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    update: &AdamWUpdate,
) -> Result<()> {
    check(&AdamWTensors {
        param,
        grad,
        exp_avg,
        exp_avg_sq,
    })?;
    let grad = grad.contiguous()?;
    let s = update.scalars();
    exp_avg.inplace_op2(&grad, &ExpAvg(s))?;
    exp_avg_sq.inplace_op2(&grad, &ExpAvgSq(s))?;
    param.inplace_op3(exp_avg, exp_avg_sq, &Param(s))
}

/// [`adamw_update`] for many parameters with one update's scalars (an optimizer's step): the same bits, and on one
/// CUDA device a single kernel launch for all of them instead of three per tensor. Every item is checked before
/// anything changes.
pub fn adamw_update_all(items: &[AdamWTensors<'_>], update: &AdamWUpdate) -> Result<()> {
    for item in items {
        check(item)?;
    }
    #[cfg(feature = "cuda")]
    if crate::cuda::optim::adamw_multi(items, &update.scalars())? {
        return Ok(());
    }
    for i in items {
        adamw_update(i.param, i.grad, i.exp_avg, i.exp_avg_sq, update)?;
    }
    Ok(())
}

/// Each tensor's sum of squares in f32, as `t.to_dtype(F32)?.sqr()?.sum_all()` computes it, read to the host in
/// one transfer (on one CUDA device, from one kernel launch). The tensors share one device.
pub fn sums_of_squares(tensors: &[Tensor]) -> Result<Vec<f32>> {
    #[cfg(feature = "cuda")]
    if let Some(sums) = crate::cuda::optim::sums_of_squares(tensors)? {
        return Ok(sums);
    }
    if tensors.is_empty() {
        return Ok(Vec::new());
    }
    let sums = tensors
        .iter()
        .map(|t| t.to_dtype(DType::F32)?.sqr()?.sum_all()?.reshape(1))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&sums, 0)?
        .to_device(&candle_core::Device::Cpu)?
        .to_vec1::<f32>()
}

/// One shape for all four tensors, f32 moments, f32 or bf16 parameter and gradient.
fn check(t: &AdamWTensors<'_>) -> Result<()> {
    for (what, x) in [
        ("gradient", t.grad),
        ("exp_avg", t.exp_avg),
        ("exp_avg_sq", t.exp_avg_sq),
    ] {
        if x.shape() != t.param.shape() {
            candle_core::bail!(
                "adamw_update: {what} is {:?}, the parameter {:?}",
                x.shape(),
                t.param.shape()
            );
        }
    }
    if t.exp_avg.dtype() != DType::F32 || t.exp_avg_sq.dtype() != DType::F32 {
        candle_core::bail!("adamw_update: the moments must be f32");
    }
    for x in [t.param, t.grad] {
        if !matches!(x.dtype(), DType::F32 | DType::BF16) {
            candle_core::bail!(
                "adamw_update takes f32 or bf16 parameters and gradients, not {:?}",
                x.dtype()
            );
        }
    }
    Ok(())
}

fn contiguous(layout: &Layout) -> Result<(usize, usize)> {
    layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("adamw_update: a non-contiguous tensor".into()))
}

/// The gradient's values in f32, scaled.
fn grad_values(storage: &CpuStorage, layout: &Layout, scale: f32) -> Result<Vec<f32>> {
    let (start, end) = contiguous(layout)?;
    let values: Vec<f32> = match storage {
        CpuStorage::F32(v) => v[start..end].to_vec(),
        CpuStorage::BF16(v) => v[start..end].iter().map(|x| x.to_f32()).collect(),
        other => candle_core::bail!("adamw_update: a {:?} gradient", other.dtype()),
    };
    Ok(if scale != 1.0 {
        values.into_iter().map(|g| g * scale).collect()
    } else {
        values
    })
}

fn f32_slice<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let (start, end) = contiguous(layout)?;
    match storage {
        CpuStorage::F32(v) => Ok(&v[start..end]),
        other => candle_core::bail!("adamw_update: a {:?} moment", other.dtype()),
    }
}

fn f32_slice_mut<'a>(storage: &'a mut CpuStorage, layout: &Layout) -> Result<&'a mut [f32]> {
    let (start, end) = contiguous(layout)?;
    match storage {
        CpuStorage::F32(v) => Ok(&mut v[start..end]),
        other => candle_core::bail!("adamw_update: a {:?} moment", other.dtype()),
    }
}

/// `m += (g − m) · (1 − beta1)`.
pub(crate) struct ExpAvg(pub(crate) Scalars);

impl InplaceOp2 for ExpAvg {
    fn name(&self) -> &'static str {
        "framesmith-adamw-exp-avg"
    }

    fn cpu_fwd(&self, m: &mut CpuStorage, ml: &Layout, g: &CpuStorage, gl: &Layout) -> Result<()> {
        let g = grad_values(g, gl, self.0.grad_scale)?;
        for (m, g) in f32_slice_mut(m, ml)?.iter_mut().zip(g) {
            *m += (g - *m) * self.0.one_minus_beta1;
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        m: &mut candle_core::CudaStorage,
        ml: &Layout,
        g: &candle_core::CudaStorage,
        gl: &Layout,
    ) -> Result<()> {
        crate::cuda::optim::exp_avg(m, ml, g, gl, &self.0)
    }
}

/// `v = v · beta2 + g² · (1 − beta2)`.
pub(crate) struct ExpAvgSq(pub(crate) Scalars);

impl InplaceOp2 for ExpAvgSq {
    fn name(&self) -> &'static str {
        "framesmith-adamw-exp-avg-sq"
    }

    fn cpu_fwd(&self, v: &mut CpuStorage, vl: &Layout, g: &CpuStorage, gl: &Layout) -> Result<()> {
        let g = grad_values(g, gl, self.0.grad_scale)?;
        for (v, g) in f32_slice_mut(v, vl)?.iter_mut().zip(g) {
            *v = *v * self.0.beta2 + (g * g) * self.0.one_minus_beta2;
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        v: &mut candle_core::CudaStorage,
        vl: &Layout,
        g: &candle_core::CudaStorage,
        gl: &Layout,
    ) -> Result<()> {
        crate::cuda::optim::exp_avg_sq(v, vl, g, gl, &self.0)
    }
}

/// `p = p · decay − (m / (√v / √bc2 + eps)) · step_size`.
pub(crate) struct Param(pub(crate) Scalars);

impl Param {
    fn apply(&self, p: f32, m: f32, v: f32) -> f32 {
        let s = &self.0;
        let p = if s.decay != 1.0 { p * s.decay } else { p };
        let denom = v.sqrt() * s.inv_bc2_sqrt + s.eps;
        p - (m / denom) * s.step_size
    }
}

impl InplaceOp3 for Param {
    fn name(&self) -> &'static str {
        "framesmith-adamw-param"
    }

    fn cpu_fwd(
        &self,
        p: &mut CpuStorage,
        pl: &Layout,
        m: &CpuStorage,
        ml: &Layout,
        v: &CpuStorage,
        vl: &Layout,
    ) -> Result<()> {
        let (m, v) = (f32_slice(m, ml)?, f32_slice(v, vl)?);
        let (start, end) = contiguous(pl)?;
        match p {
            CpuStorage::F32(p) => {
                for ((p, &m), &v) in p[start..end].iter_mut().zip(m).zip(v) {
                    *p = self.apply(*p, m, v);
                }
            }
            CpuStorage::BF16(p) => {
                for ((p, &m), &v) in p[start..end].iter_mut().zip(m).zip(v) {
                    *p = half::bf16::from_f32(self.apply(p.to_f32(), m, v));
                }
            }
            other => candle_core::bail!("adamw_update: a {:?} parameter", other.dtype()),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        p: &mut candle_core::CudaStorage,
        pl: &Layout,
        m: &candle_core::CudaStorage,
        ml: &Layout,
        v: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> Result<()> {
        crate::cuda::optim::param(p, pl, m, ml, v, vl, &self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::SeedableRng;

    /// The same update as a candle composition, one op per step (the optimizer's earlier form).
    fn composed(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, u: &AdamWUpdate) -> Vec<Tensor> {
        let mut g = g.to_dtype(DType::F32).unwrap();
        if u.grad_scale != 1.0 {
            g = (g * u.grad_scale).unwrap();
        }
        let mut param = p.to_dtype(DType::F32).unwrap();
        if u.decay != 1.0 {
            param = (param * u.decay).unwrap();
        }
        let m = (m + ((&g - m).unwrap() * (1.0 - u.beta1)).unwrap()).unwrap();
        let v = ((v * u.beta2).unwrap() + (g.sqr().unwrap() * (1.0 - u.beta2)).unwrap()).unwrap();
        let denom = ((v.sqrt().unwrap() / u.bias_correction2_sqrt).unwrap() + u.eps).unwrap();
        let param = (param - ((&m / denom).unwrap() * u.step_size).unwrap()).unwrap();
        vec![param.to_dtype(p.dtype()).unwrap(), m, v]
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn in_place_update_equals_the_op_by_op_composition() {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(3);
        let dev = Device::Cpu;
        for (param_dtype, grad_dtype, grad_scale, decay) in [
            (DType::F32, DType::F32, 1.0, 1.0),
            (DType::F32, DType::BF16, 0.37, 0.999),
            (DType::BF16, DType::F32, 1.0, 0.99),
        ] {
            let p0 = crate::init::randn(&mut *rng, (7, 33), 0.0, 1.0, &dev).unwrap();
            let p0 = p0.to_dtype(param_dtype).unwrap();
            let g = crate::init::randn(&mut *rng, (7, 33), 0.0, 0.1, &dev).unwrap();
            let g = g.to_dtype(grad_dtype).unwrap();
            let m0 = crate::init::randn(&mut *rng, (7, 33), 0.0, 0.01, &dev).unwrap();
            let v0 = crate::init::randn(&mut *rng, (7, 33), 0.0, 0.01, &dev)
                .unwrap()
                .sqr()
                .unwrap();
            let u = AdamWUpdate {
                decay,
                ..AdamWUpdate::at_step(3, 1e-3, (0.9, 0.999), 1e-8, 0.0, grad_scale)
            };
            let want = composed(&p0, &g, &m0, &v0, &u);
            let (p, m, v) = (
                Var::from_tensor(&p0).unwrap(),
                Var::from_tensor(&m0).unwrap(),
                Var::from_tensor(&v0).unwrap(),
            );
            adamw_update(p.as_tensor(), &g, m.as_tensor(), v.as_tensor(), &u).unwrap();
            assert_eq!(p.dtype(), param_dtype);
            for (name, got, want) in [
                ("param", p.as_tensor(), &want[0]),
                ("exp_avg", m.as_tensor(), &want[1]),
                ("exp_avg_sq", v.as_tensor(), &want[2]),
            ] {
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{name} ({param_dtype:?} param, {grad_dtype:?} grad)"
                );
            }
        }
    }

    fn update(grad_scale: f64, decay: f64) -> AdamWUpdate {
        AdamWUpdate {
            decay,
            ..AdamWUpdate::at_step(4, 1e-3, (0.9, 0.999), 1e-8, 0.0, grad_scale)
        }
    }

    #[test]
    fn update_all_equals_one_tensor_at_a_time() {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(5);
        let dev = Device::Cpu;
        let kinds = [
            (5, DType::F32, DType::F32),
            (33, DType::F32, DType::BF16),
            (1030, DType::BF16, DType::F32),
            (4097, DType::BF16, DType::BF16),
        ];
        let mut starts = Vec::new();
        for (n, pd, gd) in kinds {
            let p = crate::init::randn(&mut *rng, n, 0.0, 1.0, &dev).unwrap();
            let g = crate::init::randn(&mut *rng, n, 0.0, 0.1, &dev).unwrap();
            let m = crate::init::randn(&mut *rng, n, 0.0, 0.01, &dev).unwrap();
            let v = (m.sqr().unwrap() * 0.5).unwrap();
            starts.push([p.to_dtype(pd).unwrap(), g.to_dtype(gd).unwrap(), m, v]);
        }
        let u = update(0.5, 0.999);
        let vars = |starts: &[[Tensor; 4]]| -> Vec<[Var; 3]> {
            starts
                .iter()
                .map(|[p, _, m, v]| [p, m, v].map(|t| Var::from_tensor(t).unwrap()))
                .collect()
        };
        let (all, one) = (vars(&starts), vars(&starts));
        let items: Vec<_> = all
            .iter()
            .zip(&starts)
            .map(|([p, m, v], s)| AdamWTensors {
                param: p.as_tensor(),
                grad: &s[1],
                exp_avg: m.as_tensor(),
                exp_avg_sq: v.as_tensor(),
            })
            .collect();
        adamw_update_all(&items, &u).unwrap();
        for (([p, m, v], s), got) in one.iter().zip(&starts).zip(&all) {
            adamw_update(p.as_tensor(), &s[1], m.as_tensor(), v.as_tensor(), &u).unwrap();
            for (a, b) in [p, m, v].iter().zip(got) {
                assert_eq!(bits(a.as_tensor()), bits(b.as_tensor()));
                assert_eq!(a.dtype(), b.dtype());
            }
            assert_ne!(bits(p.as_tensor()), bits(&s[0]), "the update moved nothing");
        }
    }

    #[test]
    fn update_all_checks_every_item_before_changing_any() {
        let dev = Device::Cpu;
        let p = Var::from_tensor(&Tensor::ones(4, DType::F32, &dev).unwrap()).unwrap();
        let m = Var::zeros(4, DType::F32, &dev).unwrap();
        let v = Var::zeros(4, DType::F32, &dev).unwrap();
        let g = Tensor::ones(4, DType::F32, &dev).unwrap();
        let short = Tensor::ones(3, DType::F32, &dev).unwrap();
        let good = AdamWTensors {
            param: p.as_tensor(),
            grad: &g,
            exp_avg: m.as_tensor(),
            exp_avg_sq: v.as_tensor(),
        };
        let bad = AdamWTensors {
            grad: &short,
            ..good
        };
        assert!(adamw_update_all(&[good, bad], &update(1.0, 1.0)).is_err());
        assert_eq!(
            bits(p.as_tensor()),
            bits(&Tensor::ones(4, DType::F32, &dev).unwrap())
        );
        assert_eq!(bits(m.as_tensor()), vec![0; 4]);
    }

    #[test]
    fn sums_of_squares_are_each_tensors_f32_sum() {
        let rng = &mut rand::rngs::StdRng::seed_from_u64(9);
        let dev = Device::Cpu;
        let tensors: Vec<Tensor> = [(7, DType::F32), (40, DType::BF16), (1025, DType::F32)]
            .into_iter()
            .map(|(n, dtype)| {
                crate::init::randn(&mut *rng, n, 0.0, 1.0, &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            })
            .collect();
        let got = sums_of_squares(&tensors).unwrap();
        assert_eq!(got.len(), 3);
        for (t, s) in tensors.iter().zip(&got) {
            let want: f64 = t
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .map(|x| x * x)
                .sum();
            assert!((f64::from(*s) - want).abs() <= 1e-5 * want, "{s} vs {want}");
        }
        assert!(sums_of_squares(&[]).unwrap().is_empty());
    }

    #[test]
    fn mismatched_shapes_and_dtypes_are_refused() {
        let dev = Device::Cpu;
        let p = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        let m = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        let u = AdamWUpdate {
            grad_scale: 1.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            decay: 1.0,
            bias_correction2_sqrt: 1.0,
            step_size: 1.0,
        };
        let short = Tensor::zeros((2, 2), DType::F32, &dev).unwrap();
        assert!(adamw_update(&p, &short, &m, &m.copy().unwrap(), &u).is_err());
        let bf16_moment = m.to_dtype(DType::BF16).unwrap();
        assert!(adamw_update(&p, &m, &bf16_moment, &m, &u).is_err());
    }
}
