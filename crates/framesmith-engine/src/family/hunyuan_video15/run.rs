//! A HunyuanVideo 1.5 run's model and what the trainer asks of it: the image families' run
//! ([`crate::family::image::run`]: the micro-step, the validation loss over held-out items at the plan's fixed
//! timesteps) over the HunyuanVideo 1.5 batch ([`super::train::hv15_batch`]), without samples ([`NoSamples`]).

use std::path::Path;

use candle_core::Tensor;

use crate::family::image::run::ImageRun;
use crate::train::samples::{SampleFiles, SampleSet};
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;

/// Why a HunyuanVideo 1.5 run makes no samples.
pub const NO_SAMPLES: &str =
    "samples of HunyuanVideo 1.5 need the byT5 glyph encoder, which Framesmith does not have yet";

/// The samples of a run that makes none ([`NO_SAMPLES`]): no value of it exists, so a run holds `None` and the
/// config validator refuses `[sampling]` first.
pub enum NoSamples {}

impl SampleSet<HunyuanVideo15Transformer> for NoSamples {
    fn prompt_count(&self) -> usize {
        match *self {}
    }

    fn prompt(&self, _i: usize) -> &str {
        match *self {}
    }

    fn denoise(
        &self,
        _i: usize,
        _models: &mut HunyuanVideo15Transformer,
        _cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        match *self {}
    }

    fn write(&self, _latents: Tensor, _dir: &Path, _stem: &str) -> anyhow::Result<SampleFiles> {
        match *self {}
    }
}

/// The model of a HunyuanVideo 1.5 run.
pub type Hv15Run = ImageRun<HunyuanVideo15Transformer, NoSamples>;
