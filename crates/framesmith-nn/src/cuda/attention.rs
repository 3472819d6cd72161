//! Fused attention on CUDA through cuDNN's scaled-dot-product attention (`kernels/cudnn_sdpa.cpp`, a C shim over
//! the cuDNN frontend), forward and backward, bf16, `[b, l, heads, head_dim]` layout, per-sample key lengths.
//! Same contract as [`crate::attention::attention`], which is the reference and the fallback.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::ops::Dense;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor,
};

extern "C" {
    fn fs_sdpa_last_error() -> *const c_char;
    fn fs_sdpa_set_cache_dir(device: i32, dir: *const c_char) -> i32;
    fn fs_sdpa_cache_counts(read: *mut i64, built: *mut i64, unwritten: *mut i64) -> i32;
    fn fs_sdpa_workspace(
        device: i32,
        b: i64,
        h: i64,
        sq: i64,
        skv: i64,
        d: i64,
        padded: i32,
        backward: i32,
        scale: f32,
        bytes: *mut i64,
    ) -> i32;
    fn fs_sdpa_forward(
        device: i32,
        b: i64,
        h: i64,
        sq: i64,
        skv: i64,
        d: i64,
        padded: i32,
        scale: f32,
        stream: *mut c_void,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *mut c_void,
        stats: *mut c_void,
        seq_q: *const c_void,
        seq_kv: *const c_void,
        workspace: *mut c_void,
    ) -> i32;
    fn fs_sdpa_backward(
        device: i32,
        b: i64,
        h: i64,
        sq: i64,
        skv: i64,
        d: i64,
        padded: i32,
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
        seq_q: *const c_void,
        seq_kv: *const c_void,
        workspace: *mut c_void,
    ) -> i32;
}

/// Whether [`attention`] runs cuDNN's fused kernels for these inputs (CUDA, bf16, head dim a multiple of 8 up
/// to 128) rather than the portable fallback.
pub fn runs_fused(q: &Tensor) -> bool {
    let d = q.dims().last().copied().unwrap_or(0);
    q.device().is_cuda() && q.dtype() == DType::BF16 && q.rank() == 4 && d % 8 == 0 && d <= 128
}

/// Attention of `q` [b, lq, h, d] over `k`, `v` [b, lk, h, d], scale 1/sqrt(d); keys at or beyond `kv_lens[i]`
/// are masked for sample i (`None`: all keys). Differentiable in q, k and v. Fused (cuDNN) when
/// [`runs_fused`], else [`crate::attention::portable_attention`].
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Tensor> {
    if !runs_fused(q) || k.dtype() != DType::BF16 || v.dtype() != DType::BF16 {
        return crate::attention::portable_attention(q, k, v, kv_lens);
    }
    let op = Sdpa::new(q, k, v, kv_lens)?;
    q.dense()?.apply_op3(&k.dense()?, &v.dense()?, op)
}

/// Forward and backward in one call, outside autograd: `(o, dq, dk, dv)` for the output gradient `d_o`
/// [b, lq, h, d]. What a training step's attention costs, without the bookkeeping of a loss; the benchmark
/// times this against PyTorch's `sdpa(q, k, v).backward(d_o)`. Fused inputs only (see [`runs_fused`]).
pub fn attention_forward_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    d_o: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    if !runs_fused(q) || k.dtype() != DType::BF16 || v.dtype() != DType::BF16 {
        candle_core::bail!(
            "attention_forward_backward needs bf16 CUDA tensors with head dim <= 128"
        );
    }
    let op = Sdpa::new(q, k, v, kv_lens)?;
    let (q, k, v) = (q.dense()?, k.dense()?, v.dense()?);
    let o = q.apply_op3_no_bwd(&k, &v, &op)?;
    let stats = op.take_stats()?;
    let d_o = d_o.to_dtype(DType::BF16)?.dense()?;
    let (dq, dk, dv) = backward(
        op.geo,
        op.kv_lens.as_deref(),
        [&q, &k, &v, &o, &d_o],
        &stats,
    )?;
    Ok((o, dq, dk, dv))
}

/// Forward outside autograd, for hand-written backward passes: the output [b, lq, h, d] (bf16) and cuDNN's
/// softmax statistics (the per-row log-sum-exp) as a `[b, h, lq]` f32 tensor for [`attention_backward_stats`].
/// Fused inputs only (see [`runs_fused`]).
pub fn attention_forward_stats(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<(Tensor, Tensor)> {
    if !runs_fused(q) || k.dtype() != DType::BF16 || v.dtype() != DType::BF16 {
        candle_core::bail!("attention_forward_stats needs bf16 CUDA tensors with head dim <= 128");
    }
    let op = Sdpa::new(q, k, v, kv_lens)?;
    let (q, k, v) = (q.dense()?, k.dense()?, v.dense()?);
    let o = q.apply_op3_no_bwd(&k, &v, &op)?;
    let stats = op.take_stats()?;
    let g = op.geo;
    let dev = match q.device() {
        candle_core::Device::Cuda(dev) => dev.clone(),
        _ => candle_core::bail!("attention_forward_stats: q is not on CUDA"),
    };
    let stats = super::ptx::untracked(CudaStorage::wrap_cuda_slice(stats, dev), (g.b, g.h, g.lq));
    Ok((o, stats))
}

/// Backward outside autograd: `(dq, dk, dv)` (bf16) from `[q, k, v, o, d_o]` and the statistics of
/// [`attention_forward_stats`] on the same inputs.
pub fn attention_backward_stats(
    inputs: [&Tensor; 5],
    stats: &Tensor,
    kv_lens: Option<&[usize]>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let [q, k, v, o, d_o] = inputs;
    if !runs_fused(q) || k.dtype() != DType::BF16 || v.dtype() != DType::BF16 {
        candle_core::bail!("attention_backward_stats needs bf16 CUDA tensors with head dim <= 128");
    }
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
    let contiguous = |t: &Tensor, dtype: DType| t.to_dtype(dtype)?.dense();
    let (q, k, v) = (q.dense()?, k.dense()?, v.dense()?);
    let (o, d_o) = (contiguous(o, DType::BF16)?, contiguous(d_o, DType::BF16)?);
    let stats = stats.dense()?;
    let (storage, layout) = stats.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("attention statistics are not contiguous");
    };
    let slice = cuda_storage(&storage)?.as_cuda_slice::<f32>()?;
    if start != 0 || end > slice.len() {
        // A view into a larger buffer: the shim reads from the slice's start, so copy it out first.
        let owned = stats.copy()?;
        drop(storage);
        return attention_backward_stats([&q, &k, &v, &o, &d_o], &owned, kv_lens);
    }
    backward(g, op.kv_lens.as_deref(), [&q, &k, &v, &o, &d_o], slice)
}

/// An attention call's shape: batch, heads, query and key lengths, head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Geo {
    pub b: usize,
    pub h: usize,
    pub lq: usize,
    pub lk: usize,
    pub d: usize,
}

impl Geo {
    /// The softmax scale, 1/sqrt(d).
    pub fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }
}

/// The forward op keeps the log-sum-exp it computed for its backward.
pub(super) struct Sdpa {
    pub geo: Geo,
    pub kv_lens: Option<Vec<i32>>,
    stats: Arc<Mutex<Option<CudaSlice<f32>>>>,
}

impl Sdpa {
    /// Checks the shapes of q [b, lq, h, d], k and v [b, lk, h, d] and the key lengths.
    pub fn new(q: &Tensor, k: &Tensor, v: &Tensor, kv_lens: Option<&[usize]>) -> Result<Self> {
        let (b, lq, h, d) = q.dims4()?;
        let (bk, lk, hk, dk) = k.dims4()?;
        if (bk, hk, dk) != (b, h, d) || v.dims() != k.dims() {
            candle_core::bail!(
                "attention shapes q {:?}, k {:?}, v {:?} do not match",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        let kv_lens = match kv_lens {
            Some(lens) if lens.len() != b => {
                candle_core::bail!("{} key lengths for a batch of {b}", lens.len())
            }
            Some(lens) => Some(lens.iter().map(|&l| l.min(lk) as i32).collect()),
            None => None,
        };
        Ok(Self {
            geo: Geo { b, h, lq, lk, d },
            kv_lens,
            stats: Arc::new(Mutex::new(None)),
        })
    }

    /// Keeps the forward's statistics for the backward.
    pub fn keep_stats(&self, stats: CudaSlice<f32>) {
        if let Ok(mut slot) = self.stats.lock() {
            *slot = Some(stats);
        }
    }

    /// The forward's statistics (once).
    pub fn take_stats(&self) -> Result<CudaSlice<f32>> {
        self.stats
            .lock()
            .map_err(|_| candle_core::Error::Msg("attention statistics lock poisoned".into()))?
            .take()
            .ok_or_else(|| {
                candle_core::Error::Msg("attention backward run twice or before forward".into())
            })
    }
}

pub(super) fn shim_error(what: &str) -> candle_core::Error {
    // SAFETY: the shim returns a pointer to a NUL-terminated string it owns, valid until its next call; it is
    // copied at once.
    let msg = unsafe { CStr::from_ptr(fs_sdpa_last_error()) }
        .to_string_lossy()
        .into_owned();
    candle_core::Error::Msg(format!("{what}: {msg}"))
}

/// Sequence-length buffers for the padding mask: every query row, `kv_lens` keys.
pub(super) fn seq_lens(
    dev: &CudaDevice,
    geo: Geo,
    kv_lens: &[i32],
) -> Result<(CudaSlice<i32>, CudaSlice<i32>)> {
    let q = vec![geo.lq as i32; geo.b];
    Ok((dev.clone_htod(&q)?, dev.clone_htod(kv_lens)?))
}

/// Where attention plans are kept (`None`: nowhere), and the devices whose folder the shim has been told.
struct PlanRoot {
    root: Option<PathBuf>,
    told: BTreeSet<i32>,
}

static PLAN_ROOT: Mutex<PlanRoot> = Mutex::new(PlanRoot {
    root: None,
    told: BTreeSet::new(),
});

/// Keeps plans under `root` from each device's next call on (see [`crate::attention::plans`]).
pub(crate) fn set_plan_root(root: Option<PathBuf>) {
    if let Ok(mut plans) = PLAN_ROOT.lock() {
        plans.root = root;
        plans.told.clear();
    }
}

/// The shim's plan-cache counts.
pub(crate) fn plan_counts() -> Option<crate::attention::plans::PlanCounts> {
    let (mut read, mut built, mut unwritten) = (0i64, 0i64, 0i64);
    // SAFETY: pointers to three live i64s.
    let rc = unsafe { fs_sdpa_cache_counts(&mut read, &mut built, &mut unwritten) };
    (rc == 0).then(|| crate::attention::plans::PlanCounts {
        read: read.max(0) as u64,
        built: built.max(0) as u64,
        unwritten: unwritten.max(0) as u64,
    })
}

/// Tells the shim, once per device after the root changes, which folder keeps `device`'s plans. A folder that
/// cannot be made leaves that device's plans unkept (they are built as without a cache).
fn tell_plan_folder(ctx: &candle_core::cuda_backend::cudarc::driver::CudaContext, device: i32) {
    let Ok(mut plans) = PLAN_ROOT.lock() else {
        return;
    };
    if !plans.told.insert(device) {
        return;
    }
    let folder = plans.root.as_ref().and_then(|root| {
        let name = ctx.name().ok()?;
        let capability = ctx.compute_capability().ok()?;
        let folder = crate::attention::plans::device_folder(root, &name, capability);
        std::fs::create_dir_all(&folder).ok()?;
        CString::new(folder.to_string_lossy().into_owned()).ok()
    });
    let empty = CString::default();
    // SAFETY: a NUL-terminated string alive for the call; the shim copies it.
    unsafe { fs_sdpa_set_cache_dir(device, folder.as_ref().unwrap_or(&empty).as_ptr()) };
}

/// Makes `dev`'s context current on this thread, where the shim's cuDNN calls run, and returns its ordinal, which
/// picks the shim's cuDNN handle for that device (a process may drive several GPUs).
pub(super) fn bind(dev: &CudaDevice) -> Result<i32> {
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let device = ctx.ordinal() as i32;
    tell_plan_folder(&ctx, device);
    Ok(device)
}

fn workspace(dev: &CudaDevice, geo: Geo, padded: bool, backward: bool) -> Result<CudaSlice<u8>> {
    let device = bind(dev)?;
    let mut bytes = 0i64;
    let (b, h, lq, lk, d) = (
        geo.b as i64,
        geo.h as i64,
        geo.lq as i64,
        geo.lk as i64,
        geo.d as i64,
    );
    // SAFETY: plain values and a pointer to a live i64.
    let rc = unsafe {
        fs_sdpa_workspace(
            device,
            b,
            h,
            lq,
            lk,
            d,
            i32::from(padded),
            i32::from(backward),
            geo.scale(),
            &mut bytes,
        )
    };
    if rc != 0 {
        return Err(shim_error("cuDNN attention plan"));
    }
    // SAFETY: scratch memory for cuDNN, never read by us.
    unsafe { dev.alloc::<u8>((bytes as usize).max(1)) }
}

pub(super) fn bf16_view<'a>(
    s: &'a CudaStorage,
    l: &Layout,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, half::bf16>> {
    super::ptx::view::<half::bf16>(s, l)
}

impl CustomOp3 for Sdpa {
    fn name(&self) -> &'static str {
        "framesmith-cudnn-sdpa"
    }

    cuda_only_cpu_fwd!("crate::attention's portable attention"; q, k, v);

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
        let stream = dev.cuda_stream();
        let g = self.geo;
        let padded = self.kv_lens.is_some();
        let seqs = match &self.kv_lens {
            Some(lens) => Some(seq_lens(&dev, g, lens)?),
            None => None,
        };
        let mut ws = workspace(&dev, g, padded, false)?;
        let (qv, kv, vv) = (bf16_view(q, ql)?, bf16_view(k, kl)?, bf16_view(v, vl)?);
        // SAFETY: written completely by cuDNN before being read.
        let mut o = unsafe { dev.alloc::<half::bf16>(g.b * g.lq * g.h * g.d)? };
        let mut stats = unsafe { dev.alloc::<f32>(g.b * g.h * g.lq)? };
        {
            let (qp, _gq) = qv.device_ptr(&stream);
            let (kp, _gk) = kv.device_ptr(&stream);
            let (vp, _gv) = vv.device_ptr(&stream);
            let (op, _go) = o.device_ptr_mut(&stream);
            let (sp, _gs) = stats.device_ptr_mut(&stream);
            let (wp, _gw) = ws.device_ptr_mut(&stream);
            let (sq, skv) = match &seqs {
                Some((a, b)) => (a.device_ptr(&stream).0, b.device_ptr(&stream).0),
                None => (0, 0),
            };
            let device = bind(&dev)?;
            // SAFETY: all pointers are live device allocations sized for the geometry checked in `attention`
            // (q/o [b, lq, h, d] bf16, k/v [b, lk, h, d], stats [b, h, lq] f32, seq lens [b] i32, workspace as
            // cuDNN asked); the kernels run on candle's stream, which orders them with everything else.
            let rc = unsafe {
                fs_sdpa_forward(
                    device,
                    g.b as i64,
                    g.h as i64,
                    g.lq as i64,
                    g.lk as i64,
                    g.d as i64,
                    i32::from(padded),
                    g.scale(),
                    stream.cu_stream() as *mut c_void,
                    qp as *const c_void,
                    kp as *const c_void,
                    vp as *const c_void,
                    op as *mut c_void,
                    sp as *mut c_void,
                    sq as *const c_void,
                    skv as *const c_void,
                    wp as *mut c_void,
                )
            };
            if rc != 0 {
                return Err(shim_error("cuDNN attention forward"));
            }
        }
        if let Ok(mut slot) = self.stats.lock() {
            *slot = Some(stats);
        }
        drop((ws, seqs));
        Ok((CudaStorage::wrap_cuda_slice(o, dev), ql.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let stats = self.take_stats()?;
        let d_o = d_o.to_dtype(DType::BF16)?.dense()?;
        let (dq, dk, dv) = backward(
            self.geo,
            self.kv_lens.as_deref(),
            [q, k, v, o, &d_o],
            &stats,
        )?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

pub(super) fn cuda_storage(s: &Storage) -> Result<&CudaStorage> {
    super::ptx::cuda_storage(s, "cuDNN attention backward")
}

/// Runs cuDNN's backward and wraps dq, dk, dv as (untracked) tensors.
fn backward(
    g: Geo,
    kv_lens: Option<&[i32]>,
    inputs: [&Tensor; 5],
    stats: &CudaSlice<f32>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let guards: Vec<_> = inputs.iter().map(|t| t.storage_and_layout()).collect();
    let mut views = Vec::with_capacity(5);
    for (s, l) in &guards {
        views.push(bf16_view(cuda_storage(s)?, l)?);
    }
    let dev = cuda_storage(&guards[0].0)?.device().clone();
    let stream = dev.cuda_stream();
    let padded = kv_lens.is_some();
    let seqs = match kv_lens {
        Some(lens) => Some(seq_lens(&dev, g, lens)?),
        None => None,
    };
    let mut ws = workspace(&dev, g, padded, true)?;
    // SAFETY: written completely by cuDNN before being read.
    let mut dq = unsafe { dev.alloc::<half::bf16>(g.b * g.lq * g.h * g.d)? };
    let mut dk = unsafe { dev.alloc::<half::bf16>(g.b * g.lk * g.h * g.d)? };
    let mut dv = unsafe { dev.alloc::<half::bf16>(g.b * g.lk * g.h * g.d)? };
    {
        let ptrs: Vec<_> = views.iter().map(|v| v.device_ptr(&stream)).collect();
        let (sp, _gs) = stats.device_ptr(&stream);
        let (dqp, _g1) = dq.device_ptr_mut(&stream);
        let (dkp, _g2) = dk.device_ptr_mut(&stream);
        let (dvp, _g3) = dv.device_ptr_mut(&stream);
        let (wp, _gw) = ws.device_ptr_mut(&stream);
        let (sq, skv) = match &seqs {
            Some((a, b)) => (a.device_ptr(&stream).0, b.device_ptr(&stream).0),
            None => (0, 0),
        };
        let p = |i: usize| ptrs[i].0 as *const c_void;
        let device = bind(&dev)?;
        // SAFETY: as in the forward: live device allocations sized for the geometry, on candle's stream.
        let rc = unsafe {
            fs_sdpa_backward(
                device,
                g.b as i64,
                g.h as i64,
                g.lq as i64,
                g.lk as i64,
                g.d as i64,
                i32::from(padded),
                g.scale(),
                stream.cu_stream() as *mut c_void,
                p(0),
                p(1),
                p(2),
                p(3),
                p(4),
                sp as *const c_void,
                dqp as *mut c_void,
                dkp as *mut c_void,
                dvp as *mut c_void,
                sq as *const c_void,
                skv as *const c_void,
                wp as *mut c_void,
            )
        };
        if rc != 0 {
            return Err(shim_error("cuDNN attention backward"));
        }
    }
    drop((ws, seqs));
    let wrap = |s: CudaSlice<half::bf16>, l: usize| {
        super::ptx::untracked(
            CudaStorage::wrap_cuda_slice(s, dev.clone()),
            (g.b, l, g.h, g.d),
        )
    };
    Ok((wrap(dq, g.lq), wrap(dk, g.lk), wrap(dv, g.lk)))
}
