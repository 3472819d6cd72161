//! The dual-stream (MMDiT) block that Qwen-Image and HunyuanVideo 1.5 share: joint attention over text and image
//! tokens with per-stream projections, q/k RMSNorm and RoPE tables, modulated LayerNorms, gated residuals and
//! GELU-tanh MLPs; its hand-written backward, block streaming, the stack of blocks a transformer runs and the
//! [`crate::trainable::TrainableBlock`] impl. A family builds the blocks under its own weight names and its own
//! RoPE positions.

pub mod attention;
pub mod block;
pub mod rope;
mod stack;
mod stream;
mod trainable;

pub use attention::{JointAttention, StreamQkv};
pub use block::grad::DualStreamTape;
pub use block::{BlockInputs, DualStreamBlock, FeedForward, Modulation};
pub use rope::{Rope, RopeTable};
pub use stack::{BlockStack, Prepared};
