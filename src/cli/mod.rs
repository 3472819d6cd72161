//! The headless commands of the `framesmith` binary.

pub mod demo;
pub mod run;
