//! HunyuanVideo 1.5's data: its latent and text-encoder caches in musubi-tuner's format ([`cache`]).

pub mod cache;
