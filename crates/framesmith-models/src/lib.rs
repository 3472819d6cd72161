//! Model definitions and the trait the engine trains them through (`trainable`). Pure tensor code: no channels,
//! config files or logging policy.

pub mod adapter_file;
mod checkpoint;
pub mod decoder;
pub mod fixtures;
pub mod flux;
pub mod gemma3;
pub mod hunyuan_video15;
pub mod identify;
pub mod lora_tools;
pub mod ltx2;
pub mod mmdit;
pub mod modulated;
pub mod qwen25vl;
pub mod qwen_image;
pub mod resample;
pub mod siglip;
pub mod t5;
pub mod trainable;
pub mod wan;
