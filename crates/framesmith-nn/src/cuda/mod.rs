//! Framesmith's own CUDA kernels (`kernels/*.cu`, compiled to PTX by build.rs) as candle custom ops with CPU
//! references: FP8 dequantisation, RMSNorm / LayerNorm, modulation, gated residual, GELU-tanh, 3D RoPE, and (with the
//! `cudnn` feature) cuDNN's fused attention; plus what the CUDA libraries report about themselves (`libraries`).
//! Only built with the `cuda` feature; the public functions here take CUDA tensors and fall back to the portable
//! implementations for tensors on other devices.

// Launching kernels and handing raw device pointers to cuDNN are FFI calls that Rust cannot check: this module
// tree is the one place where the crate uses `unsafe` for CUDA. Each block says what it relies on.
#![allow(unsafe_code)]

#[cfg(feature = "cudnn")]
pub mod attention;
pub mod check;
pub mod device;
pub mod elementwise;
pub mod fp8;
pub mod gemm;
pub mod libraries;
pub mod mixed;
pub mod norm;
pub mod optim;
mod ptx;
pub mod rope;

pub use elementwise::{gated_residual, gelu_tanh, modulate};
pub use fp8::dequantize_fp8_cuda;
pub use norm::{layer_norm, rms_norm};
pub use rope::rope_apply;
