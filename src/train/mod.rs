//! Training: the checkpointed step, and (growing) the engine thread, schedules, optimizer and checkpoints.

pub mod data;
pub mod step;
