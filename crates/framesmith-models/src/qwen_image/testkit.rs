//! Fixture cases of `tests/fixtures/qwen_image` (made by `bench/reference/qwen_image.py` from diffusers) for the
//! Qwen-Image tests: the model built from a case's weights and config, and its inputs as the model takes them.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::rope::ImageGrid;
use super::{QwenImageConfig, QwenImageInputs, QwenImageTransformer};
use framesmith_nn::vb::Vb;

/// One case directory, read on the CPU.
pub struct Case {
    pub config: serde_json::Value,
    pub weights: HashMap<String, Tensor>,
    pub inputs: HashMap<String, Tensor>,
    pub expected: HashMap<String, Tensor>,
}

/// The folder of the Qwen-Image fixtures, in this crate.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen_image")
}

impl Case {
    pub fn load(name: &str) -> anyhow::Result<Self> {
        let dir = fixtures_dir().join(name);
        let read = |file: &str| -> anyhow::Result<HashMap<String, Tensor>> {
            Ok(candle_core::safetensors::load(
                dir.join(file),
                &Device::Cpu,
            )?)
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

    /// The constructor arguments (`init`).
    pub fn model_config(&self) -> anyhow::Result<QwenImageConfig> {
        Ok(QwenImageConfig::from_json(
            &self.config["init"].to_string(),
        )?)
    }

    /// The model with the case's weights, in f32.
    pub fn model(&self) -> anyhow::Result<QwenImageTransformer> {
        let vb = Vb::from_tensors(self.weights.clone(), DType::F32, &Device::Cpu);
        Ok(QwenImageTransformer::new(&self.model_config()?, &vb)?)
    }

    /// The inputs of the call: `img`, `txt`, the grids of `call.img_shapes`, the mask's lengths, `timesteps`.
    pub fn model_inputs(&self) -> anyhow::Result<QwenImageInputs> {
        let shapes: Vec<[usize; 3]> =
            serde_json::from_value(self.config["call"]["img_shapes"].clone())?;
        let txt_lens = match self.inputs.get("txt_mask") {
            Some(mask) => Some(super::transformer::txt_lens_from_mask(mask)?),
            None => None,
        };
        Ok(QwenImageInputs {
            img: self.input("img")?.clone(),
            img_grids: shapes
                .iter()
                .map(|&[frames, height, width]| ImageGrid {
                    frames,
                    height,
                    width,
                })
                .collect(),
            txt: self.input("txt")?.clone(),
            txt_lens,
            timesteps: self.input("timesteps")?.clone(),
        })
    }
}
