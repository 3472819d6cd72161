//! The engine: the model families (`family`), training (`train`), generation (`generate`), loading a DiT for either (`dit`), dataset caching
//! (`prep`), the memory planner (`plan`), the system check (`doctor`), the demo model and project (`demo`) and the
//! parity checks against the official implementations (`parity`). Talks to the app only through
//! `framesmith_config::protocol`.

pub mod demo;
pub mod dit;
pub mod doctor;
pub mod family;
pub mod generate;
pub mod parity;
pub mod plan;
pub mod prep;
pub mod train;
pub mod user_cache;
