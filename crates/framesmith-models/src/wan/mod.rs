//! The Wan DiT (Wan 2.1 and 2.2): config, RoPE, embeddings, attention block, head and transformer.

pub mod block;
pub mod clip;
pub mod config;
pub mod embeddings;
pub mod lora_keys;
pub mod random;
pub mod rope;
pub mod text_encoder;
mod trainable;
pub mod transformer;
pub mod vae;
pub mod weights;

#[cfg(test)]
mod tests;

pub use config::{Generation, ModelType, WanConfig};
pub use transformer::{ModelOptions, Prepared, Timesteps, WanInputs, WanModel};
