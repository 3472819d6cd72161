//! Host activations in ordinary (pageable) RAM on CUDA, for runs that promise little page-locked memory
//! (`memory.streaming = "staged"`): on Windows page-locked memory is shared GPU memory, the very thing such a run
//! exists to avoid. As block streaming's `staged` mode does for weights, a worker thread moves each saved input
//! in chunks through a small page-locked ring of its own ([`RING_SLOTS`] × [`RING_CHUNK_BYTES`]), the host side
//! of each chunk copied by a few threads, so the device copies run at page-locked speed (the driver's own
//! pageable copies ran at about a third of it: bench/RESULTS.md). The thread issuing GPU work only hands over
//! jobs and collects their acknowledgements. As in `activations_cuda.rs`, the copy stream comes from the driver
//! API and is ordered against candle's stream with events only: compute → copy (the tensor exists), copy →
//! compute (the copy is done). A device tensor a copy reads is kept until the compute stream has been made to
//! wait for that copy.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaContext, CudaStream};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Device, Result, Shape, Tensor};

use super::cuda::{device_ptr, new_event, stream_wait, Pinned, Queue, SendPtr};
use super::{
    staging_copy_threads, CopyPool, HostBuffer, ACTIVATION_RING_CHUNK_BYTES as RING_CHUNK_BYTES,
    ACTIVATION_RING_SLOTS as RING_SLOTS, COPY_UNIT_BYTES,
};

/// Threads of the host side of each chunk's copy (the worker included).
const COPY_THREADS: usize = 4;

/// Pageable buffers kept between steps, so a steady run neither allocates nor first-touches host memory: every
/// step saves buffers of the same sizes (one per block).
static POOL: Mutex<Vec<HostBuffer>> = Mutex::new(Vec::new());

/// The smallest pooled buffer of at least `bytes`, else a new one. A pooled buffer too small for the request is
/// freed first, so the pool holds about one step's worth of the largest sizes seen.
fn take_buffer(bytes: usize) -> HostBuffer {
    if let Ok(mut pool) = POOL.lock() {
        let fit = (0..pool.len())
            .filter(|&k| pool[k].len() >= bytes)
            .min_by_key(|&k| pool[k].len());
        if let Some(k) = fit {
            return pool.swap_remove(k);
        }
        let small = (0..pool.len()).max_by_key(|&k| pool[k].len());
        if let Some(k) = small {
            drop(pool.swap_remove(k));
        }
    }
    HostBuffer::zeroed(bytes)
}

fn give_back(bufs: impl IntoIterator<Item = HostBuffer>) {
    if let Ok(mut pool) = POOL.lock() {
        pool.extend(bufs);
    }
}

/// Frees every pooled buffer.
pub(super) fn release_pool() {
    let bufs = match POOL.lock() {
        Ok(mut pool) => std::mem::take(&mut *pool),
        Err(_) => return,
    };
    drop(bufs);
}

/// A copy for the worker. `after` is recorded on the compute stream (the copy waits for it); `mark` is recorded
/// on the copy stream once the copy is queued, and the buffer comes back only when the copy is done.
struct Job {
    direction: Direction,
    device: u64,
    bytes: usize,
    buf: HostBuffer,
    after: SendPtr<sys::CUevent>,
    mark: SendPtr<sys::CUevent>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Direction {
    /// Device → host (a saved input leaves the card).
    Store,
    /// Host → device (a saved input comes back for the backward).
    Load,
}

/// The worker's answer to a job, in job order: the buffer (its copy done) or what failed.
type Ack = std::result::Result<HostBuffer, String>;

fn worker(ctx: &CudaContext, copy: sys::CUstream, jobs: &Queue<Job>, acks: &Queue<Ack>) {
    let ring = ctx
        .bind_to_thread()
        .map_err(|e| format!("binding the CUDA context: {e:?}"))
        .and_then(|()| ChunkRing::new(copy).map_err(|e| e.to_string()));
    let mut ring = match ring {
        Ok(r) => r,
        Err(e) => {
            acks.push(Err(e));
            acks.close();
            return;
        }
    };
    while let Some(job) = jobs.pop() {
        let ack = ring.run(job).map_err(|e| e.to_string());
        if !acks.push(ack) {
            break;
        }
    }
    acks.close();
}

/// The worker's page-locked chunk ring, with an event per chunk buffer recorded after its last device copy.
struct ChunkRing {
    copy: sys::CUstream,
    chunks: Vec<Pinned>,
    done: Vec<sys::CUevent>,
    /// Whether a device copy into or out of each buffer has been queued since its event was last waited on.
    pending: Vec<bool>,
    copier: CopyPool,
}

impl ChunkRing {
    fn new(copy: sys::CUstream) -> Result<Self> {
        let chunks = (0..RING_SLOTS)
            .map(|_| Pinned::new(RING_CHUNK_BYTES))
            .collect::<Result<Vec<_>>>()?;
        let mut done = Vec::with_capacity(RING_SLOTS);
        for _ in 0..RING_SLOTS {
            done.push(new_event()?);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self {
            copy,
            chunks,
            done,
            pending: vec![false; RING_SLOTS],
            copier: CopyPool::new(staging_copy_threads(COPY_THREADS, cores), COPY_UNIT_BYTES)?,
        })
    }

    /// Waits until buffer `k`'s last device copy is done.
    fn settle(&mut self, k: usize) -> Result<()> {
        if self.pending[k] {
            // SAFETY: `done[k]` was recorded on the live copy stream after buffer `k`'s last device copy.
            unsafe { result::event::synchronize(self.done[k]) }.w()?;
            self.pending[k] = false;
        }
        Ok(())
    }

    /// Queues `bytes` of device memory at `device` into buffer `k` (device → host).
    fn queue_store(&mut self, k: usize, device: u64, bytes: usize) -> Result<()> {
        let dst = &mut self.chunks[k].as_mut_slice()[..bytes];
        // SAFETY: `device` lies inside a live tensor the owner keeps until compute has waited for the job's
        // mark; buffer `k` is page-locked and nothing reads it until `done[k]` has been waited on.
        unsafe { result::memcpy_dtoh_async(dst, device, self.copy) }.w()?;
        // SAFETY: live event on the live copy stream.
        unsafe { result::event::record(self.done[k], self.copy) }.w()?;
        self.pending[k] = true;
        Ok(())
    }

    /// Runs one job: the saved input moves through the ring chunk by chunk, the host copy of one chunk
    /// overlapping the device copies of the others. Returns the buffer once nothing reads or writes it any more.
    fn run(&mut self, mut job: Job) -> Result<HostBuffer> {
        stream_wait(self.copy, job.after.0)?;
        let chunks = job.bytes.div_ceil(RING_CHUNK_BYTES);
        let range = |c: usize| {
            let start = c * RING_CHUNK_BYTES;
            start..(start + RING_CHUNK_BYTES).min(job.bytes)
        };
        match job.direction {
            Direction::Store => {
                // Keep the ring full: chunk c is queued once chunk c - RING_SLOTS has left its buffer.
                for c in 0..chunks + RING_SLOTS {
                    let k = c % RING_SLOTS;
                    if let Some(old) = c.checked_sub(RING_SLOTS) {
                        let r = range(old);
                        self.settle(k)?;
                        let src = &self.chunks[k].as_slice()[..r.len()];
                        self.copier.copy(src, &mut job.buf[r])?;
                    }
                    if c < chunks {
                        let r = range(c);
                        self.queue_store(k, job.device + r.start as u64, r.len())?;
                    }
                }
                // SAFETY: live event on the live copy stream, after every device copy of the input.
                unsafe { result::event::record(job.mark.0, self.copy) }.w()?;
            }
            Direction::Load => {
                for c in 0..chunks {
                    let (k, r) = (c % RING_SLOTS, range(c));
                    self.settle(k)?;
                    let dst = &mut self.chunks[k].as_mut_slice()[..r.len()];
                    self.copier.copy(&job.buf[r.clone()], dst)?;
                    let src = &self.chunks[k].as_slice()[..r.len()];
                    // SAFETY: `device` is a fresh tensor of `bytes` bytes whose allocation is ordered before the
                    // copy (`after`); buffer `k` is page-locked and is not written again before `done[k]`.
                    unsafe {
                        result::memcpy_htod_async(job.device + r.start as u64, src, self.copy)
                    }
                    .w()?;
                    // SAFETY: live event on the live copy stream.
                    unsafe { result::event::record(self.done[k], self.copy) }.w()?;
                    self.pending[k] = true;
                }
                // The host side is done with the buffer; compute waits for `mark` before reading the tensor.
                // SAFETY: live event on the live copy stream, after every device copy of the input.
                unsafe { result::event::record(job.mark.0, self.copy) }.w()?;
            }
        }
        Ok(job.buf)
    }
}

impl Drop for ChunkRing {
    fn drop(&mut self) {
        // SAFETY: once the copy stream is idle no copy touches a chunk buffer; the events are the ring's.
        unsafe {
            let _ = result::stream::synchronize(self.copy);
            for &e in &self.done {
                let _ = result::event::destroy(e);
            }
        }
    }
}

/// One saved input.
struct Saved {
    /// The host copy once its store is acknowledged; `None` while the worker holds it.
    host: Option<HostBuffer>,
    bytes: usize,
    shape: Shape,
    dtype: DType,
    /// The device tensor while the store may still read it (the latest input only).
    device: Option<Tensor>,
    /// Recorded on the copy stream after the store (waited on by compute before `device` is let go).
    stored: sys::CUevent,
}

/// An input on its way back to the device.
struct Upload {
    index: usize,
    tensor: Tensor,
    done: sys::CUevent,
}

/// The pageable host-activation stash of one step.
pub(super) struct PageableStash {
    device: Device,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    compute: sys::CUstream,
    saved: Vec<Saved>,
    ahead: Option<Upload>,
    /// Jobs sent and not yet acknowledged, in order: the saved input's index and the direction.
    in_flight: VecDeque<(usize, Direction, sys::CUevent)>,
    /// Buffers of inputs already brought back, for the pool.
    spent: Vec<HostBuffer>,
    /// Events nothing waits on any more, for reuse; `all` holds every event made, destroyed on drop.
    spare: Vec<sys::CUevent>,
    all: Vec<sys::CUevent>,
    jobs: Arc<Queue<Job>>,
    acks: Arc<Queue<Ack>>,
    handle: Option<JoinHandle<()>>,
    copy: sys::CUstream,
}

impl PageableStash {
    pub(super) fn new(dev: &CudaDevice) -> Result<Self> {
        let stream = dev.cuda_stream();
        let ctx = stream.context().clone();
        ctx.bind_to_thread().w()?;
        let copy = result::stream::create(result::stream::StreamKind::NonBlocking).w()?;
        let (jobs, acks) = (Queue::<Job>::new(), Queue::<Ack>::new());
        let (jobs_rx, acks_tx) = (jobs.clone(), acks.clone());
        let (worker_ctx, worker_copy) = (ctx.clone(), SendPtr(copy));
        let handle = std::thread::Builder::new()
            .name("framesmith-activations".into())
            .spawn(move || {
                let copy = worker_copy;
                worker(&worker_ctx, copy.0, &jobs_rx, &acks_tx);
            });
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: the stream was just made and nothing is queued on it.
                let _ = unsafe { result::stream::destroy(copy) };
                candle_core::bail!("cannot start the host activation copy thread: {e}");
            }
        };
        Ok(Self {
            device: Device::Cuda(dev.clone()),
            compute: stream.cu_stream(),
            ctx,
            stream,
            saved: Vec::new(),
            ahead: None,
            in_flight: VecDeque::new(),
            spent: Vec::new(),
            spare: Vec::new(),
            all: Vec::new(),
            jobs,
            acks,
            handle: Some(handle),
            copy,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.saved.len()
    }

    fn event(&mut self) -> Result<sys::CUevent> {
        if let Some(e) = self.spare.pop() {
            return Ok(e);
        }
        let e = new_event()?;
        self.all.push(e);
        Ok(e)
    }

    /// Makes compute queued from now on wait for `event` (a copy), then keeps the event for reuse: a wait
    /// captures the event's state when it is queued.
    fn compute_after(&mut self, event: sys::CUevent) -> Result<()> {
        stream_wait(self.compute, event)?;
        self.spare.push(event);
        Ok(())
    }

    /// Sends a copy of `bytes` at `device` in `direction`, ordered after the work queued on the compute stream so
    /// far; returns the event the copy stream records once it is queued.
    fn send(
        &mut self,
        index: usize,
        direction: Direction,
        device: u64,
        bytes: usize,
        buf: HostBuffer,
    ) -> Result<sys::CUevent> {
        let after = self.event()?;
        // SAFETY: live event on candle's live stream.
        unsafe { result::event::record(after, self.compute) }.w()?;
        let mark = self.event()?;
        let job = Job {
            direction,
            device,
            bytes,
            buf,
            after: SendPtr(after),
            mark: SendPtr(mark),
        };
        if !self.jobs.push(job) {
            candle_core::bail!("the host activation copy thread stopped");
        }
        self.in_flight.push_back((index, direction, after));
        Ok(mark)
    }

    /// Receives the oldest acknowledgement and puts its buffer where it belongs.
    fn receive(&mut self) -> Result<()> {
        let Some((index, direction, after)) = self.in_flight.pop_front() else {
            candle_core::bail!("no host activation copy is pending");
        };
        let buf = match self.acks.pop() {
            Some(Ok(buf)) => buf,
            Some(Err(e)) => candle_core::bail!("copying a saved block input failed: {e}"),
            None => candle_core::bail!("the host activation copy thread stopped"),
        };
        // The worker's stream has queued its wait on `after`: the event may be recorded again.
        self.spare.push(after);
        match direction {
            Direction::Store => match self.saved.get_mut(index) {
                Some(s) => s.host = Some(buf),
                None => self.spent.push(buf),
            },
            Direction::Load => self.spent.push(buf),
        }
        Ok(())
    }

    /// Receives acknowledgements until none is pending for input `index` in `direction`.
    fn wait_for(&mut self, index: usize, direction: Direction) -> Result<()> {
        while self
            .in_flight
            .iter()
            .any(|&(i, d, _)| i == index && d == direction)
        {
            self.receive()?;
        }
        Ok(())
    }

    /// Starts copying `xs` to pageable RAM once the work queued so far has produced it; lets the previous input's
    /// device memory go (compute waits for its copy first).
    pub(super) fn push(&mut self, xs: Tensor) -> Result<()> {
        self.ctx.bind_to_thread().w()?;
        if let Some(last) = self.saved.len().checked_sub(1) {
            if self.saved[last].device.is_some() {
                self.wait_for(last, Direction::Store)?;
                let stored = self.saved[last].stored;
                stream_wait(self.compute, stored)?;
                self.saved[last].device = None;
            }
        }
        let xs = xs.contiguous()?;
        let bytes = xs.elem_count() * xs.dtype().size_in_bytes();
        let src = device_ptr(&xs, &self.stream)?;
        let index = self.saved.len();
        let stored = self.send(index, Direction::Store, src, bytes, take_buffer(bytes))?;
        self.saved.push(Saved {
            host: None,
            bytes,
            shape: xs.shape().clone(),
            dtype: xs.dtype(),
            device: Some(xs),
            stored,
        });
        Ok(())
    }

    /// The latest input not yet taken, ordered before compute queued after this; starts bringing back the next.
    pub(super) fn pop(&mut self) -> Result<Option<Tensor>> {
        self.ctx.bind_to_thread().w()?;
        let Some(index) = self.saved.len().checked_sub(1) else {
            return Ok(None);
        };
        let tensor = if self.saved[index].device.is_some() {
            // Still on the device (the last input of the forward pass): no copy back. Its memory may be freed
            // once it is dropped, so compute waits for the store reading it.
            self.wait_for(index, Direction::Store)?;
            let Some(mut saved) = self.saved.pop() else {
                return Ok(None);
            };
            self.compute_after(saved.stored)?;
            self.spent.extend(saved.host.take());
            saved.device.take()
        } else {
            let upload = match self.ahead.take() {
                Some(u) if u.index == index => u,
                other => {
                    self.ahead = other;
                    self.start_upload(index)?
                }
            };
            self.wait_for(index, Direction::Load)?;
            if let Some(saved) = self.saved.pop() {
                self.spare.push(saved.stored);
            }
            self.compute_after(upload.done)?;
            Some(upload.tensor)
        };
        if self.ahead.is_none() && index > 0 {
            let next = index - 1;
            if self.saved[next].device.is_none() {
                self.ahead = Some(self.start_upload(next)?);
            }
        }
        Ok(tensor)
    }

    /// Queues the copy of input `index` back into a fresh device tensor (allocated on the compute stream, so the
    /// copy waits for the work queued so far).
    fn start_upload(&mut self, index: usize) -> Result<Upload> {
        self.wait_for(index, Direction::Store)?;
        let (shape, dtype, bytes) = {
            let s = &self.saved[index];
            (s.shape.clone(), s.dtype, s.bytes)
        };
        let Some(buf) = self.saved[index].host.take() else {
            candle_core::bail!("saved block input {index} has no host copy");
        };
        // SAFETY (uninitialised memory): the copy writes every byte before compute may read the tensor; whoever
        // takes it makes compute wait for `done` first.
        let tensor = unsafe { Tensor::empty(shape, dtype, &self.device) }?;
        let dst = device_ptr(&tensor, &self.stream)?;
        let done = self.send(index, Direction::Load, dst, bytes, buf)?;
        Ok(Upload {
            index,
            tensor,
            done,
        })
    }
}

impl Drop for PageableStash {
    fn drop(&mut self) {
        // Closing the job queue ends the worker once it has answered every job sent.
        self.jobs.close();
        while !self.in_flight.is_empty() && self.receive().is_ok() {}
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the worker has stopped and the copy stream is synchronised, so nothing reads or writes a buffer,
        // a tensor or an event of ours any more; the handles are ours.
        unsafe {
            let _ = result::stream::synchronize(self.copy);
            for &e in &self.all {
                let _ = result::event::destroy(e);
            }
            let _ = result::stream::destroy(self.copy);
        }
        give_back(
            self.spent
                .drain(..)
                .chain(self.saved.drain(..).filter_map(|s| s.host)),
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
    fn pageable_saved_inputs_come_back_exactly_and_steady_steps_reuse_the_pool() -> Result<()> {
        let dev = Device::new_cuda(0)?;
        let Device::Cuda(cuda) = &dev else {
            candle_core::bail!("not a CUDA device");
        };
        let mut pooled = Vec::new();
        for _ in 0..3 {
            let mut stash = PageableStash::new(cuda)?;
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
        assert_eq!(pooled[1], pooled[0], "a steady step allocated host memory");
        assert_eq!(pooled[2], pooled[0], "a steady step allocated host memory");
        Ok(())
    }
}
