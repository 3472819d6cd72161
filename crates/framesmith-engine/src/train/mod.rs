//! Training, the same for every model family: the engine thread, the trainer and its checkpointed step, optimizer,
//! timestep sampling, the training set, run outputs (LoRA files, training states, metrics), validation and the
//! samples' schedule. What is model-specific goes through [`crate::family`].

pub(crate) mod buffers;
pub mod data;
pub mod engine;
pub mod launch;
pub mod noise;
pub mod optimizer;
pub mod outputs;
pub(crate) mod placements;
pub mod preflight;
pub mod ranks;
pub mod samples;
pub mod setup;
pub mod startup;
pub mod step;
pub mod timesteps;
pub mod trainer;
pub mod validation;
pub mod vram_peak;

#[cfg(test)]
pub(crate) mod tests;
