//! Framesmith: LoRA training for Wan video diffusion transformers.

pub mod bench;
pub mod config;
pub mod data;
pub mod demo;
pub mod models;
pub mod nn;
pub mod parity;
pub mod protocol;
pub mod train;
pub mod video;
