//! The built-in demo project: a generated dataset of moving shapes, a lossless demo codec and a demo text
//! embedding, so a tiny Wan-architecture model trains on CPU with no downloads. Everything here is demo-only.

pub mod base;
pub mod codec;
pub mod project;
pub mod shapes;
pub mod text;
