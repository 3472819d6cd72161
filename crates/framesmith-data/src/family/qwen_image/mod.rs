//! Qwen-Image's data: its latent and text-encoder caches ([`cache`]).

pub mod cache;
