//! An LTX-2 run's model and what the trainer asks of it: the image families' run ([`crate::family::image::run`]:
//! the micro-step, the validation loss over held-out items at the plan's fixed timesteps) over the LTX-2 batch
//! ([`super::train::ltx2_batch`]), with its clip samples ([`super::samples::Ltx2Samples`]).

use crate::family::image::run::ImageRun;
use framesmith_models::ltx2::Ltx2Transformer;

use super::samples::Ltx2Samples;

/// The model of an LTX-2 run.
pub type Ltx2Run = ImageRun<Ltx2Transformer, Ltx2Samples>;
