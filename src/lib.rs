//! Framesmith: LoRA training for Wan video diffusion transformers.

pub mod data;
pub mod models;
pub mod nn;
