//! The NCCL collective: one process per GPU, NCCL's unique id exchanged by [`super::rendezvous`], reductions on
//! the device's own stream (so they follow the backward's kernels in order). candle links cudarc's NCCL
//! bindings dynamically, so a build with the `nccl` feature needs `libnccl.so.2` on the loader's path to start at
//! all (the shipped GPU archives are built without it). NVLink multicast (NVLS) is turned off unless the user set
//! `NCCL_NVLS_ENABLE` themselves.
//!
//! A rank that leaves or dies: the rendezvous link reports it; the next collective fails with that reason, and one already waiting on the GPU for the dead rank is ended by the process's stuck
//! handler ([`super::on_stuck`]) after the grace period, since NCCL itself would wait forever.

// Handing device buffers to NCCL and sharing the communicator between threads are FFI contracts Rust cannot
// check; each block says what it relies on.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, ReduceOp};
use candle_core::cuda_backend::WrapErr;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Result, Storage, Tensor};

use super::rendezvous::{rendezvous, Link, RendezvousSpec};
use super::Collective;

/// Sets `NCCL_NVLS_ENABLE=0` unless the user set it: NVLink multicast stays off (call before any communicator
/// exists, ideally at process start, before other threads run).
pub fn disable_nvlink_multicast() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
}

struct CommCell(Comm);

// SAFETY: an NCCL communicator may be used from any thread provided calls on it do not overlap; the Mutex it
// lives in serialises every call.
unsafe impl Send for CommCell {}

/// Set while a call waits on the other ranks; the lost-rank hook uses it to tell a stuck rank from an idle one.
struct Busy(Arc<AtomicBool>);

impl Busy {
    fn new(flag: &Arc<AtomicBool>) -> Self {
        flag.store(true, Ordering::SeqCst);
        Self(flag.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// One rank of a run over NCCL. Fields drop in order: the communicator is aborted before the link says goodbye.
pub struct NcclCollective {
    comm: Mutex<CommCell>,
    device: CudaDevice,
    rank: usize,
    world: usize,
    busy: Arc<AtomicBool>,
    link: Link,
}

impl NcclCollective {
    /// Joins the run `spec` describes on `device` (this rank's GPU): meets the other
    /// ranks at `spec.addr:spec.port`, and creates the communicator. A rank lost while this rank waits on it
    /// for longer than `grace` ends the process through the stuck handler.
    pub fn new(device: &CudaDevice, spec: &RendezvousSpec, grace: Duration) -> Result<Self> {
        disable_nvlink_multicast();
        let (bytes, link) = rendezvous(spec, || {
            let id = Id::new().map_err(|e| format!("NCCL could not create the run's id: {e:?}"))?;
            Ok(id.internal().iter().map(|&c| c as u8).collect())
        })
        .map_err(|e| candle_core::Error::Msg(e.0))?;
        let mut internal = [0 as std::ffi::c_char; 128];
        if bytes.len() != internal.len() {
            candle_core::bail!(
                "rank 0 sent an NCCL id of {} bytes (expected {}): run the same framesmith build on every rank",
                bytes.len(),
                internal.len()
            );
        }
        for (dst, &src) in internal.iter_mut().zip(&bytes) {
            *dst = src as std::ffi::c_char;
        }
        let busy = Arc::new(AtomicBool::new(false));
        let watched = busy.clone();
        link.on_lost(Box::new(move |why: &str| {
            let (why, watched) = (why.to_string(), watched.clone());
            // Off the watcher thread: wait for the rank to leave its collective by itself (it then fails with
            // `why`); one still waiting after `grace` never will.
            let _ = std::thread::Builder::new()
                .name("framesmith-rank-lost".into())
                .spawn(move || {
                    let until = Instant::now() + grace;
                    while Instant::now() < until {
                        if !watched.load(Ordering::SeqCst) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    if watched.load(Ordering::SeqCst) {
                        super::stuck(&why);
                    }
                });
        }));
        let stream = device.cuda_stream();
        stream.context().bind_to_thread().w()?;
        let comm = {
            let _busy = Busy::new(&busy);
            Comm::from_rank(stream, spec.rank, spec.world, Id::uninit(internal)).map_err(|e| {
                candle_core::Error::Msg(format!(
                    "NCCL could not set up rank {} of {} on GPU {} ({e:?}); set NCCL_DEBUG=INFO for NCCL's own \
                     account",
                    spec.rank,
                    spec.world,
                    device.cuda_stream().context().ordinal()
                ))
            })?
        };
        Ok(Self {
            comm: Mutex::new(CommCell(comm)),
            device: device.clone(),
            rank: spec.rank,
            world: spec.world,
            busy,
            link,
        })
    }

    fn check(&self) -> Result<()> {
        match self.link.lost() {
            Some(why) => candle_core::bail!("rank {}: the run cannot go on: {why}", self.rank),
            None => Ok(()),
        }
    }

    /// Runs `op` for each bucket into a new buffer of its length, then waits for the stream.
    fn each_bucket(
        &self,
        buckets: &[Tensor],
        op: impl Fn(
            &Comm,
            &candle_core::cuda_backend::cudarc::driver::CudaView<'_, f32>,
            &mut candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
        ) -> std::result::Result<(), String>,
    ) -> Result<Vec<Tensor>> {
        self.check()?;
        let _busy = Busy::new(&self.busy);
        let comm = self
            .comm
            .lock()
            .map_err(|_| candle_core::Error::Msg("the NCCL communicator was poisoned".into()))?;
        let mut out = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            if bucket.dtype() != DType::F32 || bucket.rank() != 1 {
                candle_core::bail!("NCCL buckets are 1-D f32 tensors");
            }
            let bucket = bucket.contiguous()?;
            let n = bucket.elem_count();
            let (storage, layout) = bucket.storage_and_layout();
            let Storage::Cuda(storage) = &*storage else {
                candle_core::bail!("an NCCL bucket is not on the GPU");
            };
            let Some((start, end)) = layout.contiguous_offsets() else {
                candle_core::bail!("an NCCL bucket is not contiguous");
            };
            let src = storage.as_cuda_slice::<f32>()?.slice(start..end);
            // SAFETY: every element is written by the collective before anything reads the buffer.
            let mut dst = unsafe { self.device.alloc::<f32>(n) }?;
            op(&comm.0, &src, &mut dst).map_err(|e| {
                candle_core::Error::Msg(format!("rank {}: NCCL failed: {e}", self.rank))
            })?;
            let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(dst, self.device.clone()));
            out.push(Tensor::from_storage(storage, n, BackpropOp::none(), false));
        }
        // Waits here for the other ranks: this is where a dead rank would hold this one. (No check after it: a
        // rank may leave as soon as its own last collective is done.)
        self.device.cuda_stream().synchronize().w()?;
        Ok(out)
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, buckets: &[Tensor]) -> Result<Vec<Tensor>> {
        self.each_bucket(buckets, |comm, src, dst| {
            comm.all_reduce(src, dst, &ReduceOp::Sum)
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
        })
    }

    fn broadcast(&self, buckets: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
        if root >= self.world {
            candle_core::bail!("broadcast from rank {root} in a world of {}", self.world);
        }
        let root = root as i32;
        // NCCL reads the send buffer on the root only; every rank passes its own (same length).
        self.each_bucket(buckets, |comm, src, dst| {
            comm.broadcast(Some(src), dst, root)
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
        })
    }

    fn barrier(&self) -> Result<()> {
        let one = Tensor::zeros(1, DType::F32, &Device::Cuda(self.device.clone()))?;
        self.all_reduce_sum(&[one]).map(|_| ())
    }
}
