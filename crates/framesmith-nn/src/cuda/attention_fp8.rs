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

mod call;

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::attention::{cuda_storage, Geo, Sdpa};
use super::ptx;
use crate::ops::Dense;
use call::{slot, Call, Input, OutBuf};

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
    let modes: &[bool] = if major >= 10 {
        &[true, false]
    } else {
        &[false]
    };
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
        let x = Tensor::randn(0f32, 1.0, (geo.b, geo.lq, geo.h, geo.d), &device)?
            .to_dtype(DType::BF16)?;
        let (o, stats) = forward_stats(&x, &x, &x, None)?;
        let (dq, dk, dv) = backward_stats([&x, &x, &x, &o, &x], &stats, None)?;
        let mut finite = true;
        for t in [&o, &dq, &dk, &dv] {
            finite &= t
                .to_dtype(DType::F32)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f32>()?
                .is_finite();
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
            candle_core::bail!(
                "cuDNN's FP8 attention on {name} gave non-finite values in a test call"
            )
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

/// Attention on every device runs in bf16 again (all histories dropped).
pub fn disable_all() {
    lock().clear();
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<usize, DeviceState>> {
    DEVICES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds (or finds) the FP8 forward and backward graphs of `geo`.
fn graphs(dev: &CudaDevice, geo: Geo, padded: bool, bf16_out: bool) -> Result<()> {
    call::workspace_bytes(dev, geo, padded, false, bf16_out)?;
    call::workspace_bytes(dev, geo, padded, true, bf16_out)?;
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
        None => candle_core::bail!(
            "FP8 attention was not checked on this GPU (framesmith_nn::device::set_fp8_attention)"
        ),
    }
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
    let stats = ptx::untracked(
        CudaStorage::wrap_cuda_slice(stats, dev.clone()),
        (g.b, g.h, g.lq),
    );
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
        let call = Call::new(
            &dev,
            self.inner.geo,
            self.inner.kv_lens.as_deref(),
            bf16_out(&dev)?,
        )?;
        let inputs = [Input::new(q, ql)?, Input::new(k, kl)?, Input::new(v, vl)?];
        let mut slots = dev.alloc_zeros::<f32>(slot::COUNT)?;
        for (x, at) in inputs
            .iter()
            .zip([slot::AMAX_Q, slot::AMAX_K, slot::AMAX_V])
        {
            call::amax(&dev, x, &mut slots, at)?;
        }
        call::forward_scales(&dev, &mut slots, !call.bf16_out)?;
        let mut codes = Vec::with_capacity(3);
        for (x, at) in inputs
            .iter()
            .zip([slot::SCALE_Q, slot::SCALE_K, slot::SCALE_V])
        {
            codes.push(call::quantize(&dev, x, &slots, at)?);
        }
        let qkv: [CudaSlice<u8>; 3] = codes
            .try_into()
            .map_err(|_| candle_core::Error::Msg("FP8 attention: three inputs".into()))?;
        let (o, stats) = call.forward(&qkv, &mut slots)?;
        self.inner.keep_stats(stats);
        let g = call.g;
        let out = o.into_bf16(&dev, g.b * g.lq * g.h * g.d, &slots, slot::DESCALE_O)?;
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

/// Runs the FP8 backward on dense bf16 `[q, k, v, o, d_o]`: quantise, calibrate the shape's gradient history on
/// its first call (a backward whose outputs are dropped: its amaxes become the history), cuDNN, fold the amaxes
/// into the history, read the gradients back to bf16.
fn backward(
    g: Geo,
    kv_lens: Option<&[i32]>,
    tensors: &[Tensor; 5],
    stats: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let guards: Vec<_> = tensors.iter().map(|t| t.storage_and_layout()).collect();
    let mut inputs = Vec::with_capacity(5);
    for (s, l) in &guards {
        inputs.push(Input::new(cuda_storage(s)?, l)?);
    }
    let (stats_storage, stats_layout) = stats.storage_and_layout();
    let stats = ptx::view::<f32>(cuda_storage(&stats_storage)?, stats_layout)?;
    let dev = cuda_storage(&guards[0].0)?.device().clone();
    // The device's state stays locked while the backward is queued: its history buffer is an argument.
    let mut devices = lock();
    let Some(state) = devices.get_mut(&ordinal(&dev)) else {
        candle_core::bail!(
            "FP8 attention is not on for this GPU (framesmith_nn::device::set_fp8_attention)"
        );
    };
    let call = Call::new(&dev, g, kv_lens, state.bf16_out)?;
    let history = match state.histories.entry((g, call.padded())) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(History {
            values: dev.alloc_zeros::<f32>(slot::HISTORY)?,
            calibrated: false,
        }),
    };
    let calibrate = !std::mem::replace(&mut history.calibrated, true);
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
        call::amax(&dev, x, &mut slots, at)?;
    }
    let fp8_grads = !call.bf16_out;
    call::backward_scales(&dev, &mut slots, history, fp8_grads)?;
    let scales = [
        slot::SCALE_Q,
        slot::SCALE_K,
        slot::SCALE_V,
        slot::SCALE_O,
        slot::SCALE_DO,
    ];
    let mut codes = Vec::with_capacity(5);
    for (x, at) in inputs.iter().zip(scales) {
        codes.push(call::quantize(&dev, x, &slots, at)?);
    }
    let (nq, nk) = (g.b * g.lq * g.h * g.d, g.b * g.lk * g.h * g.d);
    let mut grads = [
        OutBuf::new(&dev, nq, call.bf16_out)?,
        OutBuf::new(&dev, nk, call.bf16_out)?,
        OutBuf::new(&dev, nk, call.bf16_out)?,
    ];
    if calibrate {
        call.backward(&codes, &stats, &mut slots, &mut grads)?;
        call::update_history(&dev, &slots, history, (0.0, fp8_grads, false))?;
        call::backward_scales(&dev, &mut slots, history, fp8_grads)?;
    }
    call.backward(&codes, &stats, &mut slots, &mut grads)?;
    call::update_history(&dev, &slots, history, (HISTORY_DECAY, fp8_grads, true))?;
    drop((devices, codes));
    let [dq, dk, dv] = grads;
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
