//! The data each model family caches in its own format, one folder per family; what every family shares (the
//! dataset, buckets, frames, Wan's musubi-tuner caches) stays at the crate's top.

pub mod flux;
pub mod hunyuan_video15;
pub mod ltx2;
pub mod qwen_image;
