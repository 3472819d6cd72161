//! FLUX.1 (dev, schnell, Kontext): the DiT (config, RoPE, embeddings, modulation, attention, double- and
//! single-stream blocks, head, transformer), the autoencoder, the CLIP-L and T5-XXL text encoders, the sampling
//! helpers (schedule, packing) and the file reader that says what a FLUX.1 file is.

pub mod attention;
pub mod autoencoder;
pub mod block;
pub mod clip_text;
pub mod config;
pub mod double_block;
pub mod embeddings;
pub mod last_layer;
pub mod modulation;
pub mod rope;
pub mod sampling;
pub mod single_block;
mod stream;
#[cfg(test)]
pub(crate) mod testkit;
pub mod text_encoder;
pub mod tokenizer;
mod trainable;
pub mod transformer;
pub mod weights;

#[cfg(test)]
mod tests;

pub use config::FluxConfig;
pub use transformer::{Flux, FluxInputs, Prepared};
