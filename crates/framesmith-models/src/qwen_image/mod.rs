//! Qwen-Image: the transformer (diffusers' `QwenImageTransformer2DModel`: config, timestep embedding, MSRoPE,
//! joint attention, dual-stream blocks, head) with the official key names, its blocks as the engine trains and
//! streams them (hand-written backward), the reader that says what a Qwen-Image transformer file is, and its VAE
//! (the Wan 2.1 architecture with Qwen-Image's normalisation).

pub mod config;
pub mod embeddings;
pub mod latents;
pub mod norm_out;
pub mod rope;
#[cfg(test)]
mod testkit;
mod trainable;
pub mod transformer;
pub mod vae;
pub mod weights;

#[cfg(test)]
mod tests;

pub use config::QwenImageConfig;
pub use transformer::{Prepared, QwenImageInputs, QwenImageTransformer};
