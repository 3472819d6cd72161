//! The Qwen2.5-VL vision tower and its image processor, shared by every family that encodes images with
//! Qwen2.5-VL (Qwen-Image-Edit): sizes, blocks and tower (`Qwen2_5_VisionTransformerPretrainedModel` of
//! transformers, checkpoint names without `visual.`), the window index arithmetic, the
//! `Qwen2VLImageProcessor` steps (resizing Pillow-exactly with [`crate::resample`]), and the loader for the files
//! users have.

pub mod block;
pub mod config;
pub mod model;
pub mod processor;
pub mod weights;
pub mod window;

#[cfg(test)]
pub(super) mod tests;

pub use config::{Qwen25VlVisionConfig, VisionConfigError};
pub use model::Qwen25VlVision;
pub use processor::{smart_resize, ImageProcessorConfig, ProcessedImages, ProcessorError};
pub use weights::{load_vision_model, VisionLoadOptions};
pub use window::Grid;
