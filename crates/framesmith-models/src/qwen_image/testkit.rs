//! Fixture cases of `tests/fixtures/qwen_image` (made by `bench/reference/qwen_image.py` from diffusers) for the
//! Qwen-Image tests: the model built from a case's weights and config, and its inputs as the model takes them.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use candle_core::{DType, Device};

use super::rope::ImageGrid;
use super::{QwenImageConfig, QwenImageInputs, QwenImageTransformer};
use crate::fixtures::FixtureCase;
use framesmith_nn::vb::Vb;

/// One case directory ([`FixtureCase`]), read on the CPU.
pub struct Case(pub FixtureCase);

impl Deref for Case {
    type Target = FixtureCase;

    fn deref(&self) -> &FixtureCase {
        &self.0
    }
}

impl DerefMut for Case {
    fn deref_mut(&mut self) -> &mut FixtureCase {
        &mut self.0
    }
}

/// The folder of the Qwen-Image fixtures, in this crate.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen_image")
}

impl Case {
    /// Reads the case `name`.
    pub fn load(name: &str) -> anyhow::Result<Self> {
        FixtureCase::load_dir(&fixtures_dir().join(name)).map(Self)
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
