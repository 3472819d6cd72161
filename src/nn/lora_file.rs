//! LoRA files (placeholder).
