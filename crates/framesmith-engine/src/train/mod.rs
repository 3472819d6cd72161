//! Training: the engine thread, the trainer and its checkpointed step, optimizer, timestep sampling, the training
//! set, run outputs (LoRA files, training states, metrics) and the samples (clips, FLUX.1 images) made during a run (through
//! `crate::generate`).

pub mod clip_samples;
pub mod data;
pub mod demo_setup;
pub mod engine;
pub mod experts;
pub mod flux;
pub mod flux_samples;
mod flux_setup;
pub mod launch;
pub mod mode;
pub mod optimizer;
pub mod outputs;
pub mod ranks;
pub mod run_model;
pub mod sample_models;
pub mod samples;

pub mod setup;
pub mod step;
pub mod timesteps;
pub mod trainer;
pub mod validation;

#[cfg(test)]
mod experts_tests;
#[cfg(test)]
mod flux_run_tests;
#[cfg(test)]
mod flux_samples_tests;
#[cfg(test)]
mod flux_step_tests;
#[cfg(test)]
mod flux_streaming_tests;
#[cfg(test)]
mod flux_train_tests;
#[cfg(test)]
mod i2v_grad_tests;
#[cfg(test)]
mod i2v_sample_tests;
#[cfg(test)]
mod i2v_tests;
#[cfg(test)]
mod ranks_tests;
#[cfg(test)]
mod step_testkit;
#[cfg(test)]
mod streaming_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod ti2v_tests;
#[cfg(test)]
mod validation_tests;
