//! Device-level helpers for measuring on CUDA: event timing on candle's stream and the stream-ordered memory
//! pool's high-water mark (the equivalent of PyTorch's `max_memory_allocated`), plus the pool's release
//! threshold so memory is not handed back to the driver at every synchronisation.

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaEvent};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, Result};

fn pool(dev: &CudaDevice) -> Result<sys::CUmemoryPool> {
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    ctx.bind_to_thread().w()?;
    // SAFETY: queries the default pool of the context's own device, which lives as long as the context.
    unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }.w()
}

fn pool_attr(dev: &CudaDevice, attr: sys::CUmemPool_attribute) -> Result<u64> {
    let pool = pool(dev)?;
    let mut value = 0u64;
    // SAFETY: the attributes read here are 64-bit values; `value` outlives the call.
    unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) }
        .result()
        .w()?;
    Ok(value)
}

fn set_pool_attr(dev: &CudaDevice, attr: sys::CUmemPool_attribute, mut value: u64) -> Result<()> {
    let pool = pool(dev)?;
    // SAFETY: as above; the driver reads the 64-bit value during the call.
    unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut value as *mut u64).cast()) }
        .result()
        .w()
}

/// High-water mark of the bytes handed out by the pool since the last [`reset_peak_memory`].
pub fn peak_memory_bytes(dev: &CudaDevice) -> Result<u64> {
    pool_attr(dev, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
}

/// Bytes currently allocated from the pool.
pub fn used_memory_bytes(dev: &CudaDevice) -> Result<u64> {
    pool_attr(
        dev,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    )
}

/// Restarts the high-water mark from the memory in use now.
pub fn reset_peak_memory(dev: &CudaDevice) -> Result<()> {
    set_pool_attr(
        dev,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        0,
    )
}

/// Lets the pool keep up to `bytes` of freed memory across synchronisations instead of returning it to the
/// driver (the default threshold, 0, makes every synchronize release memory that is then allocated again).
pub fn set_pool_release_threshold(dev: &CudaDevice, bytes: u64) -> Result<()> {
    set_pool_attr(
        dev,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        bytes,
    )
}

/// A pair of timing events around work queued on the device's stream.
pub struct EventTimer {
    start: CudaEvent,
    end: CudaEvent,
}

impl EventTimer {
    /// Records the start event now.
    pub fn start(dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream.record_event(flags).w()?;
        let end = stream.context().new_event(flags).w()?;
        Ok(Self { start, end })
    }

    /// Records the end event and waits for it: milliseconds between the two.
    pub fn stop(self, dev: &CudaDevice) -> Result<f64> {
        self.end.record(&dev.cuda_stream()).w()?;
        Ok(f64::from(self.start.elapsed_ms(&self.end).w()?))
    }
}
