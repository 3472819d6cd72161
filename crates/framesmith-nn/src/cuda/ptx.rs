//! The embedded kernel modules and the helpers every kernel wrapper uses: loading a module's function on a device,
//! launch configurations, and contiguous views of candle's CUDA storage.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaView, LaunchConfig};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDType, DeviceId, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

/// One `kernels/*.cu` file as a fat binary: machine code for [`SASS_ARCHS`] and PTX for compute capability 8.0,
/// which the driver compiles for any other architecture from 8.0 on.
pub struct Module {
    /// Module name, unique per file.
    pub name: &'static str,
    /// The fat binary.
    pub image: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/framesmith_kernels.rs"));

/// Threads per block for row-wise kernels and element-wise grid-stride loops.
pub const THREADS: u32 = 256;

/// Modules loaded so far, by device and module name.
type Loaded = Mutex<HashMap<(DeviceId, &'static str), Arc<CudaModule>>>;

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(Mutex::default)
}

/// Loads `function` of `module` on `dev` (the module once per device; the driver picks the machine code of the
/// device's architecture or compiles the PTX). Launch through `dev.cuda_stream().launch_builder(&func)`.
pub fn load(dev: &CudaDevice, module: &Module, function: &str) -> Result<CudaFunction> {
    let key = (dev.id(), module.name);
    let mut modules = loaded().lock().unwrap_or_else(PoisonError::into_inner);
    let cuda_module = match modules.get(&key) {
        Some(m) => m.clone(),
        None => {
            let m = dev
                .cuda_stream()
                .context()
                .load_module(Ptx::from_binary(module.image.to_vec()))
                .w()?;
            modules.insert(key, m.clone());
            m
        }
    };
    drop(modules);
    cuda_module.load_function(function).w()
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

/// The CUDA storage of a tensor's storage, or an error naming `op` for a tensor elsewhere (the wrappers that launch
/// outside candle's custom ops read their inputs' storages directly).
pub fn cuda_storage<'a>(s: &'a Storage, op: &str) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        _ => candle_core::bail!("{op} given a tensor that is not on CUDA"),
    }
}

/// A kernel's output as a tensor of `shape` outside autograd.
pub fn untracked(out: CudaStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(out), shape, BackpropOp::none(), false)
}
