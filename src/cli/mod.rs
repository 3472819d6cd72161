//! The headless commands of the `framesmith` binary.

pub mod cache;
pub mod demo;
pub mod doctor;
pub mod generate;
pub mod interrupt;
pub mod lora;
pub mod models;
pub mod plan;
pub mod ranks;
pub mod run;
