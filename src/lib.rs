//! Framesmith: LoRA training for Wan video diffusion transformers.

pub mod models;
pub mod nn;
pub mod bench;
