//! Run configuration: `RunConfig` (serde/TOML), presets and validation into the `RunPlan` the engine accepts.

pub mod run;

pub use run::RunConfig;
