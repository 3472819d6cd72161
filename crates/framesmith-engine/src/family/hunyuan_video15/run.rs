//! A HunyuanVideo 1.5 run's model and what the trainer asks of it: the image families' run
//! ([`crate::family::image::run`]: the micro-step, the validation loss over held-out items at the plan's fixed
//! timesteps) over the HunyuanVideo 1.5 batch ([`super::train::hv15_batch`]), with its clip samples
//! ([`super::samples::Hv15Samples`]).

use crate::family::image::run::ImageRun;
use framesmith_models::hunyuan_video15::HunyuanVideo15Transformer;

use super::samples::Hv15Samples;

/// The model of a HunyuanVideo 1.5 run.
pub type Hv15Run = ImageRun<HunyuanVideo15Transformer, Hv15Samples>;
