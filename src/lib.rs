//! Framesmith: LoRA training for Wan video diffusion transformers.

#[cfg(feature = "gui")]
pub mod app;
pub mod bench;
pub mod config;
pub mod data;
pub mod demo;
pub mod models;
pub mod nn;
pub mod parity;
pub mod platform;
pub mod protocol;
#[cfg(feature = "telemetry")]
pub mod telemetry;
pub mod train;
pub mod video;
