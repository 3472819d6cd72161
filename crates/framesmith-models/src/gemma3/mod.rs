//! Gemma 3's language model as a text encoder (LTX-2's and LTX-2.3's: Gemma 3 12B): config, decoder layers and
//! model (`Gemma3TextModel` of transformers, official key names) giving every hidden state, the tokenizer from the
//! user's files with LTX-2's prompt handling, and the reader that names and loads the files users have (the
//! official Hugging Face folder, ComfyUI's single file, ltx-core's packed single file).

pub mod config;
pub mod layer;
pub mod model;
pub mod tokenizer;
pub mod weights;

#[cfg(test)]
mod tests;

pub use config::{Gemma3TextConfig, LayerType};
pub use model::{Gemma3Text, LayerPlacement};
pub use tokenizer::{GemmaTokenizer, GemmaTokenizerError, PaddedPrompt, LTX2_MAX_LENGTH};
pub use weights::{identify, load_text_model, Gemma3File, Gemma3FormatError, LoadOptions};
