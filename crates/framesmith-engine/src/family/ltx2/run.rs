//! An LTX-2 run's model and what the trainer asks of it: the image families' run ([`crate::family::image::run`]:
//! the micro-step, the validation loss over held-out items at the plan's fixed timesteps) over the LTX-2 batch
//! ([`super::train::ltx2_batch`]), without samples ([`NoSamples`]).

use std::path::Path;

use candle_core::Tensor;

use crate::family::image::run::ImageRun;
use crate::train::samples::{SampleFiles, SampleSet};
use framesmith_models::ltx2::Ltx2Transformer;

/// The samples of a run that makes none (they need LTX-2's video VAE and Gemma 3): no value of it exists, so a
/// run holds `None` and the config validator refuses `[sampling]` first.
pub enum NoSamples {}

impl SampleSet<Ltx2Transformer> for NoSamples {
    fn prompt_count(&self) -> usize {
        match *self {}
    }

    fn prompt(&self, _i: usize) -> &str {
        match *self {}
    }

    fn denoise(
        &self,
        _i: usize,
        _models: &mut Ltx2Transformer,
        _cancelled: &dyn Fn() -> bool,
    ) -> anyhow::Result<Tensor> {
        match *self {}
    }

    fn write(&self, _latents: Tensor, _dir: &Path, _stem: &str) -> anyhow::Result<SampleFiles> {
        match *self {}
    }
}

/// The model of an LTX-2 run.
pub type Ltx2Run = ImageRun<Ltx2Transformer, NoSamples>;
