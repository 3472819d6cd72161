//! Fixture cases of `tests/fixtures/hunyuan_video15` (made by `bench/reference/hunyuan_video15.py` from
//! diffusers) for the HunyuanVideo 1.5 tests: the model built from a case's weights in the case's layout, its
//! inputs as the model takes them, and the fixture's gradient names in the official layout.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::conditioning::TextStates;
use super::layout::{diffusers_block_path, KeyLayout, LayoutSource};
use super::{HunyuanVideo15Config, HunyuanVideo15Inputs, HunyuanVideo15Transformer};
use framesmith_nn::vb::Vb;

/// One case directory, read on the CPU.
pub struct Case {
    pub config: serde_json::Value,
    pub weights: HashMap<String, Tensor>,
    pub inputs: HashMap<String, Tensor>,
    pub expected: HashMap<String, Tensor>,
}

/// The folder of the HunyuanVideo 1.5 fixtures, in this crate.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hunyuan_video15")
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

    /// The constructor arguments (`init`) with the glyph projection's hidden width.
    pub fn model_config(&self) -> anyhow::Result<HunyuanVideo15Config> {
        let mut cfg = HunyuanVideo15Config::from_json(&self.config["init"].to_string())?;
        if let Some(hidden) = self.config["byt5_hidden"].as_u64() {
            cfg.byt5_hidden_dim = hidden as usize;
        }
        Ok(cfg)
    }

    /// The layout the case's weights are stored in.
    pub fn layout(&self) -> anyhow::Result<KeyLayout> {
        match self.config["layout"].as_str() {
            Some("diffusers") => Ok(KeyLayout::Diffusers),
            Some("official") => Ok(KeyLayout::Official),
            other => anyhow::bail!("unknown fixture layout {other:?}"),
        }
    }

    /// A view of the case's weights under the official names, in `dtype`.
    pub fn vb(&self, dtype: DType) -> anyhow::Result<Vb> {
        let source = LayoutSource::new(Arc::new(self.weights.clone()), self.layout()?);
        Ok(Vb::from_source(Arc::new(source), dtype, &Device::Cpu))
    }

    /// The model with the case's weights, in f32.
    pub fn model(&self) -> anyhow::Result<HunyuanVideo15Transformer> {
        Ok(HunyuanVideo15Transformer::new(
            &self.model_config()?,
            &self.vb(DType::F32)?,
        )?)
    }

    /// The inputs of the call.
    pub fn model_inputs(&self) -> anyhow::Result<HunyuanVideo15Inputs> {
        Ok(HunyuanVideo15Inputs {
            latents: self.input("hidden_states")?.clone(),
            timesteps: self.input("timesteps")?.clone(),
            txt: TextStates::from_mask(self.input("txt")?.clone(), self.input("txt_mask")?)?,
            byt5: Some(TextStates::from_mask(
                self.input("byt5")?.clone(),
                self.input("byt5_mask")?,
            )?),
            image_embeds: Some(self.input("image_embeds")?.clone()),
        })
    }
}

/// The fixture's gradient key (diffusers' names) of the official block linear `double_blocks.{i}.{linear}`.
pub fn diffusers_grad_key(path: &str) -> Option<String> {
    Some(format!("grad.{}.weight", diffusers_block_path(path)?))
}
