//! The CUDA ring: slot tensors allocated once, a second (non-blocking) stream for the copies, and per-slot events
//! ordering the two streams (slot free → copy → ready → compute). The copy stream is made with the driver API
//! directly rather than `CudaContext::new_stream`, which would switch every candle allocation to per-slice event
//! tracking; cross-stream ordering is ours to keep, and it is kept with these events only.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaContext, DevicePtr};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Device, Result, Storage, Tensor};

use super::{BlockLayout, CopyPool, HostBuffer, OffloadOptions, SlotBackend};

/// A raw driver handle or pointer that may move to the staging worker (the driver allows any thread to use it).
#[derive(Clone, Copy)]
pub(super) struct SendPtr<T>(pub(super) T);
// SAFETY: CUDA driver handles and device addresses are plain values usable from any thread of the process.
unsafe impl<T> Send for SendPtr<T> {}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
pub(super) struct Pinned {
    ptr: SendPtr<*mut u8>,
    len: usize,
}

impl Pinned {
    /// `len` page-locked bytes for the context bound to this thread.
    pub(super) fn new(len: usize) -> Result<Self> {
        Self::with_flags(len, 0)
    }

    /// Page-locked for every context of the process (`CU_MEMHOSTALLOC_PORTABLE`), not only the current one.
    pub(super) fn portable(len: usize) -> Result<Self> {
        Self::with_flags(len, sys::CU_MEMHOSTALLOC_PORTABLE)
    }

    fn with_flags(len: usize, flags: u32) -> Result<Self> {
        let began = std::time::Instant::now();
        // SAFETY: a fresh allocation of `len` bytes; the memory is only read after it has been written.
        let ptr = unsafe { result::malloc_host(len.max(1), flags) }.w()?;
        super::PAGE_LOCKING.add(len, began.elapsed());
        Ok(Self {
            ptr: SendPtr(ptr.cast()),
            len,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.0, self.len) }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.0, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by `cuMemHostAlloc`; every copy reading it was synchronised before the owner drops.
        let _ = unsafe { result::free_host(self.ptr.0.cast()) };
    }
}

/// Binds `device`'s context to the calling thread (before page-locked allocations).
pub(super) fn bind_context(device: &Device) -> Result<()> {
    let Device::Cuda(dev) = device else {
        candle_core::bail!("not a CUDA device");
    };
    dev.cuda_stream().context().bind_to_thread().w()
}

pub(super) fn new_event() -> Result<sys::CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).w()
}

/// Makes work queued on `stream` from now on wait for `event`'s latest record. Both must be live handles of the
/// backend's context (every caller owns them until it has synchronised its streams).
pub(super) fn stream_wait(stream: sys::CUstream, event: sys::CUevent) -> Result<()> {
    // SAFETY: live handles (see above); the wait only orders work, it reads no memory.
    unsafe {
        result::stream::wait_event(
            stream,
            event,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .w()
}

/// The device address of a contiguous tensor's first element.
pub(super) fn device_ptr(
    t: &Tensor,
    stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        candle_core::bail!("slot tensor is not on a CUDA device");
    };
    let base = match t.dtype() {
        DType::U8 => cs.as_cuda_slice::<u8>()?.device_ptr(stream).0,
        DType::F32 => cs.as_cuda_slice::<f32>()?.device_ptr(stream).0,
        DType::BF16 => cs.as_cuda_slice::<half::bf16>()?.device_ptr(stream).0,
        DType::F16 => cs.as_cuda_slice::<half::f16>()?.device_ptr(stream).0,
        other => candle_core::bail!("block streaming cannot hold {other:?} tensors"),
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}

/// Queues the copies of bytes `[start, start + src.len())` of one packed block, held in `src` (host,
/// page-locked), into a slot's tensors (device addresses `dst`, one per tensor of `layout`), on `stream`. The
/// range may cut tensors anywhere; alignment padding between tensors is skipped.
fn queue_copies(
    layout: &BlockLayout,
    src: &[u8],
    start: usize,
    dst: &[u64],
    stream: sys::CUstream,
) -> Result<()> {
    let end = start + src.len();
    for (spec, &ptr) in layout.specs.iter().zip(dst) {
        let (from, to) = (spec.offset.max(start), (spec.offset + spec.bytes).min(end));
        if from >= to {
            continue;
        }
        let bytes = &src[from - start..to - start];
        let at = ptr + (from - spec.offset) as u64;
        // SAFETY: `[at, at + bytes.len())` lies inside a slot tensor of exactly `spec.bytes` bytes; `src` is
        // page-locked and outlives the copy (the owner waits for the copy before reusing or freeing it).
        unsafe { result::memcpy_htod_async(at, bytes, stream) }.w()?;
    }
    Ok(())
}

/// One copy for the staging worker.
struct Job {
    slot: usize,
    block: usize,
    dst: Vec<u64>,
    /// The slot's free event, when it has been recorded.
    free: Option<SendPtr<sys::CUevent>>,
    ready: SendPtr<sys::CUevent>,
}

/// A blocking first-in first-out hand-over between the issuing thread and the staging worker.
pub(super) struct Queue<T> {
    state: Mutex<(VecDeque<T>, bool)>,
    ready: Condvar,
}

impl<T> Queue<T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        })
    }

    /// Adds an item; false once the queue is closed.
    pub(super) fn push(&self, item: T) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        if state.1 {
            return false;
        }
        state.0.push_back(item);
        self.ready.notify_one();
        true
    }

    /// No more items: waiting `pop`s return `None` once the queue is empty.
    pub(super) fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.1 = true;
            self.ready.notify_all();
        }
    }

    /// The next item, waiting for one; `None` when closed and empty.
    pub(super) fn pop(&self) -> Option<T> {
        let mut state = self.state.lock().ok()?;
        loop {
            if let Some(item) = state.0.pop_front() {
                return Some(item);
            }
            if state.1 {
                return None;
            }
            state = self.ready.wait(state).ok()?;
        }
    }
}

/// What the worker answers: the slot's ready event is recorded (or the copy failed).
type Ack = std::result::Result<usize, String>;

/// The staged mode's worker: copies pageable masters into the page-locked staging ring and queues the
/// host → device copies from there, so the thread issuing GPU work never waits on a host memcpy.
struct Worker {
    jobs: Arc<Queue<Job>>,
    acks: Arc<Queue<Ack>>,
    handle: Option<JoinHandle<()>>,
}

struct WorkerState {
    ctx: Arc<CudaContext>,
    copy: SendPtr<sys::CUstream>,
    layout: BlockLayout,
    masters: Vec<HostBuffer>,
    copier: CopyPool,
    /// The page-locked ring: chunk buffers of `chunk_bytes` each, reused in turn.
    staging: Vec<Pinned>,
    chunk_bytes: usize,
    /// Recorded on the copy stream after the last device copy out of each chunk buffer.
    staging_done: Vec<SendPtr<sys::CUevent>>,
    used: Vec<bool>,
    next: usize,
}

impl WorkerState {
    fn run(mut self, jobs: &Queue<Job>, acks: &Queue<Ack>) {
        if let Err(e) = self.ctx.bind_to_thread() {
            acks.push(Err(format!("staging worker: {e:?}")));
            acks.close();
            return;
        }
        while let Some(job) = jobs.pop() {
            let ack = self.copy(&job).map(|()| job.slot);
            if !acks.push(ack) {
                break;
            }
        }
        acks.close();
        // SAFETY: the copy stream outlives the worker (the backend joins it first); the events are the worker's.
        unsafe {
            let _ = result::stream::synchronize(self.copy.0);
            for e in &self.staging_done {
                let _ = result::event::destroy(e.0);
            }
        }
    }

    /// Copies block `job.block` into its slot, chunk by chunk: each chunk goes from the pageable master into the
    /// next buffer of the ring (once that buffer's last device copy is done) and is queued from there, so the
    /// host copy of one chunk overlaps the device copy of the ones before it.
    fn copy(&mut self, job: &Job) -> std::result::Result<(), String> {
        let copy = self.copy.0;
        if let Some(free) = job.free {
            // Orders the copies after the slot's last reader.
            stream_wait(copy, free.0).map_err(|e| e.to_string())?;
        }
        let master = self
            .masters
            .get(job.block)
            .ok_or_else(|| format!("no streamed block {}", job.block))?;
        let total = self.layout.total_bytes;
        let mut start = 0;
        while start < total {
            let len = self.chunk_bytes.min(total - start);
            let k = self.next;
            self.next = (k + 1) % self.staging.len();
            let done = self.staging_done[k].0;
            if self.used[k] {
                // SAFETY: `done` was recorded after the last copy out of chunk buffer `k`.
                unsafe { result::event::synchronize(done) }.map_err(|e| format!("{e:?}"))?;
            }
            let chunk = &mut self.staging[k].as_mut_slice()[..len];
            self.copier
                .copy(&master[start..start + len], chunk)
                .map_err(|e| e.to_string())?;
            queue_copies(&self.layout, chunk, start, &job.dst, copy).map_err(|e| e.to_string())?;
            // SAFETY: live event on the live copy stream.
            unsafe { result::event::record(done, copy) }.map_err(|e| format!("{e:?}"))?;
            self.used[k] = true;
            start += len;
        }
        // SAFETY: live event on the live copy stream, after every chunk of the block.
        unsafe { result::event::record(job.ready.0, copy) }.map_err(|e| format!("{e:?}"))
    }
}

/// The packed host copies of the streamed blocks, as the backend is given them.
pub(super) enum Masters {
    /// Page-locked: `pinned` streaming copies straight out of them.
    Pinned(Vec<Pinned>),
    /// Pageable: `staged` streaming copies them through the page-locked ring.
    Pageable(Vec<HostBuffer>),
}

enum Copier {
    Pinned(Vec<Pinned>),
    Staged(Worker),
}

/// The CUDA slot backend.
pub(super) struct CudaBackend {
    compute: sys::CUstream,
    copy: sys::CUstream,
    layout: BlockLayout,
    slots: Vec<Vec<Tensor>>,
    slot_ptrs: Vec<Vec<u64>>,
    free: Vec<sys::CUevent>,
    free_recorded: Vec<bool>,
    ready: Vec<sys::CUevent>,
    /// Jobs sent to the worker and not yet acknowledged, per slot (staged mode).
    pending: Vec<usize>,
    masters: Copier,
}

// SAFETY: the raw handles are only used through `&mut self` (the streamer's mutex serialises every call).
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    pub(super) fn new(
        device: &Device,
        layout: &BlockLayout,
        masters: Masters,
        options: &OffloadOptions,
    ) -> Result<Self> {
        let Device::Cuda(dev) = device else {
            candle_core::bail!("the CUDA streaming backend needs a CUDA device");
        };
        let stream = dev.cuda_stream();
        let ctx = stream.context().clone();
        ctx.bind_to_thread().w()?;
        let slots = options.slots.max(1);
        let mut slot_tensors = Vec::with_capacity(slots);
        let mut slot_ptrs = Vec::with_capacity(slots);
        for _ in 0..slots {
            let tensors = layout.zeros(device)?;
            slot_ptrs.push(
                tensors
                    .iter()
                    .map(|t| device_ptr(t, &stream))
                    .collect::<Result<Vec<_>>>()?,
            );
            slot_tensors.push(tensors);
        }
        let copy = result::stream::create(result::stream::StreamKind::NonBlocking).w()?;
        let masters = match masters {
            Masters::Pageable(masters) => {
                let staging_slots = options.staging_slots.max(1);
                let chunk_bytes = options
                    .staging_chunk_bytes
                    .clamp(1, layout.total_bytes.max(1));
                let state = WorkerState {
                    ctx: ctx.clone(),
                    copy: SendPtr(copy),
                    layout: layout.clone(),
                    masters,
                    copier: CopyPool::new(
                        super::staging_copy_threads(
                            options.copy_threads,
                            std::thread::available_parallelism().map_or(1, |n| n.get()),
                        ),
                        options.copy_unit_bytes,
                    )?,
                    staging: (0..staging_slots)
                        .map(|_| Pinned::new(chunk_bytes))
                        .collect::<Result<_>>()?,
                    chunk_bytes,
                    staging_done: (0..staging_slots)
                        .map(|_| new_event().map(SendPtr))
                        .collect::<Result<_>>()?,
                    used: vec![false; staging_slots],
                    next: 0,
                };
                Copier::Staged(Worker::start(state)?)
            }
            Masters::Pinned(bufs) => Copier::Pinned(bufs),
        };
        // Slot tensors were zero-filled on the compute stream: the first copies must come after that.
        device.synchronize()?;
        Ok(Self {
            compute: stream.cu_stream(),
            copy,
            layout: layout.clone(),
            slots: slot_tensors,
            slot_ptrs,
            free: (0..slots).map(|_| new_event()).collect::<Result<_>>()?,
            free_recorded: vec![false; slots],
            ready: (0..slots).map(|_| new_event()).collect::<Result<_>>()?,
            pending: vec![0; slots],
            masters,
        })
    }

    /// The tensors of slot `i` (for the shells).
    pub(super) fn slot_tensors(&self, i: usize) -> Vec<Tensor> {
        self.slots[i].clone()
    }

    /// Receives worker acknowledgements until none is pending for `slot` (for any slot with `None`).
    fn drain_acks(&mut self, slot: Option<usize>) -> Result<()> {
        let Copier::Staged(worker) = &self.masters else {
            return Ok(());
        };
        while slot.map_or(self.pending.iter().any(|&p| p > 0), |s| self.pending[s] > 0) {
            match worker.acks.pop() {
                Some(Ok(s)) if s < self.pending.len() => self.pending[s] -= 1,
                Some(Ok(_)) => {}
                Some(Err(e)) => candle_core::bail!("block streaming copy failed: {e}"),
                None => candle_core::bail!("the block streaming worker stopped"),
            }
        }
        Ok(())
    }
}

impl Worker {
    fn start(state: WorkerState) -> Result<Self> {
        let (jobs, acks) = (Queue::new(), Queue::new());
        let (jobs_rx, acks_tx) = (jobs.clone(), acks.clone());
        let handle = std::thread::Builder::new()
            .name("framesmith-staging".into())
            .spawn(move || state.run(&jobs_rx, &acks_tx))
            .map_err(|e| {
                candle_core::Error::Msg(format!("cannot start the staging worker: {e}"))
            })?;
        Ok(Self {
            jobs,
            acks,
            handle: Some(handle),
        })
    }
}

impl SlotBackend for CudaBackend {
    fn load(&mut self, slot: usize, block: usize) -> Result<()> {
        let free = self.free_recorded[slot].then_some(self.free[slot]);
        match &self.masters {
            Copier::Pinned(bufs) => {
                let src = bufs
                    .get(block)
                    .ok_or_else(|| candle_core::Error::Msg(format!("no streamed block {block}")))?;
                if let Some(free) = free {
                    // Orders the copy after the slot's last reader.
                    stream_wait(self.copy, free)?;
                }
                queue_copies(
                    &self.layout,
                    &src.as_slice()[..self.layout.total_bytes],
                    0,
                    &self.slot_ptrs[slot],
                    self.copy,
                )?;
                // SAFETY: live event on the live copy stream.
                unsafe { result::event::record(self.ready[slot], self.copy) }.w()?;
            }
            Copier::Staged(worker) => {
                let job = Job {
                    slot,
                    block,
                    dst: self.slot_ptrs[slot].clone(),
                    free: free.map(SendPtr),
                    ready: SendPtr(self.ready[slot]),
                };
                if !worker.jobs.push(job) {
                    candle_core::bail!("the block streaming worker stopped");
                }
                self.pending[slot] += 1;
            }
        }
        Ok(())
    }

    fn release(&mut self, slot: usize) -> Result<()> {
        // SAFETY: live event on candle's stream: recorded after every kernel queued so far.
        unsafe { result::event::record(self.free[slot], self.compute) }.w()?;
        self.free_recorded[slot] = true;
        Ok(())
    }

    fn acquire(&mut self, slot: usize) -> Result<Vec<Tensor>> {
        self.drain_acks(Some(slot))?;
        // Compute queued after this waits for the slot's copy.
        stream_wait(self.compute, self.ready[slot])?;
        Ok(self.slots[slot].clone())
    }

    fn synchronize(&mut self) -> Result<()> {
        self.drain_acks(None)?;
        // SAFETY: the copy stream is live.
        unsafe { result::stream::synchronize(self.copy) }.w()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Copier::Staged(worker) = &mut self.masters {
            // Closing the queue ends the worker's loop.
            worker.jobs.close();
            if let Some(h) = worker.handle.take() {
                let _ = h.join();
            }
        }
        // SAFETY: nothing is queued on the copy stream after this synchronisation; the handles are ours.
        unsafe {
            let _ = result::stream::synchronize(self.copy);
            let _ = result::stream::synchronize(self.compute);
            for &e in self.free.iter().chain(&self.ready) {
                let _ = result::event::destroy(e);
            }
            let _ = result::stream::destroy(self.copy);
        }
    }
}
