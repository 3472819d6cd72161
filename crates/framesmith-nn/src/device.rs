//! The one door to the device for the engine, the CLI and the bench: open a CUDA device, count them, its compute
//! capability, FP8 tensor-core support, VRAM (hold back beyond a budget, measure), the memory pool's marks, stream
//! timing, the device checks and what the CUDA libraries report. Every function exists in every build: without
//! the `cuda` feature, or for a CPU device, queries answer `None` (or 0) and holds hold nothing, and what only
//! CUDA can do returns [`DeviceError::NotBuilt`]. The `cfg`s on CUDA live in this crate, never above it.

use std::time::Instant;

use candle_core::Device;

/// Whether this build has CUDA (the `cuda` feature).
pub const CUDA_BUILD: bool = cfg!(feature = "cuda");

/// Whether this build has cuDNN's fused attention (the `cudnn` feature).
pub const CUDNN_BUILD: bool = cfg!(feature = "cudnn");

/// Why a device could not be opened or asked.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Asked of a build without the `cuda` feature; names what was asked.
    #[error(
        "{0} needs a CUDA build of Framesmith (this one was built without the `cuda` feature)"
    )]
    NotBuilt(&'static str),
    /// The NVIDIA driver (or cuDNN, for a build that imports it lazily) cannot be loaded.
    #[error("{0}")]
    DriverMissing(String),
    /// The device (or this build) cannot do what was asked; says which and why.
    #[error("{0}")]
    Unsupported(String),
    /// CUDA or candle reported an error.
    #[error(transparent)]
    Cuda(#[from] candle_core::Error),
}

/// Opens CUDA device `index` after checking that the NVIDIA driver can be loaded.
pub fn open_cuda(index: usize) -> Result<Device, DeviceError> {
    if !CUDA_BUILD {
        return Err(DeviceError::NotBuilt("a CUDA device"));
    }
    if let Some(why) = crate::driver::nvidia_driver_missing() {
        return Err(DeviceError::DriverMissing(why));
    }
    Ok(Device::new_cuda(index)?)
}

/// CUDA devices this build can open (0 without the `cuda` feature or without the NVIDIA driver).
pub fn usable_count() -> usize {
    if !CUDA_BUILD || crate::driver::nvidia_driver_missing().is_some() {
        return 0;
    }
    (0..16).take_while(|&i| Device::new_cuda(i).is_ok()).count()
}

/// The compute capability (major, minor) of a CUDA `device`; `None` for any other device.
pub fn compute_capability(device: &Device) -> candle_core::Result<Option<(u32, u32)>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::compute_capability(cuda).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// How this build's kernels run on a CUDA `device` (their machine code for its architecture, or PTX the driver
/// compiles on first use), as a line for the run log; `None` for any other device or when it cannot be asked.
pub fn kernel_code_line(device: &Device) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::kernel_code_line(cuda).ok();
    }
    let _ = device;
    None
}

/// Runs one small FP8 matrix product on `device`: `Ok` when the card and cuBLASLt have FP8 tensor cores
/// (Hopper, compute capability 9.0 or newer, and cuBLAS 12.9 or newer).
pub fn probe_fp8_matmul(device: &Device) -> Result<(), DeviceError> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::fp8_gemm::probe(device).map_err(DeviceError::from)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Err(DeviceError::NotBuilt("FP8 matrix products"))
    }
}

/// `model.fp8_attention`: from now on attention on `device` runs cuDNN's FP8 fused kernels, forward and backward
/// (`on`), or bf16 ones again (`off`; always `Ok`). Turning it on first checks that the card and cuDNN can (compute
/// capability 9.0 or newer, one small FP8 attention forward and backward): the error names the card and why, and
/// a CPU device or a build without cuDNN is refused. Shapes cuDNN's FP8 kernels do not take on that card (a head
/// dim other than 128 on Hopper) keep running in bf16; [`crate::attention::fp8_calls`] counts both.
pub fn set_fp8_attention(device: &Device, on: bool) -> Result<(), DeviceError> {
    if !on {
        #[cfg(feature = "cudnn")]
        if let Device::Cuda(cuda) = device {
            crate::cuda::attention_fp8::disable(cuda);
        }
        return Ok(());
    }
    match device {
        #[cfg(feature = "cudnn")]
        Device::Cuda(cuda) => crate::cuda::attention_fp8::probe(cuda)
            .map_err(|e| DeviceError::Unsupported(format!("{e:#}"))),
        #[cfg(not(feature = "cudnn"))]
        Device::Cuda(_) => Err(DeviceError::Unsupported(
            "FP8 attention is cuDNN's fused FP8 attention, and this build of Framesmith has no cuDNN (it was \
             built without the `cudnn` feature)"
                .into(),
        )),
        Device::Cpu => Err(DeviceError::Unsupported(
            "FP8 attention runs on NVIDIA GPUs only (cuDNN's fused FP8 attention), not on the CPU".into(),
        )),
        _ => Err(DeviceError::Unsupported(
            "FP8 attention runs on NVIDIA GPUs only (cuDNN's fused FP8 attention)".into(),
        )),
    }
}

/// Attention runs in bf16 again on every device [`set_fp8_attention`] turned FP8 on: what a run asked for ends
/// with the run, so a later run or a generation in the same process starts from bf16.
pub fn clear_fp8_attention() {
    #[cfg(feature = "cudnn")]
    crate::cuda::attention_fp8::disable_all();
}

#[cfg(feature = "cuda")]
type Reservation = crate::cuda::device::VramReservation;
/// Nothing can be held without CUDA: a [`VramHold`] is never made.
#[cfg(not(feature = "cuda"))]
type Reservation = std::convert::Infallible;

/// Device memory held back so that a command uses only a budget of the card, until dropped.
pub struct VramHold {
    /// Bytes held back.
    pub bytes: u64,
    /// The budget it keeps the command within.
    pub budget: u64,
    _reservation: Reservation,
}

/// Holds back what is free on a CUDA `device` beyond a card of `budget` bytes (memory already in use counts
/// against the budget), so that a command fails its allocations where a card of that size would. `None` for any
/// other device, without CUDA, or when no more than that is free.
pub fn hold_vram_budget(device: &Device, budget: u64) -> candle_core::Result<Option<VramHold>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        let held = crate::cuda::device::VramReservation::leave_budget(cuda, budget)?;
        return Ok(held.map(|h| VramHold {
            bytes: h.bytes() as u64,
            budget,
            _reservation: h,
        }));
    }
    let _ = (device, budget);
    Ok(None)
}

/// What a command has taken from a CUDA card, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct VramUse {
    /// The most taken at once: the memory pool's reserved high-water mark plus what lives outside the pool (the
    /// CUDA context, library workspaces, kernels), the budget's own hold left out.
    pub peak: u64,
    /// Of that, outside the pool.
    pub outside_pool: u64,
    /// The most the pool handed out at once since the process began: the tensors' own peak, without what the
    /// pool reserved beyond them (its fragmentation) or what lives outside it.
    pub peak_used: u64,
    /// Allocated from the pool now.
    pub in_use: u64,
    /// Reserved by the pool now (in use or cached).
    pub reserved: u64,
    /// Free on the card now.
    pub free: u64,
}

/// A CUDA pool's marks and its card's memory, as [`VramUse`] reads them.
struct PoolMarks {
    peak_reserved: u64,
    peak_used: u64,
    in_use: u64,
    reserved: u64,
    free: u64,
    total: u64,
}

impl PoolMarks {
    /// The marks of a CUDA `device` now; `None` for any other device or when the card cannot be asked.
    fn read(device: &Device) -> Option<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            use crate::cuda::device;
            let (free, total) = device::memory_info(dev).ok()?;
            return Some(Self {
                peak_reserved: device::peak_reserved_bytes(dev).ok()?,
                peak_used: device::peak_memory_bytes(dev).ok()?,
                in_use: device::used_memory_bytes(dev).ok()?,
                reserved: device::reserved_bytes(dev).ok()?,
                free,
                total,
            });
        }
        let _ = device;
        None
    }
}

impl VramUse {
    /// Measures `device` now; `held_back` is what a [`VramHold`] keeps. `None` off CUDA or when the card cannot
    /// be asked.
    pub fn measure(device: &Device, held_back: u64) -> Option<Self> {
        PoolMarks::read(device).map(|marks| Self::from_marks(&marks, held_back))
    }

    /// What is taken on the card and neither in the pool nor held back lives outside the pool.
    fn from_marks(marks: &PoolMarks, held_back: u64) -> Self {
        let outside_pool = marks
            .total
            .saturating_sub(marks.free)
            .saturating_sub(held_back)
            .saturating_sub(marks.reserved);
        Self {
            peak: marks.peak_reserved + outside_pool,
            outside_pool,
            peak_used: marks.peak_used,
            in_use: marks.in_use,
            reserved: marks.reserved,
            free: marks.free,
        }
    }
}

/// Lets a CUDA `device`'s memory pool keep up to `bytes` of freed memory across synchronisations instead of
/// returning it to the driver; nothing for any other device.
pub fn set_pool_release_threshold(device: &Device, bytes: u64) -> candle_core::Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::set_pool_release_threshold(cuda, bytes);
    }
    let _ = (device, bytes);
    Ok(())
}

/// Restarts a CUDA `device` pool's high-water mark of the bytes handed out; nothing for any other device.
pub fn reset_peak_memory(device: &Device) -> candle_core::Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::reset_peak_memory(cuda);
    }
    let _ = device;
    Ok(())
}

/// High-water mark of the bytes a CUDA `device`'s pool handed out since [`reset_peak_memory`]; `None` for any
/// other device.
pub fn peak_memory_bytes(device: &Device) -> candle_core::Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::peak_memory_bytes(cuda).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// Bytes allocated from a CUDA `device`'s pool now; `None` for any other device.
pub fn used_memory_bytes(device: &Device) -> candle_core::Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::used_memory_bytes(cuda).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// Restarts the high-water mark of the memory a CUDA `device`'s pool reserved from the driver; nothing for any
/// other device.
pub fn reset_peak_reserved(device: &Device) -> candle_core::Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::reset_peak_reserved(cuda);
    }
    let _ = device;
    Ok(())
}

/// High-water mark of the memory a CUDA `device`'s pool reserved from the driver since
/// [`reset_peak_reserved`] (what a run takes from the card); `None` for any other device.
pub fn peak_reserved_bytes(device: &Device) -> candle_core::Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::peak_reserved_bytes(cuda).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// GB/s of a plain page-locked host → CUDA `device` copy of `bytes` (best of `reps`); `None` for any other
/// device.
pub fn pinned_copy_bandwidth(
    device: &Device,
    bytes: usize,
    reps: usize,
) -> candle_core::Result<Option<f64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        return crate::cuda::device::pinned_copy_bandwidth(cuda, bytes, reps).map(Some);
    }
    let _ = (device, bytes, reps);
    Ok(None)
}

/// Times work queued on a device: events on a CUDA device's stream, the wall clock up to a synchronize
/// elsewhere.
pub struct Timer(Clock);

enum Clock {
    Host(Instant),
    #[cfg(feature = "cuda")]
    Events(crate::cuda::device::EventTimer),
}

impl Timer {
    /// Starts timing work queued on `device` from now.
    pub fn start(device: &Device) -> candle_core::Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(cuda) = device {
            return Ok(Self(Clock::Events(crate::cuda::device::EventTimer::start(
                cuda,
            )?)));
        }
        let _ = device;
        Ok(Self(Clock::Host(Instant::now())))
    }

    /// Waits for the work queued on `device` (the one given to [`Timer::start`]): milliseconds since the start.
    pub fn stop(self, device: &Device) -> candle_core::Result<f64> {
        match self.0 {
            Clock::Host(started) => {
                device.synchronize()?;
                Ok(started.elapsed().as_secs_f64() * 1e3)
            }
            #[cfg(feature = "cuda")]
            Clock::Events(timer) => match device {
                Device::Cuda(cuda) => timer.stop(cuda),
                _ => candle_core::bail!("a timer started on a CUDA device was stopped on another"),
            },
        }
    }
}

/// The outcome of one comparison of a device's kernel with its reference ([`run_checks`]).
#[derive(Clone, Debug)]
pub struct CheckOutcome {
    /// What was compared (op, dtype, shape, output or gradient).
    pub name: String,
    /// ‖got − want‖ / ‖want‖ (NaN when either side holds a NaN).
    pub rel_err: f64,
    /// Largest element-wise |got − want|.
    pub max_abs: f64,
    /// The tolerance `rel_err` must stay within.
    pub tol: f64,
}

impl CheckOutcome {
    /// Whether the comparison is within tolerance (NaN fails).
    pub fn passed(&self) -> bool {
        self.rel_err.is_finite() && self.rel_err <= self.tol
    }
}

/// Compares every CUDA kernel of this build on `device` with its CPU reference.
pub fn run_checks(device: &Device) -> Result<Vec<CheckOutcome>, DeviceError> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::check::run_all(device).map_err(DeviceError::from)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Err(DeviceError::NotBuilt("the device checks"))
    }
}

/// One CUDA library and what it says its version is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// `cuBLAS`.
    pub name: &'static str,
    /// The start of its file name on Linux (`libcublas.so`), to find where it was loaded from.
    pub file_prefix: &'static str,
    /// `13.0.0`, or why it could not be asked.
    pub version: Result<String, String>,
}

/// What a GPU build's CUDA side reports about itself, for the system check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaLibraries {
    /// CUDA devices the driver reports, or why it cannot count them.
    pub device_count: Result<usize, String>,
    /// The libraries linked into this build, each with its version.
    pub linked: Vec<Library>,
    /// cuDNN as the fused attention will find it (opened, and kept loaded), in a build with the `cudnn` feature.
    pub cudnn: Option<Library>,
}

/// The devices the driver counts and the CUDA libraries' versions (host-side queries: no context is created);
/// `None` in a build without CUDA.
pub fn cuda_libraries() -> Option<CudaLibraries> {
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::libraries;
        let device_count = libraries::device_count();
        let linked = libraries::linked();
        #[cfg(feature = "cudnn")]
        let cudnn = Some(libraries::cudnn());
        #[cfg(not(feature = "cudnn"))]
        let cudnn = None;
        Some(CudaLibraries {
            device_count,
            linked,
            cudnn,
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_device_answers_none_and_holds_nothing() -> candle_core::Result<()> {
        let cpu = Device::Cpu;
        assert_eq!(compute_capability(&cpu)?, None);
        assert_eq!(kernel_code_line(&cpu), None);
        assert!(hold_vram_budget(&cpu, 1 << 30)?.is_none());
        assert!(VramUse::measure(&cpu, 0).is_none());
        assert_eq!(peak_memory_bytes(&cpu)?, None);
        assert_eq!(used_memory_bytes(&cpu)?, None);
        assert_eq!(peak_reserved_bytes(&cpu)?, None);
        assert_eq!(pinned_copy_bandwidth(&cpu, 1024, 1)?, None);
        reset_peak_memory(&cpu)?;
        reset_peak_reserved(&cpu)?;
        set_pool_release_threshold(&cpu, u64::MAX)
    }

    /// FP8 attention is refused on the CPU by name; turning it off is always fine.
    #[test]
    fn fp8_attention_is_refused_on_the_cpu() {
        let err = set_fp8_attention(&Device::Cpu, true).err();
        assert!(
            matches!(&err, Some(DeviceError::Unsupported(why)) if why.contains("not on the CPU")),
            "{err:?}"
        );
        assert!(set_fp8_attention(&Device::Cpu, false).is_ok());
    }

    #[test]
    fn what_lies_outside_the_pool_leaves_out_the_pool_and_the_hold() {
        let gib = 1u64 << 30;
        // An 80 GiB card with 10 free: 70 taken, of which 50 reserved by the pool and 8 held back: 12 outside.
        let marks = PoolMarks {
            peak_reserved: 40 * gib,
            peak_used: 35 * gib,
            in_use: 30 * gib,
            reserved: 50 * gib,
            free: 10 * gib,
            total: 80 * gib,
        };
        let used = VramUse::from_marks(&marks, 8 * gib);
        assert_eq!(used.outside_pool, 12 * gib);
        assert_eq!((used.peak, used.peak_used), (52 * gib, 35 * gib));
        assert_eq!(
            (used.in_use, used.reserved, used.free),
            (30 * gib, 50 * gib, 10 * gib)
        );
    }

    #[test]
    fn a_cpu_build_says_what_needs_cuda() {
        if CUDA_BUILD {
            return;
        }
        assert_eq!(usable_count(), 0);
        assert!(cuda_libraries().is_none());
        for err in [
            open_cuda(0).err(),
            probe_fp8_matmul(&Device::Cpu).err(),
            run_checks(&Device::Cpu).err(),
        ] {
            let err = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("needs a CUDA build"), "{err}");
        }
    }

    #[test]
    fn a_check_passes_within_tolerance_and_never_on_nan() {
        let outcome = |rel_err| CheckOutcome {
            name: "op".into(),
            rel_err,
            max_abs: 0.0,
            tol: 1e-3,
        };
        assert!(outcome(1e-4).passed());
        assert!(!outcome(1e-2).passed());
        assert!(!outcome(f64::NAN).passed());
    }
}
