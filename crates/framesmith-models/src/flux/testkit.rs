//! Fixture cases of `shared/fixtures/flux` for the FLUX tests: the three safetensors files and `config.json`,
//! and the element-wise tolerance check (shared with every family's fixtures).

use std::collections::HashMap;

use candle_core::{Device, Tensor};

pub use crate::fixtures::assert_close;

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
