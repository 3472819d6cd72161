//! A FLUX.1 [dev] run's model and what the trainer asks of it: the image families' run
//! ([`crate::family::image::run`]) over the FLUX.1 batch ([`crate::family::flux::train::flux_batch`]) with the
//! image samples. FLUX.1 runs do not validate (the config validator refuses `[validation]` for them).

use crate::family::flux::samples::ImageSamples;
use crate::family::image::run::ImageRun;
use framesmith_models::flux::Flux;

/// The model of a FLUX.1 run and its samples.
pub type FluxRun = ImageRun<Flux, ImageSamples>;

#[cfg(test)]
pub(crate) mod tests;
