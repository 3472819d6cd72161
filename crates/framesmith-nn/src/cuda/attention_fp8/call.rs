//! One FP8 attention call on the GPU: the scaling kernels of `kernels/fp8_attention.cu` (largest magnitudes,
//! scales, e4m3fn codes and back) and cuDNN's FP8 forward and backward through the shim, all queued on candle's
//! stream.

use std::ffi::c_void;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg, SyncOnDrop,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, Layout, Result};

use super::super::attention::{bf16_view, bind, seq_lens, shim_error, Geo};
use super::super::ptx::{self, long};

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
pub mod slot {
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

/// Bytes of the workspace of the FP8 forward or backward graph of `g` on `dev`, building the graph (or finding it
/// in the shim's cache) on the way: an error when cuDNN will not build it.
pub fn workspace_bytes(
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
pub enum OutBuf {
    Bf16(CudaSlice<half::bf16>),
    Fp8(CudaSlice<u8>),
}

impl OutBuf {
    pub fn new(dev: &CudaDevice, n: usize, bf16_out: bool) -> Result<Self> {
        Ok(if bf16_out {
            // SAFETY: written completely by cuDNN before being read.
            Self::Bf16(unsafe { dev.alloc::<half::bf16>(n.max(1))? })
        } else {
            // SAFETY: as above.
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
    pub fn into_bf16(
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

/// A bf16 input's elements, and whether they can be read 8 at a time (a multiple of 8, 16-byte aligned start).
pub struct Input<'a> {
    view: CudaView<'a, half::bf16>,
    n: usize,
    vec: bool,
}

impl<'a> Input<'a> {
    pub fn new(s: &'a CudaStorage, l: &Layout) -> Result<Self> {
        let view = bf16_view(s, l)?;
        let n = l.shape().elem_count();
        Ok(Self {
            view,
            n,
            vec: n % 8 == 0 && l.start_offset() % 8 == 0,
        })
    }

    /// Grid-stride work items: groups of 8 with `vec`, else values.
    fn work(&self) -> usize {
        if self.vec {
            self.n / 8
        } else {
            self.n
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

fn kernel(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    ptx::load(dev, &ptx::FP8_ATTENTION, name)
}

/// Folds the largest magnitude of `x` into `slots[at]`.
pub fn amax(dev: &CudaDevice, x: &Input<'_>, slots: &mut CudaSlice<f32>, at: i32) -> Result<()> {
    let func = kernel(dev, "fs_fp8_attn_amax_bf16")?;
    let (n, vec) = (long(x.n)?, i32::from(x.vec));
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&x.view).arg(&n).arg(&vec).arg(slots).arg(&at);
    // SAFETY: argument types and order match the kernel; `x` holds n values (16-byte aligned with `vec`), `slots`
    // COUNT floats.
    unsafe { b.launch(ptx::elementwise_config(x.work())) }.w()?;
    Ok(())
}

/// `x` in e4m3fn with the scale in `slots[scale]`.
pub fn quantize(
    dev: &CudaDevice,
    x: &Input<'_>,
    slots: &CudaSlice<f32>,
    scale: i32,
) -> Result<CudaSlice<u8>> {
    let func = kernel(dev, "fs_fp8_attn_quantize_bf16")?;
    // SAFETY: the kernel writes every code before any is read.
    let codes = unsafe { dev.alloc::<u8>(x.n.max(1))? };
    let (n, vec) = (long(x.n)?, i32::from(x.vec));
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&x.view)
        .arg(&codes)
        .arg(&n)
        .arg(&vec)
        .arg(slots)
        .arg(&scale);
    // SAFETY: as in `amax`; `codes` holds n bytes, freshly allocated (aligned).
    unsafe { b.launch(ptx::elementwise_config(x.work())) }.w()?;
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
    let func = kernel(dev, "fs_fp8_attn_dequantize_bf16")?;
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

/// The forward's scales from the amaxes of q, k, v in `slots` (O's for an e4m3fn output with `fp8_out`).
pub fn forward_scales(dev: &CudaDevice, slots: &mut CudaSlice<f32>, fp8_out: bool) -> Result<()> {
    let func = kernel(dev, "fs_fp8_attn_forward_scales")?;
    let fp8_out = i32::from(fp8_out);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(slots).arg(&fp8_out);
    // SAFETY: one pointer to COUNT floats and an int.
    unsafe { b.launch(single()) }.w()?;
    Ok(())
}

/// The backward's scales from the amaxes in `slots` and the gradient `history`.
pub fn backward_scales(
    dev: &CudaDevice,
    slots: &mut CudaSlice<f32>,
    history: &CudaSlice<f32>,
    fp8_grads: bool,
) -> Result<()> {
    let func = kernel(dev, "fs_fp8_attn_backward_scales")?;
    let fp8_grads = i32::from(fp8_grads);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(slots).arg(history).arg(&fp8_grads);
    // SAFETY: COUNT slots and HISTORY floats.
    unsafe { b.launch(single()) }.w()?;
    Ok(())
}

/// Folds the gradient amaxes cuDNN wrote into `slots` into `history` (see `fs_fp8_attn_update_history`).
pub fn update_history(
    dev: &CudaDevice,
    slots: &CudaSlice<f32>,
    history: &mut CudaSlice<f32>,
    (decay, fp8_grads, counted): (f32, bool, bool),
) -> Result<()> {
    let func = kernel(dev, "fs_fp8_attn_update_history")?;
    let (fp8_grads, counted) = (i32::from(fp8_grads), i32::from(counted));
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(slots)
        .arg(history)
        .arg(&decay)
        .arg(&fp8_grads)
        .arg(&counted);
    // SAFETY: COUNT slots and HISTORY floats.
    unsafe { b.launch(single()) }.w()?;
    Ok(())
}

/// What one FP8 attention call runs with: the device, the shape, the padding mask's lengths on the device, and
/// whether cuDNN writes bf16 outputs.
pub struct Call {
    pub dev: CudaDevice,
    pub g: Geo,
    pub bf16_out: bool,
    seqs: Option<(CudaSlice<i32>, CudaSlice<i32>)>,
}

impl Call {
    pub fn new(dev: &CudaDevice, g: Geo, kv_lens: Option<&[i32]>, bf16_out: bool) -> Result<Self> {
        let seqs = match kv_lens {
            Some(lens) => Some(seq_lens(dev, g, lens)?),
            None => None,
        };
        Ok(Self {
            dev: dev.clone(),
            g,
            bf16_out,
            seqs,
        })
    }

    pub fn padded(&self) -> bool {
        self.seqs.is_some()
    }

    fn workspace(&self, backward: bool) -> Result<CudaSlice<u8>> {
        let bytes = workspace_bytes(&self.dev, self.g, self.padded(), backward, self.bf16_out)?;
        // SAFETY: scratch memory for cuDNN, never read by us.
        unsafe { self.dev.alloc::<u8>(bytes.max(1)) }
    }

    /// The shim's leading arguments: device, b, h, lq, lk, d, padded, bf16 outputs, softmax scale.
    fn dims(&self) -> Result<(i32, [i64; 5], i32, i32, f32)> {
        let g = self.g;
        let device = bind(&self.dev)?;
        let dims = [g.b, g.h, g.lq, g.lk, g.d].map(|x| x as i64);
        Ok((
            device,
            dims,
            i32::from(self.padded()),
            i32::from(self.bf16_out),
            g.scale(),
        ))
    }

    /// The forward on e4m3fn `qkv`: the output (bf16, or e4m3fn with v's scale) and the statistics.
    pub fn forward(
        &self,
        qkv: &[CudaSlice<u8>; 3],
        slots: &mut CudaSlice<f32>,
    ) -> Result<(OutBuf, CudaSlice<f32>)> {
        let g = self.g;
        let stream = self.dev.cuda_stream();
        let mut ws = self.workspace(false)?;
        let mut o = OutBuf::new(&self.dev, g.b * g.lq * g.h * g.d, self.bf16_out)?;
        // SAFETY: written completely by cuDNN before being read.
        let mut stats = unsafe { self.dev.alloc::<f32>(g.b * g.h * g.lq)? };
        let ptrs: Vec<_> = qkv.iter().map(|c| c.device_ptr(&stream)).collect();
        let (op, _go) = o.ptr_mut(&stream);
        let (sp, _gs) = stats.device_ptr_mut(&stream);
        let (slp, _gsl) = slots.device_ptr_mut(&stream);
        let (wp, _gw) = ws.device_ptr_mut(&stream);
        let (sq, skv) = self.seq_ptrs(&stream);
        let (device, [b, h, lq, lk, d], padded, bf16_out, scale) = self.dims()?;
        // SAFETY: live device allocations sized for the geometry (q/o [b, lq, h, d], k/v [b, lk, h, d], stats
        // [b, h, lq] f32, slots COUNT f32, seq lens [b] i32, workspace as cuDNN asked), on candle's stream, which
        // orders them with the kernels before and after.
        let rc = unsafe {
            fs_sdpa_fp8_forward(
                device,
                b,
                h,
                lq,
                lk,
                d,
                padded,
                bf16_out,
                scale,
                stream.cu_stream() as *mut c_void,
                ptrs[0].0 as *const c_void,
                ptrs[1].0 as *const c_void,
                ptrs[2].0 as *const c_void,
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
        drop((ptrs, _go, _gs, _gsl, _gw));
        Ok((o, stats))
    }

    /// The backward on e4m3fn `[q, k, v, o, d_o]` and the forward's `stats`, into `grads` (dq, dk, dv).
    pub fn backward(
        &self,
        codes: &[CudaSlice<u8>],
        stats: &CudaView<'_, f32>,
        slots: &mut CudaSlice<f32>,
        grads: &mut [OutBuf; 3],
    ) -> Result<()> {
        let stream = self.dev.cuda_stream();
        let mut ws = self.workspace(true)?;
        let ptrs: Vec<_> = codes.iter().map(|c| c.device_ptr(&stream)).collect();
        let p = |i: usize| ptrs[i].0 as *const c_void;
        let (stp, _gst) = stats.device_ptr(&stream);
        let [dq, dk, dv] = grads;
        let (dqp, _g1) = dq.ptr_mut(&stream);
        let (dkp, _g2) = dk.ptr_mut(&stream);
        let (dvp, _g3) = dv.ptr_mut(&stream);
        let (slp, _gsl) = slots.device_ptr_mut(&stream);
        let (wp, _gw) = ws.device_ptr_mut(&stream);
        let (sq, skv) = self.seq_ptrs(&stream);
        let (device, [b, h, lq, lk, d], padded, bf16_out, scale) = self.dims()?;
        // SAFETY: live device allocations sized for the geometry (e4m3fn q/o/dO [b, lq, h, d], k/v [b, lk, h, d],
        // stats [b, h, lq] f32, gradients as cuDNN writes them, slots COUNT f32, workspace as cuDNN asked), on
        // candle's stream.
        let rc = unsafe {
            fs_sdpa_fp8_backward(
                device,
                b,
                h,
                lq,
                lk,
                d,
                padded,
                bf16_out,
                scale,
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
        Ok(())
    }

    /// The device addresses of the sequence lengths (0 without a mask).
    fn seq_ptrs(&self, stream: &Arc<CudaStream>) -> (u64, u64) {
        match &self.seqs {
            Some((a, b)) => (a.device_ptr(stream).0, b.device_ptr(stream).0),
            None => (0, 0),
        }
    }
}
