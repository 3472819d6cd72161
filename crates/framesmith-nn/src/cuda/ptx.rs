//! The embedded PTX modules and the helpers every kernel wrapper uses: picking the PTX for the device's compute
//! capability, launch configurations, and contiguous views of candle's CUDA storage.

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaView, LaunchConfig};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result};

/// One `kernels/*.cu` file, as PTX for compute capability 8.0 and 9.0.
pub struct Module {
    /// Module name, unique per file (the compute capability is appended when loading).
    pub name: &'static str,
    /// PTX for `compute_80` (Ampere and newer, compiled by the driver).
    pub sm80: &'static str,
    /// PTX for `compute_90` (Hopper and newer).
    pub sm90: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/framesmith_kernels.rs"));

/// Threads per block for row-wise kernels and element-wise grid-stride loops.
pub const THREADS: u32 = 256;

/// Loads `function` of `module` on `dev`, choosing the PTX built for the device's compute capability.
/// Launch through `dev.cuda_stream().launch_builder(&func)`: candle's own launcher type is not public.
pub fn load(dev: &CudaDevice, module: &Module, function: &str) -> Result<CudaFunction> {
    let stream = dev.cuda_stream();
    let (major, _) = stream.context().compute_capability().w()?;
    let func = if major >= 9 {
        dev.get_or_load_custom_func(function, &format!("{}_sm90", module.name), module.sm90)?
    } else {
        dev.get_or_load_custom_func(function, &format!("{}_sm80", module.name), module.sm80)?
    };
    Ok(func.into_cuda_function())
}

/// Grid-stride launch over `n` elements (or `n` vectors of elements): enough blocks to fill the GPU several
/// times, never more than the work needs.
pub fn elementwise_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 132 * 16);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row.
pub fn row_config(rows: usize) -> Result<LaunchConfig> {
    let rows = u32::try_from(rows)
        .map_err(|_| candle_core::Error::Msg(format!("too many rows ({rows})")))?;
    Ok(LaunchConfig {
        grid_dim: (rows.max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The kernel-name suffix for an activation dtype (`f32` or `bf16`, the two the kernels are built for).
pub fn suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => candle_core::bail!("framesmith CUDA kernels take f32 or bf16, not {other:?}"),
    }
}

/// The contiguous elements of a tensor's storage as a typed view. Fails for strided layouts: the public wrappers
/// make their inputs contiguous first.
pub fn view<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<CudaView<'a, T>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("framesmith CUDA kernel given a non-contiguous tensor");
    };
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

/// Converts a size to the `long` (i64) the kernels take.
pub fn long(n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| candle_core::Error::Msg(format!("size {n} does not fit in i64")))
}
