//! LTX-2's data: its latent and text-encoder caches in the format of musubi-tuner's LTX-2 branch ([`cache`]).

pub mod cache;
