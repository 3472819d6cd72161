//! HunyuanVideo 1.5 (8.3B, T2V and I2V): the transformer with the official key names (config, embedders, the
//! Qwen2.5-VL text refiner, the byT5 glyph and SigLIP image conditioning, 3-D RoPE, the double-stream blocks
//! of `crate::mmdit`, head and unpatchify), its blocks as the engine trains and streams them, and its
//! checkpoint layouts (official, ComfyUI, diffusers), its prompt encoding (`text`) with the shared `qwen25vl`
//! text encoder, its byT5 glyph encoder (`byt5`), and its 3-D causal VAE (`vae`).

pub mod block;
pub mod byt5;
pub mod conditioning;
pub mod config;
pub mod embeddings;
pub mod layout;
pub mod lora_keys;
pub mod refiner;
pub mod rope;
#[cfg(test)]
mod testkit;
pub mod text;
mod trainable;
pub mod transformer;
pub mod vae;
pub mod weights;

pub use config::HunyuanVideo15Config;
pub use transformer::{HunyuanVideo15Inputs, HunyuanVideo15Transformer, Prepared};
