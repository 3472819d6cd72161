//! cuDNN's FP8 fused attention (`model.fp8_attention`), forward and backward, with the same contract as the bf16
//! kernels of [`super::attention`]: bf16 `[b, l, heads, head_dim]` in, bf16 out, the same log-sum-exp statistics
//! (so a tape or a kept attention moves between the two). q, k, v (and in the backward o and dO) are quantised to
//! e4m3fn per tensor on the GPU (`kernels/fp8_attention.cu`, which also says how each scale is chosen), cuDNN
//! multiplies in FP8 with f32 accumulation, and what it writes in e4m3fn (O, dQ, dK, dV on Hopper; only dP, inside
//! the kernel, on Blackwell with cuDNN 9.13+, where the outputs are bf16) is read back to bf16. No scale ever goes
//! through the host: a call queues its kernels and returns.
//!
//! The gradients' scales are delayed (the histories of `kernels/fp8_attention.cu`), one history per device and
//! attention shape, measured once by a calibration backward the first time a shape is seen.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::attention::{bf16_view, bind, cuda_storage, seq_lens, shim_error, Geo, Sdpa};
use super::ptx::{self, long};
use crate::ops::Dense;

extern "C" {
    fn fs_sdpa_fp8_workspace(
        device: i32,
        b: i64,
        h: i64,
        sq: i64,
        skv: i64,
        d: i64,
        padded: i32,
        backward: i32,
        bf16_out: i32,
        scale: f32,
        bytes: *mut i64,
    ) -> i32;
    fn fs_sdpa_fp8_forward(
        device: i32,
        b: i64,
        h: i64,
        sq: i64,
        skv: i64,
        d: i64,
        padded: i32,
        bf16_out: i32,
        scale: f32,
        stream: *mut c_void,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *mut c_void,
        stats: *mut c_void,
        slots: *mut c_void,
        seq_q: *const c_void,
        seq_kv: *const c_void,
        workspace: *mut c_void,
    ) -> i32;
    fn fs_sdpa_fp8_backward(
        device: i32,
        b: i64,
        h: i64,
        sq: i64,
        skv: i64,
        d: i64,
        padded: i32,
        bf16_out: i32,
        scale: f32,
        stream: *mut c_void,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        d_o: *const c_void,
        stats: *const c_void,
        dq: *mut c_void,
        dk: *mut c_void,
        dv: *mut c_void,
        slots: *mut c_void,
        seq_q: *const c_void,
        seq_kv: *const c_void,
        workspace: *mut c_void,
    ) -> i32;
}

/// The slots of `kernels/fp8_attention.h` that the Rust side names (same numbers, same order).
mod slot {
    pub const AMAX_Q: i32 = 0;
    pub const AMAX_K: i32 = 1;
    pub const AMAX_V: i32 = 2;
    pub const AMAX_O: i32 = 3;
    pub const AMAX_DO: i32 = 4;
    pub const SCALE_Q: i32 = 5;
    pub const SCALE_K: i32 = 6;
    pub const SCALE_V: i32 = 7;
    pub const SCALE_O: i32 = 8;
    pub const SCALE_DO: i32 = 9;
    pub const DESCALE_O: i32 = 14;
    pub const DESCALE_DQ: i32 = 21;
    pub const DESCALE_DK: i32 = 22;
    pub const DESCALE_DV: i32 = 23;
    /// `FS_SLOTS`.
    pub const COUNT: usize = 31;
    /// `FS_HISTORY`: dQ, dK, dV, dP and the saturation count.
    pub const HISTORY: usize = 5;
    /// `FS_HIST_SATURATED`.
    pub const SATURATED: usize = 4;
}

/// How much a gradient history decays at each backward of its shape (a shape's history halves in about 70 calls,
/// two to three steps of a 30–40 block model, unless a call measures more).
const HISTORY_DECAY: f32 = 0.99;

/// One device's FP8 attention: whether cuDNN writes bf16 outputs there, the gradient histories per shape, and the
/// shapes cuDNN would not build FP8 graphs for (they run in bf16).
struct DeviceState {
    bf16_out: bool,
    histories: BTreeMap<(Geo, bool), History>,
    refused: BTreeSet<(Geo, bool)>,
}

struct History {
    values: CudaSlice<f32>,
    calibrated: bool,
}

/// Probed devices, by CUDA ordinal.
static DEVICES: Mutex<BTreeMap<usize, DeviceState>> = Mutex::new(BTreeMap::new());

static FP8_CALLS: AtomicU64 = AtomicU64::new(0);
static BF16_CALLS: AtomicU64 = AtomicU64::new(0);

fn ordinal(dev: &CudaDevice) -> usize {
    dev.cuda_stream().context().ordinal()
}

/// Checks that `dev` runs cuDNN's FP8 attention forward and backward (compute capability 9.0 or newer, a cuDNN
/// that builds the graphs, one small call that runs), and remembers how (bf16 or e4m3fn outputs). The error says
/// which card and why.
pub fn probe(dev: &CudaDevice) -> Result<()> {
    let ctx = dev.cuda_stream().context().clone();
    let name = ctx.name().unwrap_or_else(|_| "this GPU".into());
    let (major, minor) = super::device::compute_capability(dev)?;
    if major < 9 {
        candle_core::bail!(
            "{name} (compute capability {major}.{minor}) has no FP8 fused attention: cuDNN's needs Hopper \
             (compute capability 9.0) or newer"
        );
    }
    let geo = Geo {
        b: 1,
        h: 2,
        lq: 256,
        lk: 256,
        d: 128,
    };
    // Blackwell with cuDNN 9.13+ writes bf16 outputs; anything else (or a cuDNN that will not) e4m3fn ones.
    let modes: &[bool] = if major >= 10 { &[true, false] } else { &[false] };
    let mut chosen = None;
    let mut refusal = None;
    for &bf16_out in modes {
        match graphs(dev, geo, false, bf16_out) {
            Ok(()) => {
                chosen = Some(bf16_out);
                break;
            }
            Err(e) => refusal = Some(e),
        }
    }
    let Some(bf16_out) = chosen else {
        let why = refusal.map_or_else(|| "no graph".to_string(), |e| e.to_string());
        candle_core::bail!("cuDNN cannot run FP8 attention on {name}: {why}");
    };
    lock().insert(
        ordinal(dev),
        DeviceState {
            bf16_out,
            histories: BTreeMap::new(),
            refused: BTreeSet::new(),
        },
    );
    let run = || -> Result<bool> {
        let device = candle_core::Device::Cuda(dev.clone());
        let x = Tensor::randn(0f32, 1.0, (geo.b, geo.lq, geo.h, geo.d), &device)?.to_dtype(DType::BF16)?;
        let (o, stats) = forward_stats(&x, &x, &x, None)?;
        let (dq, dk, dv) = backward_stats([&x, &x, &x, &o, &x], &stats, None)?;
        let mut finite = true;
        for t in [&o, &dq, &dk, &dv] {
            finite &= t.to_dtype(DType::F32)?.sqr()?.sum_all()?.to_scalar::<f32>()?.is_finite();
        }
        Ok(finite)
    };
    let outcome = run();
    // The probe's shape keeps no history: a run's first call of it calibrates again.
    if let Some(state) = lock().get_mut(&ordinal(dev)) {
        state.histories.clear();
    }
    match outcome {
        Ok(true) => Ok(()),
        Ok(false) => {
            lock().remove(&ordinal(dev));
            candle_core::bail!("cuDNN's FP8 attention on {name} gave non-finite values in a test call")
        }
        Err(e) => {
            lock().remove(&ordinal(dev));
            candle_core::bail!("cuDNN's FP8 attention failed on {name}: {e}")
        }
    }
}

/// Attention on `dev` runs in bf16 again (its histories are dropped).
pub fn disable(dev: &CudaDevice) {
    lock().remove(&ordinal(dev));
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<usize, DeviceState>> {
    DEVICES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds (or finds) the FP8 forward and backward graphs of `geo`.
fn graphs(dev: &CudaDevice, geo: Geo, padded: bool, bf16_out: bool) -> Result<()> {
    workspace_bytes(dev, geo, padded, false, bf16_out)?;
    workspace_bytes(dev, geo, padded, true, bf16_out)?;
    Ok(())
}

/// Whether attention on `q` [b, lq, h, d] over keys `k` runs in FP8 on its device: the device was probed, the
/// head dim is one cuDNN's FP8 kernels take there (128 on Hopper, a multiple of 16 up to 128 on Blackwell), and
/// cuDNN built both graphs of the shape. A shape it refused runs in bf16 (counted in [`calls`]).
pub fn ready(q: &Tensor, k: &Tensor, padded: bool) -> bool {
    let candle_core::Device::Cuda(dev) = q.device() else {
        return false;
    };
    let (Ok((b, lq, h, d)), Ok(lk)) = (q.dims4(), k.dim(1)) else {
        return false;
    };
    let geo = Geo { b, h, lq, lk, d };
    let bf16_out = {
        let devices = lock();
        let Some(state) = devices.get(&ordinal(dev)) else {
            return false;
        };
        if state.refused.contains(&(geo, padded)) {
            BF16_CALLS.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        state.bf16_out
    };
    let head_dim_ok = if bf16_out {
        d % 16 == 0 && d <= 128
    } else {
        d == 128
    };
    let ok = head_dim_ok && graphs(dev, geo, padded, bf16_out).is_ok();
    if ok {
        FP8_CALLS.fetch_add(1, Ordering::Relaxed);
    } else {
        BF16_CALLS.fetch_add(1, Ordering::Relaxed);
        if let Some(state) = lock().get_mut(&ordinal(dev)) {
            state.refused.insert((geo, padded));
        }
    }
    ok
}

/// Attention calls so far that ran in FP8, and calls that FP8 attention would have run but cuDNN refused their
/// shape (they ran in bf16).
pub fn calls() -> (u64, u64) {
    (
        FP8_CALLS.load(Ordering::Relaxed),
        BF16_CALLS.load(Ordering::Relaxed),
    )
}

/// Gradients on `dev` that went beyond their delayed scale's range (saturated at ±448) in the backward calls so
/// far. Reads the histories back: waits for the device.
pub fn saturations(dev: &CudaDevice) -> Result<u64> {
    let devices = lock();
    let Some(state) = devices.get(&ordinal(dev)) else {
        return Ok(0);
    };
    let mut total = 0u64;
    for history in state.histories.values() {
        let values = dev.clone_dtoh(&history.values)?;
        total += values[slot::SATURATED] as u64;
    }
    Ok(total)
}

fn bf16_out(dev: &CudaDevice) -> Result<bool> {
    match lock().get(&ordinal(dev)) {
        Some(state) => Ok(state.bf16_out),
        None => candle_core::bail!("FP8 attention was not checked on this GPU (framesmith_nn::device::set_fp8_attention)"),
    }
}

/// The workspace of the FP8 forward or backward graph of `g` (built, or found in cuDNN's cache, on the way).
fn workspace(
    dev: &CudaDevice,
    g: Geo,
    padded: bool,
    backward: bool,
    bf16_out: bool,
) -> Result<CudaSlice<u8>> {
    let bytes = workspace_bytes(dev, g, padded, backward, bf16_out)?;
    // SAFETY: scratch memory for cuDNN, never read by us.
    unsafe { dev.alloc::<u8>(bytes.max(1)) }
}

fn workspace_bytes(
    dev: &CudaDevice,
    g: Geo,
    padded: bool,
    backward: bool,
    bf16_out: bool,
) -> Result<usize> {
    let device = bind(dev)?;
    let mut bytes = 0i64;
    // SAFETY: plain values and a pointer to a live i64.
    let rc = unsafe {
        fs_sdpa_fp8_workspace(
            device,
            g.b as i64,
            g.h as i64,
            g.lq as i64,
            g.lk as i64,
            g.d as i64,
            i32::from(padded),
            i32::from(backward),
            i32::from(bf16_out),
            g.scale(),
            &mut bytes,
        )
    };
    if rc != 0 {
        return Err(shim_error("cuDNN FP8 attention plan"));
    }
    Ok(bytes.max(0) as usize)
}

/// An output cuDNN writes: bf16, or e4m3fn codes read back to bf16 afterwards.
enum OutBuf {
    Bf16(CudaSlice<half::bf16>),
    Fp8(CudaSlice<u8>),
}

impl OutBuf {
    fn new(dev: &CudaDevice, n: usize, bf16_out: bool) -> Result<Self> {
        // SAFETY: written completely by cuDNN before being read.
        Ok(if bf16_out {
            Self::Bf16(unsafe { dev.alloc::<half::bf16>(n.max(1))? })
        } else {
            Self::Fp8(unsafe { dev.alloc::<u8>(n.max(1))? })
        })
    }

    fn ptr_mut<'a>(&'a mut self, stream: &'a Arc<CudaStream>) -> (u64, SyncOnDrop<'a>) {
        match self {
            Self::Bf16(s) => s.device_ptr_mut(stream),
            Self::Fp8(s) => s.device_ptr_mut(stream),
        }
    }

    /// The values in bf16 (e4m3fn codes times `slots[descale]`).
    fn into_bf16(
        self,
        dev: &CudaDevice,
        n: usize,
        slots: &CudaSlice<f32>,
        descale: i32,
    ) -> Result<CudaSlice<half::bf16>> {
        match self {
            Self::Bf16(s) => Ok(s),
            Self::Fp8(codes) => dequantize(dev, &codes, n, slots, descale),
        }
    }
}

/// One thread, for the kernels that compute scales.
fn single() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A bf16 input's elements, and whether they can be read 8 at a time (a multiple of 8, 16-byte aligned start).
struct Input<'a> {
    view: CudaView<'a, half::bf16>,
    n: usize,
    vec: bool,
}

fn input<'a>(s: &'a CudaStorage, l: &Layout) -> Result<Input<'a>> {
    let view = bf16_view(s, l)?;
    let n = l.shape().elem_count();
    Ok(Input {
        view,
        n,
        vec: n % 8 == 0 && l.start_offset() % 8 == 0,
    })
}

/// Folds the largest magnitude of `x` into `slots[at]`.
fn amax(dev: &CudaDevice, x: &Input<'_>, slots: &mut CudaSlice<f32>, at: i32) -> Result<()> {
    let func = ptx::load(dev, &ptx::FP8_ATTENTION, "fs_fp8_attn_amax_bf16")?;
    let (n, vec) = (long(x.n)?, i32::from(x.vec));
    let work = if x.vec { x.n / 8 } else { x.n };
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&x.view).arg(&n).arg(&vec).arg(slots).arg(&at);
    // SAFETY: argument types and order match the kernel; `x` holds n values (16-byte aligned with `vec`), `slots`
    // COUNT floats.
    unsafe { b.launch(ptx::elementwise_config(work)) }.w()?;
    Ok(())
}

/// `x` in e4m3fn with the scale in `slots[scale]`.
fn quantize(
    dev: &CudaDevice,
    x: &Input<'_>,
    slots: &CudaSlice<f32>,
    scale: i32,
) -> Result<CudaSlice<u8>> {
    let func = ptx::load(dev, &ptx::FP8_ATTENTION, "fs_fp8_attn_quantize_bf16")?;
    // SAFETY: the kernel writes every code before any is read.
    let codes = unsafe { dev.alloc::<u8>(x.n.max(1))? };
    let (n, vec) = (long(x.n)?, i32::from(x.vec));
    let work = if x.vec { x.n / 8 } else { x.n };
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&x.view)
        .arg(&codes)
        .arg(&n)
        .arg(&vec)
        .arg(slots)
        .arg(&scale);
    // SAFETY: as in `amax`; `codes` holds n bytes, freshly allocated (aligned).
    unsafe { b.launch(ptx::elementwise_config(work)) }.w()?;
    Ok(codes)
}

/// e4m3fn `codes` as bf16, times `slots[descale]`.
fn dequantize(
    dev: &CudaDevice,
    codes: &CudaSlice<u8>,
    n: usize,
    slots: &CudaSlice<f32>,
    descale: i32,
) -> Result<CudaSlice<half::bf16>> {
    let func = ptx::load(dev, &ptx::FP8_ATTENTION, "fs_fp8_attn_dequantize_bf16")?;
    // SAFETY: the kernel writes every value before any is read.
    let out = unsafe { dev.alloc::<half::bf16>(n.max(1))? };
    let count = long(n)?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(codes).arg(&out).arg(&count).arg(slots).arg(&descale);
    // SAFETY: `codes` and `out` hold n values, `slots` COUNT floats.
    unsafe { b.launch(ptx::elementwise_config(n)) }.w()?;
    Ok(out)
}

/// Attention of `q` over `k`, `v` through cuDNN's FP8 kernels, differentiable (its backward is FP8 too). Fused
/// inputs on a probed device only (see [`ready`]).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Tensor> {
    let op = Fp8Sdpa::new(q, k, v, kv_lens)?;
    q.dense()?.apply_op3(&k.dense()?, &v.dense()?, op)
}

/// [`super::attention::attention_forward_stats`] in FP8: the bf16 output and the `[b, h, lq]` f32 statistics.
pub fn forward_stats(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<(Tensor, Tensor)> {
    let op = Fp8Sdpa::new(q, k, v, kv_lens)?;
    let (q, k, v) = (q.dense()?, k.dense()?, v.dense()?);
    let o = q.apply_op3_no_bwd(&k, &v, &op)?;
    let stats = op.inner.take_stats()?;
    let g = op.inner.geo;
    let candle_core::Device::Cuda(dev) = q.device() else {
        candle_core::bail!("FP8 attention: q is not on CUDA");
    };
    let stats = ptx::untracked(CudaStorage::wrap_cuda_slice(stats, dev.clone()), (g.b, g.h, g.lq));
    Ok((o, stats))
}

/// [`super::attention::attention_backward_stats`] in FP8: `(dq, dk, dv)` in bf16 from `[q, k, v, o, d_o]` and the
/// statistics of the forward.
pub fn backward_stats(
    inputs: [&Tensor; 5],
    stats: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let [q, k, v, o, d_o] = inputs;
    let op = Sdpa::new(q, k, v, kv_lens)?;
    let g = op.geo;
    if stats.dtype() != DType::F32 || stats.elem_count() != g.b * g.h * g.lq {
        candle_core::bail!(
            "attention statistics {:?} {:?} do not fit q {:?}",
            stats.dtype(),
            stats.dims(),
            q.dims()
        );
    }
    let bf16 = |t: &Tensor| t.to_dtype(DType::BF16)?.dense();
    let tensors = [bf16(q)?, bf16(k)?, bf16(v)?, bf16(o)?, bf16(d_o)?];
    let stats = stats.dense()?;
    backward(g, op.kv_lens.as_deref(), &tensors, &stats)
}

/// The FP8 forward op: keeps its statistics for the backward, as the bf16 op does.
struct Fp8Sdpa {
    inner: Sdpa,
}

impl Fp8Sdpa {
    fn new(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Self> {
        Ok(Self {
            inner: Sdpa::new(q, k, v, kv_lens)?,
        })
    }
}

impl CustomOp3 for Fp8Sdpa {
    fn name(&self) -> &'static str {
        "framesmith-cudnn-sdpa-fp8"
    }

    cuda_only_cpu_fwd!("crate::attention's portable attention (FP8 attention runs on CUDA only)"; q, k, v);

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        k: &CudaStorage,
        kl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = q.device().clone();
        let g = self.inner.geo;
        let bf16_out = bf16_out(&dev)?;
        let (q, k, v) = (input(q, ql)?, input(k, kl)?, input(v, vl)?);
        let mut slots = dev.alloc_zeros::<f32>(slot::COUNT)?;
        for (x, at) in [(&q, slot::AMAX_Q), (&k, slot::AMAX_K), (&v, slot::AMAX_V)] {
            amax(&dev, x, &mut slots, at)?;
        }
        let stream = dev.cuda_stream();
        let scales = ptx::load(&dev, &ptx::FP8_ATTENTION, "fs_fp8_attn_forward_scales")?;
        let mut b = stream.launch_builder(&scales);
        b.arg(&mut slots);
        // SAFETY: one pointer to COUNT floats.
        unsafe { b.launch(single()) }.w()?;
        let q8 = quantize(&dev, &q, &slots, slot::SCALE_Q)?;
        let k8 = quantize(&dev, &k, &slots, slot::SCALE_K)?;
        let v8 = quantize(&dev, &v, &slots, slot::SCALE_V)?;
        let padded = self.inner.kv_lens.is_some();
        let seqs = match &self.inner.kv_lens {
            Some(lens) => Some(seq_lens(&dev, g, lens)?),
            None => None,
        };
        let mut ws = workspace(&dev, g, padded, false, bf16_out)?;
        let n = g.b * g.lq * g.h * g.d;
        let mut o = OutBuf::new(&dev, n, bf16_out)?;
        // SAFETY: written completely by cuDNN before being read.
        let mut stats = unsafe { dev.alloc::<f32>(g.b * g.h * g.lq)? };
        {
            let (qp, _gq) = q8.device_ptr(&stream);
            let (kp, _gk) = k8.device_ptr(&stream);
            let (vp, _gv) = v8.device_ptr(&stream);
            let (op, _go) = o.ptr_mut(&stream);
            let (sp, _gs) = stats.device_ptr_mut(&stream);
            let (slp, _gsl) = slots.device_ptr_mut(&stream);
            let (wp, _gw) = ws.device_ptr_mut(&stream);
            let (sq, skv) = match &seqs {
                Some((a, b)) => (a.device_ptr(&stream).0, b.device_ptr(&stream).0),
                None => (0, 0),
            };
            let device = bind(&dev)?;
            // SAFETY: live device allocations sized for the geometry (q8/o [b, lq, h, d], k8/v8 [b, lk, h, d],
            // stats [b, h, lq] f32, slots COUNT f32, seq lens [b] i32, workspace as cuDNN asked), on candle's
            // stream, which orders them with the kernels above and everything after.
            let rc = unsafe {
                fs_sdpa_fp8_forward(
                    device,
                    g.b as i64,
                    g.h as i64,
                    g.lq as i64,
                    g.lk as i64,
                    g.d as i64,
                    i32::from(padded),
                    i32::from(bf16_out),
                    g.scale(),
                    stream.cu_stream() as *mut c_void,
                    qp as *const c_void,
                    kp as *const c_void,
                    vp as *const c_void,
                    op as *mut c_void,
                    sp as *mut c_void,
                    slp as *mut c_void,
                    sq as *const c_void,
                    skv as *const c_void,
                    wp as *mut c_void,
                )
            };
            if rc != 0 {
                return Err(shim_error("cuDNN FP8 attention forward"));
            }
        }
        self.inner.keep_stats(stats);
        let out = o.into_bf16(&dev, n, &slots, slot::DESCALE_O)?;
        drop((ws, seqs, q8, k8, v8));
        Ok((CudaStorage::wrap_cuda_slice(out, dev), ql.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let stats = self.inner.take_stats()?;
        let g = self.inner.geo;
        let bf16 = |t: &Tensor| t.to_dtype(DType::BF16)?.dense();
        let tensors = [bf16(q)?, bf16(k)?, bf16(v)?, bf16(o)?, bf16(d_o)?];
        let dev = match q.device() {
            candle_core::Device::Cuda(dev) => dev.clone(),
            _ => candle_core::bail!("FP8 attention backward: q is not on CUDA"),
        };
        let stats = ptx::untracked(CudaStorage::wrap_cuda_slice(stats, dev), (g.b, g.h, g.lq));
        let (dq, dk, dv) = backward(g, self.inner.kv_lens.as_deref(), &tensors, &stats)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// Runs the FP8 backward on dense bf16 `[q, k, v, o, d_o]`: quantise, (calibrate the history on a shape's first
/// call), cuDNN, fold the amaxes into the history, read the gradients back to bf16.
fn backward(
    g: Geo,
    kv_lens: Option<&[i32]>,
    tensors: &[Tensor; 5],
    stats: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let guards: Vec<_> = tensors.iter().map(|t| t.storage_and_layout()).collect();
    let mut inputs = Vec::with_capacity(5);
    for (s, l) in &guards {
        inputs.push(input(cuda_storage(s)?, l)?);
    }
    let (stats_storage, stats_layout) = stats.storage_and_layout();
    let stats_view = ptx::view::<f32>(cuda_storage(&stats_storage)?, stats_layout)?;
    let dev = cuda_storage(&guards[0].0)?.device().clone();
    let stream = dev.cuda_stream();
    let padded = kv_lens.is_some();
    // The device's state stays locked while the backward is queued: its history buffer is an argument.
    let mut devices = lock();
    let Some(state) = devices.get_mut(&ordinal(&dev)) else {
        candle_core::bail!(
            "FP8 attention was not checked on this GPU (framesmith_nn::device::set_fp8_attention)"
        );
    };
    let bf16_out = state.bf16_out;
    let history = match state.histories.entry((g, padded)) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => e.insert(History {
            values: dev.alloc_zeros::<f32>(slot::HISTORY)?,
            calibrated: false,
        }),
    };
    let calibrate = !history.calibrated;
    history.calibrated = true;
    let history = &mut history.values;
    let mut slots = dev.alloc_zeros::<f32>(slot::COUNT)?;
    let amaxes = [
        slot::AMAX_Q,
        slot::AMAX_K,
        slot::AMAX_V,
        slot::AMAX_O,
        slot::AMAX_DO,
    ];
    for (x, at) in inputs.iter().zip(amaxes) {
        amax(&dev, x, &mut slots, at)?;
    }
    let fp8_grads = i32::from(!bf16_out);
    let scales = ptx::load(&dev, &ptx::FP8_ATTENTION, "fs_fp8_attn_backward_scales")?;
    let update = ptx::load(&dev, &ptx::FP8_ATTENTION, "fs_fp8_attn_update_history")?;
    let launch_scales = |slots: &mut CudaSlice<f32>, history: &CudaSlice<f32>| -> Result<()> {
        let mut b = stream.launch_builder(&scales);
        b.arg(slots).arg(history).arg(&fp8_grads);
        // SAFETY: COUNT slots and the HISTORY floats of a buffer the device state keeps alive.
        unsafe { b.launch(single()) }.w()?;
        Ok(())
    };
    let launch_update = |slots: &CudaSlice<f32>,
                         history: &mut CudaSlice<f32>,
                         decay: f32,
                         counted: i32|
     -> Result<()> {
        let mut b = stream.launch_builder(&update);
        b.arg(slots)
            .arg(history)
            .arg(&decay)
            .arg(&fp8_grads)
            .arg(&counted);
        // SAFETY: as in `launch_scales`.
        unsafe { b.launch(single()) }.w()?;
        Ok(())
    };
    launch_scales(&mut slots, history)?;
    let scale_slots = [
        slot::SCALE_Q,
        slot::SCALE_K,
        slot::SCALE_V,
        slot::SCALE_O,
        slot::SCALE_DO,
    ];
    let mut codes = Vec::with_capacity(5);
    for (x, at) in inputs.iter().zip(scale_slots) {
        codes.push(quantize(&dev, x, &slots, at)?);
    }
    let seqs = match kv_lens {
        Some(lens) => Some(seq_lens(&dev, g, lens)?),
        None => None,
    };
    let mut ws = workspace(&dev, g, padded, true, bf16_out)?;
    let (nq, nk) = (g.b * g.lq * g.h * g.d, g.b * g.lk * g.h * g.d);
    let mut dq = OutBuf::new(&dev, nq, bf16_out)?;
    let mut dk = OutBuf::new(&dev, nk, bf16_out)?;
    let mut dv = OutBuf::new(&dev, nk, bf16_out)?;
    let passes = if calibrate { 2 } else { 1 };
    for pass in 0..passes {
        let last = pass + 1 == passes;
        let ptrs: Vec<_> = codes.iter().map(|c| c.device_ptr(&stream)).collect();
        let p = |i: usize| ptrs[i].0 as *const c_void;
        let (stp, _gst) = stats_view.device_ptr(&stream);
        let (dqp, _g1) = dq.ptr_mut(&stream);
        let (dkp, _g2) = dk.ptr_mut(&stream);
        let (dvp, _g3) = dv.ptr_mut(&stream);
        let (slp, _gsl) = slots.device_ptr_mut(&stream);
        let (wp, _gw) = ws.device_ptr_mut(&stream);
        let (sq, skv) = match &seqs {
            Some((a, b)) => (a.device_ptr(&stream).0, b.device_ptr(&stream).0),
            None => (0, 0),
        };
        let device = bind(&dev)?;
        // SAFETY: live device allocations sized for the geometry (e4m3fn q/o/dO [b, lq, h, d], k/v [b, lk, h, d],
        // stats [b, h, lq] f32, gradients bf16 or e4m3fn as cuDNN writes them, slots COUNT f32, workspace as cuDNN asked),
        // on candle's stream.
        let rc = unsafe {
            fs_sdpa_fp8_backward(
                device,
                g.b as i64,
                g.h as i64,
                g.lq as i64,
                g.lk as i64,
                g.d as i64,
                i32::from(padded),
                i32::from(bf16_out),
                g.scale(),
                stream.cu_stream() as *mut c_void,
                p(0),
                p(1),
                p(2),
                p(3),
                p(4),
                stp as *const c_void,
                dqp as *mut c_void,
                dkp as *mut c_void,
                dvp as *mut c_void,
                slp as *mut c_void,
                sq as *const c_void,
                skv as *const c_void,
                wp as *mut c_void,
            )
        };
        if rc != 0 {
            return Err(shim_error("cuDNN FP8 attention backward"));
        }
        drop((ptrs, _gst, _g1, _g2, _g3, _gsl, _gw));
        if last {
            launch_update(&slots, history, HISTORY_DECAY, 1)?;
        } else {
            // Calibration: the measured amaxes become the history, then the scales are made again from it.
            launch_update(&slots, history, 0.0, 0)?;
            launch_scales(&mut slots, history)?;
        }
    }
    drop((ws, seqs, codes, devices));
    let wrap = |s: OutBuf, n: usize, l: usize, descale: i32| -> Result<Tensor> {
        let values = s.into_bf16(&dev, n, &slots, descale)?;
        Ok(ptx::untracked(
            CudaStorage::wrap_cuda_slice(values, dev.clone()),
            (g.b, l, g.h, g.d),
        ))
    };
    Ok((
        wrap(dq, nq, g.lq, slot::DESCALE_DQ)?,
        wrap(dk, nk, g.lk, slot::DESCALE_DK)?,
        wrap(dv, nk, g.lk, slot::DESCALE_DV)?,
    ))
}
