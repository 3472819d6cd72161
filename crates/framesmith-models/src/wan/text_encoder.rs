//! The umT5 text encoder of Wan (`T5Encoder` of `wan/modules/t5.py`) with its tokenizer: [`TextEncoder`] takes
//! prompts (`pipeline`), the tokenizer reads `tokenizer.json`, `spiece.model` or the SentencePiece model ComfyUI
//! stores inside the weights (`tokenizer`, `spiece`). The encoder itself is the shared [`crate::t5`].

mod pipeline;
mod spiece;
pub mod tokenizer;

pub use pipeline::{load_umt5_auto, t5_config_from_tensors, TextEncoder, TextEncoderError};
