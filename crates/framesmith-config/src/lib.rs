//! Run configuration: `RunConfig` (serde/TOML), presets and validation into the `RunPlan` the engine accepts, and
//! the protocol between the app and the engine. Plain data: no tensors, no GUI.

pub mod catalog;
pub mod error;
mod family;
pub mod file_read;
pub mod io;
pub mod metrics;
pub mod outputs;
pub mod plan;
pub mod presets;
pub mod protocol;
pub mod run;
pub mod schedule;
pub mod text_file;
pub mod tools;
pub mod training;
pub mod validate;
mod validate_model;
mod validate_train;
mod validate_validation;

pub use validate_validation::MAX_VALIDATION_TIMESTEPS;

pub use error::ConfigError;
pub use family::{family_settings, FamilySetting};
pub use plan::{HostInfo, ModelFamily, RunPlan};
pub use presets::{FieldChange, Preset, PresetApplied};
pub use run::RunConfig;
pub use validate::{check_settings, validate, validate_for, Problem, ValidationErrors};
