//! Training data: musubi-tuner dataset configs, dataset scans and reports, buckets, frame extraction, media
//! decoding through ffmpeg, latent / text-encoder caches in musubi-tuner's format, and H.264 MP4 writing
//! (`video`). No GUI, no model code.

pub mod bucket;
pub mod cache;
pub mod clip_cache;
pub mod config;
pub mod control;
pub mod entries;
pub mod family;
pub mod frames;
pub mod image_cache;
pub mod jsonl;
mod keys;
pub mod media;
pub mod media_foundation;
pub mod probe;
pub mod problem;
pub mod prompt_cache;
pub mod report;
pub mod resize;
pub mod resolve;
pub mod samples;
pub mod scan;
pub mod tensor_file;
mod tool_message;
pub mod validate;
pub mod verify;
pub mod video;

pub use config::{
    ConfigError, DatasetConfig, DatasetKind, DatasetSection, DatasetSource, FrameExtraction,
    GeneralSection, ParsedConfig, Resolution, ResolvedDataset, VideoParams,
};
pub use problem::{Problem, Severity, Unreadable};
pub use report::{check_path, DatasetReport};
pub use scan::ScanOptions;
pub use validate::{load_valid, load_valid_with, validate, ValidConfig};
