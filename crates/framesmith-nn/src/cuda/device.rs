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

/// Device memory set aside so the engine can use only a budget of the card (`--vram-budget-gb`): allocated
/// outside the stream-ordered pool, held until dropped. A run on a large card then fails its allocations where
/// a card of the budget's size would.
pub struct VramReservation {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl VramReservation {
    /// Reserves what is free on `dev` beyond a card of `budget` bytes: memory already in use (this process's
    /// CUDA context and anything else on the card) counts against the budget, as it would on a card of that size.
    /// `None` when no more than that is free.
    pub fn leave_budget(dev: &CudaDevice, budget: u64) -> Result<Option<Self>> {
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread().w()?;
        let (free, total) = result::mem_get_info().w()?;
        let (free, total) = (free as u64, total as u64);
        let allowed = budget.saturating_sub(total.saturating_sub(free));
        let Some(extra) = free.checked_sub(allowed).filter(|&b| b > 0) else {
            return Ok(None);
        };
        let bytes = usize::try_from(extra).unwrap_or(usize::MAX);
        // SAFETY: a plain allocation of `bytes`, freed exactly once in `drop`.
        let ptr = unsafe { result::malloc_sync(bytes) }.w()?;
        Ok(Some(Self { ptr, bytes }))
    }

    /// Bytes held back.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for VramReservation {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync` in `leave_budget`; nothing else refers to it.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// The device's compute capability (major, minor).
pub fn compute_capability(dev: &CudaDevice) -> Result<(u32, u32)> {
    let (major, minor) = dev.cuda_stream().context().compute_capability().w()?;
    let to_u32 = |v: i32| u32::try_from(v).unwrap_or(0);
    Ok((to_u32(major), to_u32(minor)))
}

/// How this build's kernels run on `dev`: as their machine code for its architecture, or as PTX the driver
/// compiles on first use (and caches).
pub fn kernel_code_line(dev: &CudaDevice) -> Result<String> {
    let (major, minor) = compute_capability(dev)?;
    let arch = major * 10 + minor;
    let built: Vec<String> = super::ptx::SASS_ARCHS
        .iter()
        .map(|a| format!("sm_{a}"))
        .collect();
    Ok(if super::ptx::SASS_ARCHS.contains(&arch) {
        format!(
            "kernels: machine code for sm_{arch} (built for {})",
            built.join(", ")
        )
    } else {
        format!(
            "kernels: no machine code for sm_{arch} in this build ({}), so the driver compiles their PTX on \
             first use (slower first step; cached for the next runs)",
            if built.is_empty() { "PTX only".to_string() } else { built.join(", ") }
        )
    })
}

/// Free and total device memory in bytes.
pub fn memory_info(dev: &CudaDevice) -> Result<(u64, u64)> {
    dev.cuda_stream().context().bind_to_thread().w()?;
    let (free, total) = result::mem_get_info().w()?;
    Ok((free as u64, total as u64))
}

/// GB/s of a plain page-locked host → device copy of `bytes` (best of `reps`), on a stream of its own.
pub fn pinned_copy_bandwidth(dev: &CudaDevice, bytes: usize, reps: usize) -> Result<f64> {
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    // SAFETY: fresh allocations freed below; the copy reads `host` only after it is written.
    unsafe {
        let host = result::malloc_host(bytes, 0).w()?;
        std::ptr::write_bytes(host.cast::<u8>(), 1, bytes);
        let dst = result::malloc_sync(bytes).w()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking).w()?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let (start, end) = (
            result::event::create(flags).w()?,
            result::event::create(flags).w()?,
        );
        let src = std::slice::from_raw_parts(host.cast::<u8>(), bytes);
        let mut best = 0f64;
        for _ in 0..reps.max(1) {
            result::event::record(start, stream).w()?;
            result::memcpy_htod_async(dst, src, stream).w()?;
            result::event::record(end, stream).w()?;
            result::event::synchronize(end).w()?;
            let ms = f64::from(result::event::elapsed(start, end).w()?);
            best = best.max(bytes as f64 / (ms / 1e3) / 1e9);
        }
        let _ = result::event::destroy(start);
        let _ = result::event::destroy(end);
        let _ = result::stream::destroy(stream);
        let _ = result::free_sync(dst);
        let _ = result::free_host(host);
        Ok(best)
    }
}

/// High-water mark of the memory the pool has reserved from the driver since the last
/// [`reset_peak_reserved`] — what a run actually takes from the card (used memory plus the pool's
/// fragmentation), the number a VRAM budget has to hold.
pub fn peak_reserved_bytes(dev: &CudaDevice) -> Result<u64> {
    pool_attr(
        dev,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
    )
}

/// Memory the pool holds from the driver now (in use or cached for reuse).
pub fn reserved_bytes(dev: &CudaDevice) -> Result<u64> {
    pool_attr(
        dev,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    )
}

/// Waits for the device's stream, then hands every pool chunk that holds no live allocation back to the driver.
/// Between training steps only the run's lasting tensors are alive; what the step left cached in the pool is
/// released, so the next step lays out its memory from the same start as the first did (a pool that keeps
/// step 1's free blocks splits them differently in step 2 and needs more than step 1 did).
pub fn trim_pool(dev: &CudaDevice) -> Result<()> {
    dev.cuda_stream().synchronize().w()?;
    let pool = pool(dev)?;
    // SAFETY: trims the context's own default pool after its stream finished; live allocations are kept.
    unsafe { result::mem_pool::trim_to(pool, 0) }.w()
}

/// Restarts the reserved high-water mark.
pub fn reset_peak_reserved(dev: &CudaDevice) -> Result<()> {
    set_pool_attr(
        dev,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        0,
    )
}
