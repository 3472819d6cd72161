//! LTX-2 and LTX-2.3 (Lightricks' audio-video models, 19B and 22B): the transformer's config as a checkpoint's
//! embedded metadata gives it, and which release a file is.

pub mod config;

pub use config::{Ltx2Config, Ltx2Version};
