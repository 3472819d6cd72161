//! The headless commands of the `framesmith` binary.

pub mod cache;
pub mod demo;
pub mod generate;
pub mod models;
pub mod run;
