//! Model definitions. Pure tensor code: no channels, config files or logging policy.

pub mod fixtures;
pub mod wan;
