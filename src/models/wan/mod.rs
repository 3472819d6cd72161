//! The Wan DiT (Wan 2.1 and 2.2): config, RoPE, embeddings, attention block, head and transformer.

pub mod config;

pub use config::{Generation, ModelType, WanConfig};
