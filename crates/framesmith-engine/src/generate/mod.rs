//! Generation: the one call the command line and the app generate through ([`run`], with its plain-data request
//! and events in [`request`]), the flow-matching sampling loop with its solvers (`denoise`, `sampler`), whole clips from a prompt
//! with loaded models (`pipeline`), the start image of image-to-video clips, sample prompt files, and FLUX.1 images
//! (`flux`).

pub mod denoise;
pub mod flux;
#[cfg(test)]
mod flux_tests;
pub mod pipeline;
pub mod prompts;
pub mod request;
pub mod run;
pub mod sampler;
pub mod start_image;

pub use run::run;
