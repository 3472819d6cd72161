//! The NCCL collective: one process per GPU, NCCL's unique id exchanged by [`super::rendezvous`], reductions on
//! the device's own stream (so they follow the backward's kernels in order). NCCL's library is loaded when a run
//! first needs it ([`library`]), not linked: a build with the `nccl` feature starts where `libnccl.so.2` is
//! missing, and a run over several GPUs there is refused with what to install. NVLink multicast (NVLS) is turned
//! off unless the user set `NCCL_NVLS_ENABLE` themselves.
//!
//! A rank that leaves or dies: the rendezvous link reports it; the next collective fails with that reason, and one already waiting on the GPU for the dead rank is ended by the process's stuck
//! handler ([`super::on_stuck`]) after the grace period, since NCCL itself would wait forever.

// Loading NCCL, handing device buffers to it and sharing the communicator between threads are FFI contracts
// Rust cannot check; each block says what it relies on.
#![allow(unsafe_code)]

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Result, Storage, Tensor};
use cudarc_nccl::nccl::sys;

use super::rendezvous::{rendezvous, Link, RendezvousSpec};
use super::Collective;

/// The file names NCCL's library is looked for under, in order: the runtime's own name (all that pip's
/// `nvidia-nccl-cu*` wheels and the distributions' `libnccl2` packages install), then the development link.
/// The loader's usual search applies: `LD_LIBRARY_PATH`, the binary's RUNPATH (a packaged framesmith's `lib/`),
/// the system's library folders.
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// The oldest NCCL (as `ncclGetVersion` codes it) that has every function of the bindings' table.
const OLDEST_VERSION: c_int = 22800;

/// NCCL's functions, loaded from the first of [`LIBRARY_NAMES`] the loader finds (once per process), or why none
/// can be used, as a message that says what to install.
pub fn library() -> std::result::Result<&'static sys::Lib, String> {
    static LIBRARY: OnceLock<std::result::Result<sys::Lib, String>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| load(&LIBRARY_NAMES))
        .as_ref()
        .map_err(Clone::clone)
}

/// "2.28.3" for NCCL's version code 22803.
fn version_text(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
}

const INSTALL: &str = "install NCCL 2.28 or newer: `pip install nvidia-nccl-cu13` (cu12 for a build against \
                       CUDA 12) and its `nvidia/nccl/lib` folder in LD_LIBRARY_PATH, or NVIDIA's `libnccl2` package \
                       from the CUDA repository, or libnccl.so.2 copied into the `lib` folder beside a packaged \
                       framesmith; or train on one GPU";

/// Loads NCCL from the first of `names` that opens. Its version is read before anything else, so an NCCL too old
/// for the bindings is named rather than failing on a missing function.
fn load(names: &[&str]) -> std::result::Result<sys::Lib, String> {
    let mut tried = Vec::with_capacity(names.len());
    for &name in names {
        // SAFETY: opening the library runs NCCL's initialisers, which set up NCCL's own state only.
        let library = match unsafe { libloading::Library::new(name) } {
            Ok(library) => library,
            Err(err) => {
                tried.push(err.to_string());
                continue;
            }
        };
        let mut code: c_int = 0;
        // SAFETY: `ncclGetVersion(int*)` (every NCCL since 2.3) writes one int through the pointer it gets.
        let read = unsafe {
            library
                .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0")
                .map(|get| get(&mut code))
        };
        match read {
            Ok(0) => {}
            Ok(status) => {
                return Err(format!(
                    "{name} did not tell its NCCL version (status {status}): {INSTALL}"
                ))
            }
            Err(err) => return Err(format!("{name} is not an NCCL library ({err}): {INSTALL}")),
        }
        if code < OLDEST_VERSION {
            return Err(format!(
                "{name} is NCCL {}, older than this build needs: {INSTALL}",
                version_text(code)
            ));
        }
        // The table's constructor panics on a missing function; past the version check none should be.
        let table = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as above; the table's signatures are the bindings' for this NCCL version.
            unsafe { sys::Lib::from_library(library) }
        }));
        return match table {
            Ok(Ok(table)) => Ok(table),
            Ok(Err(err)) => Err(format!(
                "{name} (NCCL {}): {err}: {INSTALL}",
                version_text(code)
            )),
            Err(_) => Err(format!(
                "{name} (NCCL {}) lacks functions this build calls: {INSTALL}",
                version_text(code)
            )),
        };
    }
    Err(format!(
        "training on several GPUs needs NCCL's library, which this machine does not have where the loader looks \
         ({}): {INSTALL}",
        tried.join("; ")
    ))
}

/// `status` as a result, NCCL's own words in the error.
fn checked(lib: &sys::Lib, status: sys::ncclResult_t) -> std::result::Result<(), String> {
    if status == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static, NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr((lib.ncclGetErrorString)(status)) };
    Err(format!("{status:?}: {}", text.to_string_lossy()))
}

/// Sets `NCCL_NVLS_ENABLE=0` unless the user set it: NVLink multicast stays off (call before any communicator
/// exists, ideally at process start, before other threads run).
pub fn disable_nvlink_multicast() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
}

/// An NCCL communicator, aborted when dropped (a rank that ends, or is ended, does not wait on the others).
struct CommCell {
    lib: &'static sys::Lib,
    comm: sys::ncclComm_t,
}

// SAFETY: an NCCL communicator may be used from any thread provided calls on it do not overlap; the Mutex it
// lives in serialises every call.
unsafe impl Send for CommCell {}

impl Drop for CommCell {
    fn drop(&mut self) {
        // SAFETY: `comm` came from ncclCommInitRank and is not used after this.
        let _ = unsafe { (self.lib.ncclCommAbort)(self.comm) };
    }
}

impl CommCell {
    /// `count` f32 from `src` summed over the ranks into `dst`, on `stream`.
    fn all_reduce(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, f32>,
        dst: &mut CudaSlice<f32>,
    ) -> std::result::Result<(), String> {
        let (from, _read) = src.device_ptr(stream);
        let (to, _written) = dst.device_ptr_mut(stream);
        // SAFETY: both buffers hold `src.len()` f32 on this rank's GPU and outlive the stream's use of them (the
        // guards record it); the stream is this communicator's device's.
        let status = unsafe {
            (self.lib.ncclAllReduce)(
                from as *const std::ffi::c_void,
                to as *mut std::ffi::c_void,
                src.len(),
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        checked(self.lib, status)
    }

    /// Rank `root`'s `src` (f32) into every rank's `dst`, on `stream`.
    fn broadcast(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, f32>,
        dst: &mut CudaSlice<f32>,
        root: c_int,
    ) -> std::result::Result<(), String> {
        let (from, _read) = src.device_ptr(stream);
        let (to, _written) = dst.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce`.
        let status = unsafe {
            (self.lib.ncclBroadcast)(
                from as *const std::ffi::c_void,
                to as *mut std::ffi::c_void,
                src.len(),
                sys::ncclDataType_t::ncclFloat32,
                root,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        checked(self.lib, status)
    }
}

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
        let lib = library().map_err(candle_core::Error::Msg)?;
        disable_nvlink_multicast();
        let (bytes, link) = rendezvous(spec, || {
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            // SAFETY: ncclGetUniqueId writes one ncclUniqueId through the pointer.
            checked(lib, unsafe { (lib.ncclGetUniqueId)(&mut id) })
                .map_err(|e| format!("NCCL could not create the run's id: {e}"))?;
            Ok(id.internal.iter().map(|&c| c as u8).collect())
        })
        .map_err(|e| candle_core::Error::Msg(e.0))?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        if bytes.len() != id.internal.len() {
            candle_core::bail!(
                "rank 0 sent an NCCL id of {} bytes (expected {}): run the same framesmith build on every rank",
                bytes.len(),
                id.internal.len()
            );
        }
        for (dst, &src) in id.internal.iter_mut().zip(&bytes) {
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
            let mut comm: sys::ncclComm_t = std::ptr::null_mut();
            let (rank, world) = (spec.rank as c_int, spec.world as c_int);
            // SAFETY: ncclCommInitRank writes the communicator through the pointer; this thread's current CUDA
            // context is the rank's GPU's (bound above), which is the device NCCL takes.
            checked(lib, unsafe { (lib.ncclCommInitRank)(&mut comm, world, id, rank) }).map_err(|e| {
                candle_core::Error::Msg(format!(
                    "NCCL could not set up rank {} of {} on GPU {} ({e}); set NCCL_DEBUG=INFO for NCCL's own \
                     account",
                    spec.rank,
                    spec.world,
                    stream.context().ordinal()
                ))
            })?;
            CommCell { lib, comm }
        };
        Ok(Self {
            comm: Mutex::new(comm),
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
            &CommCell,
            &Arc<CudaStream>,
            &CudaView<'_, f32>,
            &mut CudaSlice<f32>,
        ) -> std::result::Result<(), String>,
    ) -> Result<Vec<Tensor>> {
        self.check()?;
        let _busy = Busy::new(&self.busy);
        let comm = self
            .comm
            .lock()
            .map_err(|_| candle_core::Error::Msg("the NCCL communicator was poisoned".into()))?;
        let stream = self.device.cuda_stream();
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
            op(&comm, &stream, &src, &mut dst).map_err(|e| {
                candle_core::Error::Msg(format!("rank {}: NCCL failed: {e}", self.rank))
            })?;
            let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(dst, self.device.clone()));
            out.push(Tensor::from_storage(storage, n, BackpropOp::none(), false));
        }
        // Waits here for the other ranks: this is where a dead rank would hold this one. (No check after it: a
        // rank may leave as soon as its own last collective is done.)
        stream.synchronize().w()?;
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
        self.each_bucket(buckets, |comm, stream, src, dst| {
            comm.all_reduce(stream, src, dst)
        })
    }

    fn broadcast(&self, buckets: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
        if root >= self.world {
            candle_core::bail!("broadcast from rank {root} in a world of {}", self.world);
        }
        let root = root as c_int;
        // NCCL reads the send buffer on the root only; every rank passes its own (same length).
        self.each_bucket(buckets, |comm, stream, src, dst| {
            comm.broadcast(stream, src, dst, root)
        })
    }

    fn barrier(&self) -> Result<()> {
        let one = Tensor::zeros(1, DType::F32, &Device::Cuda(self.device.clone()))?;
        self.all_reduce_sum(&[one]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_nccl_writes_them() {
        assert_eq!(version_text(22803), "2.28.3");
        assert_eq!(version_text(23203), "2.32.3");
    }

    #[test]
    fn a_missing_library_says_what_to_install() {
        let err = load(&["/nonexistent/libnccl.so.2"])
            .err()
            .unwrap_or_default();
        assert!(err.contains("needs NCCL's library"), "{err}");
        assert!(err.contains("/nonexistent/libnccl.so.2"), "{err}");
        assert!(err.contains("pip install nvidia-nccl-cu13"), "{err}");
        assert!(err.contains("train on one GPU"), "{err}");
    }

    #[test]
    fn a_library_that_is_not_nccl_is_named() {
        // The C library opens everywhere this builds and has no ncclGetVersion.
        let err = load(&["libc.so.6"]).err().unwrap_or_default();
        assert!(err.contains("libc.so.6 is not an NCCL library"), "{err}");
        assert!(err.contains("install NCCL 2.28 or newer"), "{err}");
    }
}
