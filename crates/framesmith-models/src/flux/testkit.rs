//! Fixture cases of `shared/fixtures/flux` for the FLUX tests: the three safetensors files and `config.json`,
//! and the element-wise tolerance the fixtures' README suggests.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

/// One case directory, read on the CPU.
pub struct Case {
    pub config: serde_json::Value,
    pub weights: HashMap<String, Tensor>,
    pub inputs: HashMap<String, Tensor>,
    pub expected: HashMap<String, Tensor>,
}

impl Case {
    pub fn load(name: &str) -> anyhow::Result<Self> {
        let dir = crate::fixtures::case_dir("flux", name);
        let read = |file: &str| -> anyhow::Result<HashMap<String, Tensor>> {
            let path = dir.join(file);
            if !path.exists() {
                return Ok(HashMap::new());
            }
            Ok(candle_core::safetensors::load(path, &Device::Cpu)?)
        };
        Ok(Self {
            config: serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?,
            weights: read("weights.safetensors")?,
            inputs: read("inputs.safetensors")?,
            expected: read("expected.safetensors")?,
        })
    }

    pub fn input(&self, name: &str) -> anyhow::Result<&Tensor> {
        self.inputs
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no input `{name}`"))
    }

    pub fn expected(&self, name: &str) -> anyhow::Result<&Tensor> {
        self.expected
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no expected `{name}`"))
    }
}

/// Checks |got − want| ≤ atol + rtol·|want| element-wise; returns the largest absolute error.
pub fn assert_close(
    name: &str,
    got: &Tensor,
    want: &Tensor,
    atol: f64,
    rtol: f64,
) -> anyhow::Result<f64> {
    anyhow::ensure!(
        got.dims() == want.dims(),
        "{name}: shape {:?}, expected {:?}",
        got.dims(),
        want.dims()
    );
    let g = got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let w = want.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let (mut max_abs, mut diff2, mut ref2) = (0f64, 0f64, 0f64);
    let mut worst: Option<String> = None;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = (a - b).abs();
        let within = d <= atol + rtol * b.abs();
        if !within && worst.is_none() {
            worst = Some(format!("element {i} is {a}, expected {b} (error {d:e})"));
        }
        max_abs = max_abs.max(d);
        diff2 += d * d;
        ref2 += b * b;
    }
    let rel = (diff2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
    if let Some(worst) = worst {
        anyhow::bail!("{name}: {worst} (max abs error {max_abs:.3e}, relative {rel:.3e})");
    }
    Ok(max_abs)
}
