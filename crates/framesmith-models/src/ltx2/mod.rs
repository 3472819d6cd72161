//! LTX-2 and LTX-2.3 (Lightricks' audio-video models, 19B and 22B): the transformer with ltx-core's key names
//! (config read from a checkpoint's embedded metadata, the AdaLN timestep embeddings, the split RoPE over
//! positions in seconds and pixels, the blocks with their hand-written backward, the heads). Text-to-video reads
//! and runs the video stream only (with no audio the official blocks skip the audio stream and the audio-video
//! cross-attentions); read with audio, a batch with audio latents runs both streams and the cross-attentions
//! between them, as joint audio-video training does. First-frame conditioning (image-to-video training) gives
//! the leading video tokens timestep 0: their AdaLN rows, audio-video scale and shift rows and head modulation
//! are per token, and the loss leaves them out.
//! The video VAE ([`vae`]) encodes clips to the normalised latents the transformer takes and decodes them,
//! whole or in ltx-core's tiles. The text side ([`text`]): Gemma 3's hidden states through the release's
//! feature extractor and the video connector, into what the cross-attention reads.

pub mod audio;
pub mod block;
pub mod config;
pub mod embeddings;
pub mod layout;
pub mod lora_keys;
pub mod rope;
mod stream;
#[cfg(test)]
mod testkit;
pub mod text;
mod trainable;
pub mod transformer;
pub mod vae;
pub mod weights;

pub use config::{Ltx2Config, Ltx2Version};
pub use trainable::{joint_loss_view, loss_views};
pub use transformer::{Ltx2AudioInputs, Ltx2Inputs, Ltx2Transformer, Prepared};
