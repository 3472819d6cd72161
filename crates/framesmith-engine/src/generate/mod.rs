//! Generation: the one call the command line and the app generate through ([`run`], with its plain-data request
//! and events in [`request`]), the flow-matching samplers and the solver choice ([`sampler`]), sample prompt files
//! ([`prompts`]). What a family generates with lives in its folder under [`crate::family`].

pub mod frames;
pub mod prompts;
pub mod request;
pub mod run;
pub mod sampler;

pub use run::run;
