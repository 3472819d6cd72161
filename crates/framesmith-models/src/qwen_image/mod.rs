//! Qwen-Image: the transformer (diffusers' `QwenImageTransformer2DModel`: config, timestep embedding, MSRoPE,
//! joint attention, dual-stream blocks, head) with the official key names, its blocks as the engine trains and
//! streams them (hand-written backward), the reader that says what a Qwen-Image transformer file is, and its VAE
//! (the Wan 2.1 architecture with Qwen-Image's normalisation).

pub mod attention;
pub mod block;
pub mod config;
pub mod embeddings;
pub mod latents;
#[cfg(test)]
mod lora_tests;
pub mod norm_out;
pub mod rope;
mod stream;
#[cfg(test)]
mod testkit;
mod trainable;
#[cfg(test)]
mod trainable_tests;
pub mod transformer;
#[cfg(test)]
mod transformer_tests;
pub mod vae;
pub mod weights;

pub use config::QwenImageConfig;
pub use transformer::{Prepared, QwenImageInputs, QwenImageTransformer};
