//! Framesmith: LoRA training for Wan video diffusion transformers.

pub mod bench;
pub mod models;
pub mod nn;
