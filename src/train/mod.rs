//! Training: the checkpointed step, the training set, the sampler for previews, and (growing) the engine thread,
//! schedules, optimizer and checkpoints.

pub mod data;
pub mod generate;
pub mod prompts;
pub mod sampler;
pub mod step;
