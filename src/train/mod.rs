//! Training: the checkpointed step, and (growing) the engine thread, schedules, optimizer and checkpoints.

pub mod optimizer;
pub mod schedule;
pub mod step;
pub mod timesteps;
