//! Qwen2.5-VL-7B's language model as a text encoder, shared by Qwen-Image and HunyuanVideo 1.5: config, decoder
//! layers and model (`Qwen2_5_VLTextModel` of transformers, official key names), Qwen2's tokenizer from the
//! user's files, Qwen-Image's prompt template and hidden-state selection, and the reader that names and loads
//! the files users have (ComfyUI single files, bf16 or FP8; Hugging Face / diffusers folders); the vision tower
//! with its image processor (`vision/`), the multimodal positions, and Qwen-Image-Edit's prompt encoding with
//! condition images (`edit`).

pub mod config;
pub mod edit;
pub mod encoder;
pub mod layer;
pub mod model;
pub mod mrope;
pub mod tokenizer;
pub mod vision;
pub mod weights;

#[cfg(test)]
mod tests;

pub use config::Qwen25VlTextConfig;
pub use edit::{encode_edit_prompt, EditPipeline, EditPromptOptions};
pub use encoder::{PromptEmbeds, Qwen25VlError, Qwen25VlTextEncoder};
pub use model::{LayerPlacement, Qwen25VlText};
pub use tokenizer::Qwen2Tokenizer;
pub use weights::{identify, load_text_model, LoadOptions, Qwen25VlFile, Qwen25VlFormatError};
