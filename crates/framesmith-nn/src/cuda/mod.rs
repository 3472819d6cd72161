//! Framesmith's own CUDA kernels (`kernels/*.cu`, compiled to PTX by build.rs) as candle custom ops with CPU
//! references: FP8 dequantisation, RMSNorm / LayerNorm, modulation, gated residual, GELU-tanh, 3D RoPE, and (with the
//! `cudnn` feature) cuDNN's fused attention; plus what the CUDA libraries report about themselves (`libraries`).
//! Only built with the `cuda` feature; the public functions here take CUDA tensors and fall back to the portable
//! implementations for tensors on other devices.

// Launching kernels and handing raw device pointers to cuDNN are FFI calls that Rust cannot check: this module
// tree is the one place where the crate uses `unsafe` for CUDA. Each block says what it relies on.
#![allow(unsafe_code)]

/// `cpu_fwd` of a custom op that runs on CUDA only, for ops of one to three inputs: the public functions never
/// send CPU tensors to these ops, so reaching it is a bug of ours, reported with the op's name and the portable
/// function that computes the same on the CPU. Defined before the modules so that each of them can use it.
macro_rules! cuda_only_cpu_fwd {
    ($cpu_version:expr; $a:ident) => {
        cuda_only_cpu_fwd!(@impl CustomOp1, $cpu_version; $a);
    };
    ($cpu_version:expr; $a:ident, $b:ident) => {
        cuda_only_cpu_fwd!(@impl CustomOp2, $cpu_version; $a, $b);
    };
    ($cpu_version:expr; $a:ident, $b:ident, $c:ident) => {
        cuda_only_cpu_fwd!(@impl CustomOp3, $cpu_version; $a, $b, $c);
    };
    (@impl $op:ident, $cpu_version:expr; $($arg:ident),+) => {
        fn cpu_fwd(
            &self,
            $($arg: &candle_core::CpuStorage, _: &candle_core::Layout),+
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            $(let _ = $arg;)+
            Err($crate::cuda::cuda_only(<Self as candle_core::$op>::name(self), $cpu_version))
        }
    };
}

/// The error of a CUDA-only op given CPU tensors: `op` and where its CPU version is.
pub(crate) fn cuda_only(op: &str, cpu_version: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op} runs on CUDA only; {cpu_version} is the CPU version"
    ))
}

pub(crate) mod adapter;
#[cfg(feature = "cudnn")]
pub mod attention;
#[cfg(feature = "cudnn")]
pub mod attention_fp8;
pub mod check;
pub mod device;
pub mod elementwise;
pub mod fp8;
pub mod fp8_gemm;
pub mod gemm;
pub mod gemm_bias;
pub mod head_gate;
pub mod libraries;
mod lt;
pub mod mixed;
pub mod norm;
pub mod norm_mod;
pub mod optim;
mod ptx;
pub mod rms_rope;
pub mod rope;

pub use elementwise::{gated_residual, gelu_tanh, modulate};
pub use fp8::dequantize_fp8_cuda;
pub use norm::{layer_norm, rms_norm};
pub use rope::rope_apply;
