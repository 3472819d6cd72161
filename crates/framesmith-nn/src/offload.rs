//! Block streaming (DESIGN.md §4.4): the frozen weights of streamed blocks live in host RAM, each block packed
//! into one aligned buffer, and are copied into a small ring of GPU slots as the step walks the blocks. The model
//! keeps a "shell" of each streamed block (its LoRA and its shapes, pointing at slot 0's tensors); a fetch returns
//! a copy of the shell whose frozen tensors are the slot's. Frozen weights only ever travel host → device.
//!
//! Modes: `pinned` (every streamed block page-locked, one asynchronous copy per tensor on a second CUDA stream),
//! `staged` (masters in pageable, huge-page-advised RAM; a worker thread copies each block in 8 MiB chunks through
//! a small page-locked ring that stays in the CPU cache, with a few threads of its own, and queues each chunk's
//! device copy, so page-locked memory stays at a few tens of MiB), and, on a device without streams (the CPU,
//! tests), `host`: synchronous unpacking into the slot.
//! Ordering on CUDA is explicit, with events: slot free → copy → ready → compute.
//!
//! The step's saved block inputs can live here too ([`SavedInputs`], `memory.activations = "host"`): on CUDA
//! they move to host buffers and back on a copy stream of their own, overlapping compute; page-locked buffers,
//! or pageable ones with `staged` streaming ([`SavedPlacement::host_for`]).

mod activations;
#[cfg(feature = "cuda")]
mod activations_cuda;
#[cfg(feature = "cuda")]
mod activations_pageable;
mod arena;
mod copy_pool;
mod host;
mod pack;
mod page_locking;
#[cfg(feature = "cuda")]
use page_locking::PAGE_LOCKING;
mod prelock;
mod ring;
mod step_trim;

#[cfg(feature = "cuda")]
mod cuda;

use std::sync::Mutex;

use candle_core::{Device, Result, Tensor};

use crate::load_timing::{timed, LoadPart};

pub use crate::bytes::tensor_bytes;
pub use activations::{
    release_host_activation_buffers, KeptValues, SavedInputs, SavedPlacement, Stashable,
};
pub use copy_pool::CopyPool;
pub use host::HostBuffer;
pub use pack::{BlockLayout, TensorSpec, ALIGN};
pub use page_locking::{page_locking, PageLocking};
pub use prelock::{ActivationBuffers, PrelockReport};
pub use ring::{Decision, Load, Ring};
pub use step_trim::{PoolReading, StepTrim};

/// How streamed blocks reach the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamMode {
    /// Page-locked masters, asynchronous copies.
    Pinned,
    /// Pageable masters and a page-locked staging ring filled by a worker thread.
    Staged,
    /// Synchronous copies from pageable memory (the portable path; what the CPU device uses).
    Host,
}

impl StreamMode {
    /// The mode's name as configuration files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pinned => "pinned",
            Self::Staged => "staged",
            Self::Host => "host",
        }
    }
}

/// Which blocks stream when only some do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamPlacement {
    /// Spread evenly through the model, so resident blocks sit between streamed ones and hide their copies.
    Spread,
    /// The last N blocks.
    Last,
}

/// The block indices that stream: `blocks_to_swap` of `num_blocks`, placed as asked.
pub fn streamed_blocks(
    num_blocks: usize,
    blocks_to_swap: usize,
    placement: StreamPlacement,
) -> Vec<usize> {
    let blocks_to_swap = blocks_to_swap.min(num_blocks);
    match placement {
        StreamPlacement::Last => (num_blocks - blocks_to_swap..num_blocks).collect(),
        StreamPlacement::Spread => {
            // The i-th streamed block sits at the end of the i-th of `blocks_to_swap` equal stretches.
            (0..blocks_to_swap)
                .map(|i| ((i + 1) * num_blocks).div_ceil(blocks_to_swap) - 1)
                .collect()
        }
    }
}

/// Streaming settings.
#[derive(Clone, Debug)]
pub struct OffloadOptions {
    pub mode: StreamMode,
    /// GPU slots in the ring (at least 2 to overlap a copy with compute).
    pub slots: usize,
    /// Page-locked chunk buffers of `staged`'s ring (at least 2 to overlap a host copy with a device copy).
    pub staging_slots: usize,
    /// Bytes of one staging chunk (at most a block).
    pub staging_chunk_bytes: usize,
    /// Threads of the staging copy, the worker included (at most one fewer than the machine's cores:
    /// [`staging_copy_threads`]).
    pub copy_threads: usize,
    /// Bytes of one unit of the staging copy's work: each thread takes the next unit when it is done with its
    /// last, so a thread that runs slow (preempted, sharing its core) holds up one unit rather than a fixed share.
    pub copy_unit_bytes: usize,
}

/// Default bytes of one chunk of `staged`'s page-locked ring: large enough that issuing a chunk costs little next
/// to copying it, small enough that the ring stays in the last-level cache, so the copy engine reads the chunk
/// from the cache rather than DRAM. Measured on the H200 test machine (a C experiment, 8 copy threads, 4 chunks):
/// 2 MiB 29 GB/s, 4 MiB 51, 8 MiB 54, 16 MiB 54, 32 MiB 43; whole-block staging with streaming stores 36–41.
pub const STAGING_CHUNK_BYTES: usize = 8 << 20;
/// Default chunk buffers of `staged`'s ring: 4 × 8 MiB stays in a desktop CPU's last-level cache on most parts
/// and kept the H200 test machine's copy engine busy (54 of 55 GB/s).
pub const STAGING_SLOTS: usize = 4;
/// Default threads of the staging copy, the worker included (fewer on a machine with fewer cores:
/// [`staging_copy_threads`]). Copy bandwidth alone barely depends on it (H200 test machine, 16 cores, 8 MiB × 4:
/// 51–54 GB/s at 8 and at 12 threads), but during a step it does: Wan2.1-14B FP8 at 512×512, transfer-bound, took
/// 665 ms (39 blocks streamed) and 505 ms (30) with 8 threads and 256 KiB units, 549–552 and 414–416 ms with 12
/// threads and 64 KiB units, against 530 and 401 ms for `pinned` (bench/RESULTS.md, block streaming, session 6).
pub const STAGING_COPY_THREADS: usize = 12;

/// Default bytes of one unit of the staging copy's work: 128 units per 8 MiB chunk, small enough that a thread
/// slowed down mid-chunk holds up little of it, large enough that taking one (one atomic operation) costs nothing
/// next to copying it. Measured with `stage-sweep` (GB/s, two runs each): 1024 KiB 32–45, 256 KiB 45–52, 64 KiB
/// 49–52.
pub const COPY_UNIT_BYTES: usize = 64 << 10;

/// Chunk buffers of the page-locked ring through which saved inputs in pageable RAM move (`staged` streaming
/// with host activations, [`SavedPlacement::Pageable`]).
pub const ACTIVATION_RING_SLOTS: usize = 4;
/// Bytes of one of those chunk buffers: 4 × 8 MiB is all the page-locked memory pageable saved inputs take.
pub const ACTIVATION_RING_CHUNK_BYTES: usize = 8 << 20;

/// Threads the staging copy uses when `requested` are asked for on a machine with `cores` logical cores: at most
/// one fewer than the cores, so the thread issuing the GPU work (the step's critical path) keeps a core of its own
/// while the copy threads spin between chunks; at least one.
pub fn staging_copy_threads(requested: usize, cores: usize) -> usize {
    requested.min(cores.saturating_sub(1)).max(1)
}

impl Default for OffloadOptions {
    fn default() -> Self {
        Self {
            mode: StreamMode::Pinned,
            slots: 2,
            staging_slots: STAGING_SLOTS,
            staging_chunk_bytes: STAGING_CHUNK_BYTES,
            copy_threads: STAGING_COPY_THREADS,
            copy_unit_bytes: COPY_UNIT_BYTES,
        }
    }
}

/// Counters of one streamer since it was made (or since [`BlockStreamer::reset_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Blocks copied into a slot.
    pub loads: u64,
    /// Fetches whose block was already in its slot (kept from before, or prefetched).
    pub hits: u64,
    /// Bytes copied host → device.
    pub bytes: u64,
}

/// The copying side: fills slots with blocks and orders compute after the copies.
trait SlotBackend: Send {
    /// Starts copying `block` into `slot` (after the slot's last release).
    fn load(&mut self, slot: usize, block: usize) -> Result<()>;
    /// All reads of `slot` by work queued so far are the last ones before it may be refilled.
    fn release(&mut self, slot: usize) -> Result<()>;
    /// Makes work queued from now on wait for `slot`'s copy; the slot's tensors.
    fn acquire(&mut self, slot: usize) -> Result<Vec<Tensor>>;
    /// Waits for every queued copy (before the host buffers may go).
    fn synchronize(&mut self) -> Result<()>;
}

/// Synchronous backend: each load unpacks the block's host bytes into fresh tensors on the device.
struct HostBackend {
    layout: BlockLayout,
    device: Device,
    masters: Vec<HostBuffer>,
    slots: Vec<Vec<Tensor>>,
}

impl SlotBackend for HostBackend {
    fn load(&mut self, slot: usize, block: usize) -> Result<()> {
        let packed = self
            .masters
            .get(block)
            .ok_or_else(|| candle_core::Error::Msg(format!("no streamed block {block}")))?;
        self.slots[slot] = self.layout.unpack(packed, &self.device)?;
        Ok(())
    }

    fn release(&mut self, _slot: usize) -> Result<()> {
        Ok(())
    }

    fn acquire(&mut self, slot: usize) -> Result<Vec<Tensor>> {
        Ok(self.slots[slot].clone())
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The packed host copies of the streamed blocks, made as the blocks come.
enum Masters {
    /// Ordinary RAM (huge-page advised): `staged` streaming, and the synchronous host backend.
    Pageable(Vec<HostBuffer>),
    /// Page-locked RAM: `pinned` streaming. The buffers are page-locked on a thread of their own (`ahead`) while
    /// the blocks before them are read and packed, rather than one after another in between.
    #[cfg(feature = "cuda")]
    PageLocked {
        bufs: Vec<cuda::Pinned>,
        ahead: Option<prelock::Ahead<cuda::Pinned>>,
    },
}

impl Masters {
    /// Empty masters of the kind `mode` keeps blocks in, for about `expected` blocks of `layout`.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn new(
        mode: StreamMode,
        device: &Device,
        layout: &BlockLayout,
        expected: usize,
    ) -> Result<Self> {
        match mode {
            #[cfg(feature = "cuda")]
            StreamMode::Pinned => {
                cuda::bind_context(device)?;
                let (bytes, device) = (layout.total_bytes, device.clone());
                // Without the thread every buffer is page-locked where it is needed, as before.
                let ahead = prelock::Ahead::start(expected, move || {
                    cuda::bind_context(&device)
                        .and_then(|()| cuda::Pinned::new(bytes))
                        .map_err(|e| e.to_string())
                })
                .ok();
                Ok(Self::PageLocked {
                    bufs: Vec::with_capacity(expected),
                    ahead,
                })
            }
            _ => Ok(Self::Pageable(Vec::new())),
        }
    }

    /// Packs `block` into a fresh buffer of `layout`'s size.
    fn pack<B: Streamable>(&mut self, layout: &BlockLayout, block: &B) -> Result<()> {
        match self {
            Self::Pageable(bufs) => {
                let mut buf = HostBuffer::zeroed(layout.total_bytes);
                timed(LoadPart::Packing, || layout.pack_block(block, &mut buf))?;
                bufs.push(buf);
            }
            #[cfg(feature = "cuda")]
            Self::PageLocked { bufs, ahead } => {
                let bytes = layout.total_bytes;
                let mut buf = timed(LoadPart::PageLocking, || {
                    match ahead.as_ref().and_then(prelock::Ahead::next) {
                        Some(buf) => Ok(buf),
                        None => cuda::Pinned::new(bytes),
                    }
                })?;
                crate::load_timing::add_page_locked(bytes);
                timed(LoadPart::Packing, || {
                    layout.pack_block(block, buf.as_mut_slice())
                })?;
                bufs.push(buf);
            }
        }
        Ok(())
    }
}

struct Inner {
    ring: Ring,
    backend: Box<dyn SlotBackend>,
    stats: StreamStats,
}

/// What block streaming needs from a model's block: its frozen tensors in one fixed order (the same order, shapes
/// and dtypes for every block it streams together), and a copy of the block whose frozen tensors are others of
/// the same layout (the slot's). Trained tensors (the LoRA) are not frozen: they stay resident.
pub trait Streamable: Sized {
    /// Every frozen tensor of the block (cheap clones sharing storage).
    fn frozen_tensors(&self) -> Vec<Tensor>;
    /// A copy of this block whose frozen tensors are `tensors`, in [`Streamable::frozen_tensors`]'s order.
    fn with_frozen(&self, tensors: &[Tensor]) -> Result<Self>;
}

/// [`Streamable::frozen_tensors`] of a block whose frozen tensors are its own fields, which `fields` lists mutably
/// in the fixed order (cheap clones sharing storage).
pub fn frozen_fields<B: Clone>(
    block: &B,
    fields: impl FnOnce(&mut B) -> Vec<&mut Tensor>,
) -> Vec<Tensor> {
    let mut copy = block.clone();
    fields(&mut copy).into_iter().map(|t| t.clone()).collect()
}

/// [`Streamable::with_frozen`] of a block whose frozen tensors are its own fields, which `fields` lists mutably in
/// the fixed order: a copy of `block` with `tensors` in their places, each of its field's shape and dtype. `name`
/// names the block in errors.
pub fn with_frozen_fields<B: Clone>(
    block: &B,
    fields: impl FnOnce(&mut B) -> Vec<&mut Tensor>,
    tensors: &[Tensor],
    name: &str,
) -> Result<B> {
    let mut copy = block.clone();
    let slots = fields(&mut copy);
    if slots.len() != tensors.len() {
        candle_core::bail!(
            "{name} has {} frozen tensors, {} given",
            slots.len(),
            tensors.len()
        );
    }
    for (slot, t) in slots.into_iter().zip(tensors) {
        if slot.dims() != t.dims() || slot.dtype() != t.dtype() {
            candle_core::bail!(
                "{name}: frozen tensor {:?} {:?} replaced by {:?} {:?}",
                slot.dims(),
                slot.dtype(),
                t.dims(),
                t.dtype()
            );
        }
        *slot = t.clone();
    }
    Ok(copy)
}

/// The streamed blocks packed into their host masters, before the ring exists.
struct Packed<B> {
    /// Model block index → index among the streamed blocks.
    index: Vec<Option<usize>>,
    layout: BlockLayout,
    masters: Masters,
    /// Each block (model index, block) holding the first block's frozen tensors in place of its own.
    held: Vec<(usize, B)>,
}

/// Packs `blocks` into masters of the kind `mode` keeps, one block at a time (see [`BlockStreamer::new`]).
fn pack_blocks<B: Streamable>(
    device: &Device,
    mode: StreamMode,
    num_blocks: usize,
    blocks: impl IntoIterator<Item = Result<(usize, B)>>,
) -> Result<Packed<B>> {
    let blocks = blocks.into_iter();
    let expected = blocks.size_hint().0.max(1);
    let mut index = vec![None; num_blocks];
    let mut layout: Option<BlockLayout> = None;
    let mut masters = Masters::Pageable(Vec::new());
    // Until the ring exists, every block holds the first block's frozen tensors in place of its own, so its
    // own host copies go as soon as they are packed.
    let mut stand_in: Option<Vec<Tensor>> = None;
    let mut held = Vec::new();
    for item in blocks {
        let (i, block) = item?;
        match index.get_mut(i) {
            Some(slot @ None) => *slot = Some(held.len()),
            Some(Some(_)) => candle_core::bail!("streamed block {i} given twice"),
            None => candle_core::bail!("streamed block {i} out of range"),
        }
        let layout = match &layout {
            Some(l) => l,
            None => {
                let l = layout.insert(BlockLayout::of(&block.frozen_tensors()));
                masters = Masters::new(mode, device, l, expected)?;
                l
            }
        };
        masters.pack(layout, &block)?;
        let stand_in = stand_in.get_or_insert_with(|| block.frozen_tensors());
        held.push((i, block.with_frozen(stand_in)?));
    }
    let Some(layout) = layout else {
        candle_core::bail!("block streaming needs at least one streamed block");
    };
    Ok(Packed {
        index,
        layout,
        masters,
        held,
    })
}

/// The streamed blocks of one model: their host masters, the GPU ring and its schedule.
pub struct BlockStreamer {
    /// Model block index → index among the streamed blocks.
    index: Vec<Option<usize>>,
    layout: BlockLayout,
    mode: StreamMode,
    inner: Mutex<Inner>,
}

impl BlockStreamer {
    /// Packs the frozen tensors of `blocks` (model index, block — built anywhere, normally in host RAM) into
    /// host buffers and makes the ring on `device`. Blocks are taken one at a time and each is packed before the
    /// next is made, so a model built straight from its file never holds more than one block's own host copies
    /// next to the packed ones. Returns the streamer and, for each block, its shell: the same block pointing at
    /// slot 0's tensors, which the model keeps in its place.
    pub fn new<B: Streamable>(
        device: &Device,
        num_blocks: usize,
        blocks: impl IntoIterator<Item = Result<(usize, B)>>,
        options: &OffloadOptions,
    ) -> Result<(Self, Vec<(usize, B)>)> {
        let mode = if device.is_cuda() {
            options.mode
        } else {
            StreamMode::Host
        };
        let Packed {
            index,
            layout,
            masters,
            held,
        } = pack_blocks(device, mode, num_blocks, blocks)?;
        let slots = options.slots.max(1);
        let (backend, slot0): (Box<dyn SlotBackend>, Vec<Tensor>) = match masters {
            #[cfg(feature = "cuda")]
            Masters::PageLocked { bufs, ahead } => {
                // Every buffer was taken: the thread has ended.
                drop(ahead);
                let backend =
                    cuda::CudaBackend::new(device, &layout, cuda::Masters::Pinned(bufs), options)?;
                let slot0 = backend.slot_tensors(0);
                (Box::new(backend), slot0)
            }
            #[cfg(feature = "cuda")]
            Masters::Pageable(masters) if mode == StreamMode::Staged => {
                let backend = cuda::CudaBackend::new(
                    device,
                    &layout,
                    cuda::Masters::Pageable(masters),
                    options,
                )?;
                let slot0 = backend.slot_tensors(0);
                (Box::new(backend), slot0)
            }
            Masters::Pageable(masters) => {
                let zeros = layout.zeros(device)?;
                let backend = HostBackend {
                    layout: layout.clone(),
                    device: device.clone(),
                    masters,
                    slots: vec![zeros.clone(); slots],
                };
                (Box::new(backend), zeros)
            }
        };
        let shells = held
            .into_iter()
            .map(|(i, b)| Ok((i, b.with_frozen(&slot0)?)))
            .collect::<Result<Vec<_>>>()?;
        let streamer = Self {
            index,
            layout,
            mode,
            inner: Mutex::new(Inner {
                ring: Ring::new(slots),
                backend,
                stats: StreamStats::default(),
            }),
        };
        Ok((streamer, shells))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| {
            candle_core::Error::Msg("block streamer poisoned by an earlier panic".into())
        })
    }

    /// Whether model block `i` streams.
    pub fn is_streamed(&self, i: usize) -> bool {
        self.index.get(i).is_some_and(|k| k.is_some())
    }

    /// Number of streamed blocks.
    pub fn count(&self) -> usize {
        self.index.iter().flatten().count()
    }

    /// The mode in use (`host` on a device without streams).
    pub fn mode(&self) -> StreamMode {
        self.mode
    }

    /// Bytes of one packed block (with alignment padding).
    pub fn block_bytes(&self) -> usize {
        self.layout.total_bytes
    }

    /// Declares the order in which model blocks will be fetched (resident ones are skipped); `cyclic` when the
    /// order repeats (sampling).
    pub fn begin(&self, model_order: &[usize], cyclic: bool) -> Result<()> {
        let order = model_order
            .iter()
            .filter_map(|&i| self.index.get(i).copied().flatten())
            .collect();
        self.lock()?.ring.begin(order, cyclic);
        Ok(())
    }

    /// The frozen tensors of streamed model block `i`, resident in a slot and ordered before any work queued
    /// after this call; prefetches the next blocks of the declared order. Work that reads the previous fetch's
    /// tensors must be queued before this call.
    pub fn fetch(&self, i: usize) -> Result<Vec<Tensor>> {
        let k = match self.index.get(i).copied().flatten() {
            Some(k) => k,
            None => candle_core::bail!("block {i} does not stream"),
        };
        let mut inner = self.lock()?;
        let inner = &mut *inner;
        let decision = inner.ring.fetch(k);
        if let Some(s) = decision.released {
            inner.backend.release(s)?;
        }
        if decision.loads.first().is_none_or(|l| l.block != k) {
            inner.stats.hits += 1;
        }
        for load in &decision.loads {
            inner.backend.load(load.slot, load.block)?;
            inner.stats.loads += 1;
            inner.stats.bytes += self.layout.data_bytes() as u64;
        }
        inner.backend.acquire(decision.slot)
    }

    /// Waits until every queued copy is done.
    pub fn synchronize(&self) -> Result<()> {
        self.lock()?.backend.synchronize()
    }

    /// The counters so far.
    pub fn stats(&self) -> Result<StreamStats> {
        Ok(self.lock()?.stats.clone())
    }

    /// Restarts the counters.
    pub fn reset_stats(&self) -> Result<()> {
        self.lock()?.stats = StreamStats::default();
        Ok(())
    }
}

#[cfg(test)]
mod tests;

/// Releases the memory `device`'s allocator keeps cached but unused (CUDA: the stream-ordered pool's free chunks);
/// nothing on the CPU. Called between training steps, so every step starts from the same pool.
pub fn release_cached_memory(device: &Device) -> Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => crate::cuda::device::trim_pool(dev),
        _ => Ok(()),
    }
}

/// A device allocation failed: the run should stop cleanly and say how to fit. Shown as the driver's error.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct OutOfMemory(candle_core::Error);

impl OutOfMemory {
    /// `Ok` when `err` is a device allocation failure, else `err` unchanged. candle passes the CUDA driver's error
    /// on boxed behind its backtrace and context, where it cannot be downcast, so this reads the driver's message:
    /// the one place where an error's text decides anything.
    pub fn classify(err: candle_core::Error) -> std::result::Result<Self, candle_core::Error> {
        if is_out_of_memory(&err) {
            Ok(Self(err))
        } else {
            Err(err)
        }
    }

    /// The first line of the driver's message: what a user reads, without the backtrace candle may attach.
    pub fn summary(&self) -> String {
        let text = self.0.to_string();
        text.lines().next().unwrap_or_default().trim().to_string()
    }

    /// The error as candle reported it.
    pub fn into_inner(self) -> candle_core::Error {
        self.0
    }
}

fn is_out_of_memory(err: &candle_core::Error) -> bool {
    let text = format!("{err:?}");
    text.contains("OUT_OF_MEMORY") || text.contains("out of memory")
}
