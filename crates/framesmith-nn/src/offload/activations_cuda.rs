//! Host activations on CUDA: each saved block input is copied device → host into a page-locked buffer on a copy
//! stream of its own while the forward pass goes on, and copied back host → device one block ahead of the
//! backward pass into a fresh device tensor. As in `cuda.rs`, the copy stream comes from the driver API (not
//! `CudaContext::new_stream`, which would switch every candle allocation to per-slice event tracking) and the
//! two streams are ordered with events only: compute → copy (the tensor exists), copy → compute (the copy is
//! done). candle frees a tensor's memory on the compute stream when the tensor drops, so a device tensor a copy
//! reads is kept until the compute stream has been made to wait for that copy.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaContext, CudaStream};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Device, Result, Shape, Tensor};

use super::arena::{Arena, HostChunk, Lent};
use super::cuda::{device_ptr, new_event, stream_wait, Pinned};

/// A page-locked buffer with the context it was allocated in, kept alive so the buffer stays valid.
pub(super) struct Pooled {
    buf: Pinned,
    ctx: Arc<CudaContext>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        // `buf` is freed right after this (fields drop after `drop`); freeing needs a current context.
        let _ = self.ctx.bind_to_thread();
    }
}

impl HostChunk for Pooled {
    fn base(&mut self) -> *mut u8 {
        self.buf.as_mut_slice().as_mut_ptr()
    }

    fn len(&self) -> usize {
        self.buf.len()
    }
}

/// Page-locked buffers kept between steps, so that a steady run allocates no page-locked memory: every step saves
/// buffers of the same sizes (one per block).
static POOL: Mutex<Vec<Pooled>> = Mutex::new(Vec::new());

/// Page-locked chunks set aside before the first step (`prelock.rs`), into which saved inputs are laid first.
static ARENA: Mutex<Option<Arena<Pooled>>> = Mutex::new(None);

/// Makes `chunks` the arena saved inputs are laid into from now on.
pub(super) fn install_arena(chunks: Vec<Pooled>) {
    if let Ok(mut arena) = ARENA.lock() {
        *arena = Some(Arena::new(chunks));
    }
}

/// Allocates page-locked chunks for an arena on another thread, in `dev`'s context.
pub(super) fn chunk_allocator(
    dev: &CudaDevice,
) -> impl FnMut(usize) -> std::result::Result<Pooled, String> + Send + 'static {
    let ctx = dev.cuda_stream().context().clone();
    move |bytes| {
        ctx.bind_to_thread()
            .w()
            .and_then(|()| Pinned::portable(bytes))
            .map(|buf| Pooled {
                buf,
                ctx: ctx.clone(),
            })
            .map_err(|e| e.to_string())
    }
}

/// A saved input's page-locked host buffer: a piece of the arena, or a pooled buffer of its own.
enum HostBuf {
    Lent(Lent<Pooled>),
    Own(Pooled),
}

impl HostBuf {
    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Lent(piece) => piece.as_slice(),
            Self::Own(pooled) => pooled.buf.as_slice(),
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Self::Lent(piece) => piece.as_mut_slice(),
            Self::Own(pooled) => pooled.buf.as_mut_slice(),
        }
    }
}

/// `bytes` of the arena when it has room, else the smallest pooled buffer that fits, else a new one.
fn take_host(ctx: &Arc<CudaContext>, bytes: usize) -> Result<HostBuf> {
    let lent = ARENA
        .lock()
        .ok()
        .and_then(|arena| arena.as_ref().and_then(|a| a.lend(bytes)));
    match lent {
        Some(piece) => Ok(HostBuf::Lent(piece)),
        None => take_pinned(ctx, bytes).map(HostBuf::Own),
    }
}

/// The smallest pooled buffer of at least `bytes`, else a new one. A pooled buffer too small for the request is
/// freed first, so the pool holds about one step's worth of the largest sizes seen.
fn take_pinned(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Pooled> {
    {
        let mut pool = POOL
            .lock()
            .map_err(|_| candle_core::Error::Msg("pinned buffer pool poisoned".into()))?;
        let fit = (0..pool.len())
            .filter(|&k| pool[k].buf.len() >= bytes)
            .min_by_key(|&k| pool[k].buf.len());
        if let Some(k) = fit {
            return Ok(pool.swap_remove(k));
        }
        let small = (0..pool.len()).max_by_key(|&k| pool[k].buf.len());
        if let Some(k) = small {
            drop(pool.swap_remove(k));
        }
    }
    // Freeing a pooled buffer binds its own context.
    ctx.bind_to_thread().w()?;
    Ok(Pooled {
        buf: Pinned::portable(bytes)?,
        ctx: ctx.clone(),
    })
}

/// Pools the buffers of their own; pieces of the arena go back to it (dropped).
fn give_back(bufs: impl IntoIterator<Item = HostBuf>) {
    let own = bufs.into_iter().filter_map(|buf| match buf {
        HostBuf::Own(pooled) => Some(pooled),
        HostBuf::Lent(_) => None,
    });
    if let Ok(mut pool) = POOL.lock() {
        pool.extend(own);
    }
}

/// Frees every pooled buffer and the arena (binding each buffer's context to the calling thread to do so); an
/// arena piece still out keeps its chunk until it is dropped.
pub(super) fn release_pool() {
    let bufs = match POOL.lock() {
        Ok(mut pool) => std::mem::take(&mut *pool),
        Err(_) => return,
    };
    drop(bufs);
    let arena = ARENA.lock().ok().and_then(|mut arena| arena.take());
    drop(arena);
}

/// The copy stream and its events.
struct Streams {
    ctx: Arc<CudaContext>,
    /// candle's stream (for device addresses).
    stream: Arc<CudaStream>,
    compute: sys::CUstream,
    copy: sys::CUstream,
    /// Recorded on the compute stream whenever a copy must come after the work queued so far.
    queued: sys::CUevent,
    /// Events nothing waits on any more, for reuse.
    spare: Vec<sys::CUevent>,
    /// Every event made, destroyed on drop.
    all: Vec<sys::CUevent>,
}

impl Streams {
    fn event(&mut self) -> Result<sys::CUevent> {
        if let Some(e) = self.spare.pop() {
            return Ok(e);
        }
        let e = new_event()?;
        self.all.push(e);
        Ok(e)
    }

    /// Makes the copy stream wait for everything queued on the compute stream so far.
    fn copy_after_compute(&self) -> Result<()> {
        // SAFETY: live event and stream of this context.
        unsafe { result::event::record(self.queued, self.compute) }.w()?;
        stream_wait(self.copy, self.queued)
    }

    /// Records a fresh event on the copy stream (after every copy queued so far).
    fn mark_copy(&mut self) -> Result<sys::CUevent> {
        let e = self.event()?;
        // SAFETY: live event on the live copy stream.
        unsafe { result::event::record(e, self.copy) }.w()?;
        Ok(e)
    }

    /// Makes compute queued from now on wait for `event` (a copy), then keeps the event for reuse: a wait
    /// captures the event's state when it is queued.
    fn compute_after(&mut self, event: sys::CUevent) -> Result<()> {
        stream_wait(self.compute, event)?;
        self.spare.push(event);
        Ok(())
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the handles are ours; after the synchronisation nothing of ours runs on the copy stream, and
        // the driver releases an event or a stream a queued wait still refers to once that wait is done.
        unsafe {
            let _ = result::stream::synchronize(self.copy);
            for &e in self.all.iter().chain([&self.queued]) {
                let _ = result::event::destroy(e);
            }
            let _ = result::stream::destroy(self.copy);
        }
    }
}

/// One saved input in host memory.
struct Saved {
    host: HostBuf,
    bytes: usize,
    shape: Shape,
    dtype: DType,
    /// The device tensor while the copy to the host may still read it (the latest input only).
    device: Option<Tensor>,
    /// Recorded on the copy stream after the device → host copy.
    stored: Option<sys::CUevent>,
}

/// An input on its way back to the device.
struct Upload {
    /// Index in `saved` of the input it brings back.
    index: usize,
    tensor: Tensor,
    done: sys::CUevent,
}

/// The CUDA host-activation stash of one step.
pub(super) struct HostStash {
    device: Device,
    saved: Vec<Saved>,
    ahead: Option<Upload>,
    /// Buffers of inputs already taken back; returned to the pool (or the arena) once the copy stream is idle.
    spent: Vec<HostBuf>,
    // Declared last: dropped after the tensors above, which the copy stream may read until its synchronisation.
    streams: Streams,
}

impl HostStash {
    pub(super) fn new(dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        let ctx = stream.context().clone();
        ctx.bind_to_thread().w()?;
        let copy = result::stream::create(result::stream::StreamKind::NonBlocking).w()?;
        let queued = match new_event() {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: the stream was just made and nothing is queued on it.
                let _ = unsafe { result::stream::destroy(copy) };
                return Err(e);
            }
        };
        Ok(Self {
            device: Device::Cuda(dev.clone()),
            saved: Vec::new(),
            ahead: None,
            spent: Vec::new(),
            streams: Streams {
                ctx,
                compute: stream.cu_stream(),
                stream,
                copy,
                queued,
                spare: Vec::new(),
                all: Vec::new(),
            },
        })
    }

    pub(super) fn len(&self) -> usize {
        self.saved.len()
    }

    /// Starts copying `xs` to a page-locked buffer once the work queued so far has produced it; lets the
    /// previous input's device memory go (compute waits for its copy first).
    pub(super) fn push(&mut self, xs: Tensor) -> Result<()> {
        self.streams.ctx.bind_to_thread().w()?;
        for s in &mut self.saved {
            if let Some(stored) = s.stored.take() {
                self.streams.compute_after(stored)?;
            }
            s.device = None;
        }
        let xs = xs.contiguous()?;
        let bytes = xs.elem_count() * xs.dtype().size_in_bytes();
        let mut host = take_host(&self.streams.ctx, bytes)?;
        let src = device_ptr(&xs, &self.streams.stream)?;
        self.streams.copy_after_compute()?;
        if bytes > 0 {
            let dst = &mut host.as_mut_slice()[..bytes];
            // SAFETY: `src` is `bytes` bytes of `xs`, which stays alive (kept in `device`) until compute has
            // waited for this copy; `dst` is page-locked and stays in the stash until the copy stream is idle.
            unsafe { result::memcpy_dtoh_async(dst, src, self.streams.copy) }.w()?;
        }
        let stored = self.streams.mark_copy()?;
        self.saved.push(Saved {
            host,
            bytes,
            shape: xs.shape().clone(),
            dtype: xs.dtype(),
            device: Some(xs),
            stored: Some(stored),
        });
        Ok(())
    }

    /// The latest input not yet taken, ordered before compute queued after this; starts bringing back the next.
    pub(super) fn pop(&mut self) -> Result<Option<Tensor>> {
        self.streams.ctx.bind_to_thread().w()?;
        let Some(mut saved) = self.saved.pop() else {
            return Ok(None);
        };
        let index = self.saved.len();
        let tensor = match saved.device.take() {
            // Still on the device (the last input of the forward pass): no copy back. Its memory may be freed
            // once it is dropped, so compute waits for the copy reading it.
            Some(t) => {
                if let Some(stored) = saved.stored.take() {
                    self.streams.compute_after(stored)?;
                }
                t
            }
            None => {
                let upload = match self.ahead.take() {
                    Some(u) if u.index == index => u,
                    other => {
                        self.ahead = other;
                        Self::start_upload(&mut self.streams, &self.device, index, &saved)?
                    }
                };
                self.streams.compute_after(upload.done)?;
                upload.tensor
            }
        };
        if let Some(stored) = saved.stored.take() {
            self.streams.compute_after(stored)?;
        }
        self.spent.push(saved.host);
        if self.ahead.is_none() && index > 0 {
            if let Some(next) = self.saved.get(index - 1).filter(|s| s.device.is_none()) {
                let upload = Self::start_upload(&mut self.streams, &self.device, index - 1, next)?;
                self.ahead = Some(upload);
            }
        }
        Ok(Some(tensor))
    }

    /// Queues the copy of `saved` (number `index`) back into a fresh device tensor (allocated on the compute
    /// stream, so the copy waits for the work queued so far).
    fn start_upload(
        streams: &mut Streams,
        device: &Device,
        index: usize,
        saved: &Saved,
    ) -> Result<Upload> {
        // SAFETY (uninitialised memory): the copy below writes every byte before compute may read the tensor;
        // whoever takes it makes compute wait for `done` first.
        let tensor = unsafe { Tensor::empty(saved.shape.clone(), saved.dtype, device) }?;
        let dst = device_ptr(&tensor, &streams.stream)?;
        streams.copy_after_compute()?;
        if saved.bytes > 0 {
            let src = &saved.host.as_slice()[..saved.bytes];
            // SAFETY: `dst` is a fresh tensor of `bytes` bytes whose allocation is ordered before this copy (the
            // wait above); `src` is page-locked and stays in the stash until the copy stream is idle.
            unsafe { result::memcpy_htod_async(dst, src, streams.copy) }.w()?;
        }
        let done = streams.mark_copy()?;
        Ok(Upload {
            index,
            tensor,
            done,
        })
    }
}

impl Drop for HostStash {
    fn drop(&mut self) {
        let _ = self.streams.ctx.bind_to_thread();
        // SAFETY: the copy stream is ours and live; once it is idle no copy reads or writes a buffer or tensor.
        let _ = unsafe { result::stream::synchronize(self.streams.copy) };
        give_back(
            self.spent
                .drain(..)
                .chain(self.saved.drain(..).map(|s| s.host)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_len() -> usize {
        POOL.lock().map_or(0, |p| p.len())
    }

    // Needs a CUDA GPU: runs in cuda builds on the test machine, never in CPU CI (which does not compile this
    // module).
    #[test]
    fn saved_inputs_come_back_exactly_and_steady_steps_reuse_the_pool() -> Result<()> {
        let dev = Device::new_cuda(0)?;
        let Device::Cuda(cuda) = &dev else {
            candle_core::bail!("not a CUDA device");
        };
        let mut pooled = Vec::new();
        for _ in 0..3 {
            let mut stash = HostStash::new(cuda)?;
            let mut expected = Vec::new();
            let mut xs = Tensor::randn(0f32, 1.0, (96, 64), &dev)?;
            for i in 0..6 {
                // Contiguous f32, a transposed view and bf16; the caller's handle drops right away and new
                // tensors are allocated, so memory a pending copy reads would be reused if it were freed early.
                let input = match i % 3 {
                    0 => xs.clone(),
                    1 => xs.t()?,
                    _ => xs.to_dtype(DType::BF16)?,
                };
                expected.push(input.to_device(&Device::Cpu)?);
                stash.push(input)?;
                xs = ((xs * 1.5)?.sin()? + 0.25)?;
            }
            assert_eq!(stash.len(), 6);
            for want in expected.iter().rev() {
                let got = stash
                    .pop()?
                    .ok_or_else(|| candle_core::Error::Msg("empty".into()))?;
                let scratch = (got.to_dtype(DType::F32)? * 2.0)?;
                assert_eq!(got.dims(), want.dims());
                assert_eq!(got.dtype(), want.dtype());
                let diff = (got.to_device(&Device::Cpu)?.to_dtype(DType::F32)?
                    - want.to_dtype(DType::F32)?)?
                .abs()?
                .max_all()?
                .to_scalar::<f32>()?;
                assert_eq!(diff, 0.0);
                drop(scratch);
            }
            assert!(stash.pop()?.is_none());
            drop(stash);
            pooled.push(pool_len());
        }
        assert!(pooled[0] >= 6, "{pooled:?}");
        assert_eq!(
            pooled[1], pooled[0],
            "a steady step allocated page-locked memory"
        );
        assert_eq!(
            pooled[2], pooled[0],
            "a steady step allocated page-locked memory"
        );
        Ok(())
    }
}
