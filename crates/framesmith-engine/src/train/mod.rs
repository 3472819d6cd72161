//! Training: the engine thread, the trainer and its checkpointed step, optimizer, schedules, timestep sampling,
//! the training set, checkpoints, and sample clips (samplers and generation).

pub mod caching;
pub mod checkpoint;
pub mod clip;
pub mod data;
pub mod demo_setup;
pub mod engine;
pub mod generate;
pub mod memory_plan;
pub mod optimizer;
pub mod prompts;
pub mod sample_models;
pub mod sampler;
pub mod samples;

pub mod setup;
pub mod start_image;
pub mod step;
pub mod timesteps;
pub mod trainer;

#[cfg(test)]
mod streaming_tests;
#[cfg(test)]
mod tests;
