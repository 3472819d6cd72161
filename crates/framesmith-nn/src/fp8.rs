//! FP8 (e4m3fn) storage for frozen linear weights: quantisation with f32 scales per tensor, per output channel
//! or per block of 64 input values, reading pre-quantised checkpoint layouts, and the single dequantisation
//! entry point ([`Fp8Weight::dequantize`]) that a fused CUDA kernel can take over.
//!
//! The FP8 codes are kept as raw bytes in a `U8` tensor: the same bytes as `float8_e4m3fn`, but a dtype that
//! every candle backend can index (candle 0.11.1's CUDA cast from `F8E4M3` is missing), so dequantisation is a
//! 256-entry table lookup that runs on CPU and CUDA alike until the fused kernel lands.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Result, Tensor};
use float8::F8E4M3;
use rayon::prelude::*;

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Input values per scale in [`Fp8Scale::Block64`].
pub const BLOCK_SIZE: usize = 64;

/// How FP8 scales are grouped over a weight `[out, in]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Scale {
    /// One scale for the whole weight (musubi-tuner up to v0.2.11, ComfyUI `scaled_fp8`).
    Tensor,
    /// One scale per output row.
    Channel,
    /// One scale per 64 consecutive input values of a row (musubi-tuner since v0.2.12).
    Block64,
}

impl Fp8Scale {
    /// Every mode by the name configs, LoRA metadata and the command line give it ([`Fp8Scale::as_str`]).
    pub const NAMES: [&'static str; 3] = ["tensor", "channel", "block64"];

    /// The name used in configs and LoRA metadata (`tensor`, `channel`, `block64`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tensor => "tensor",
            Self::Channel => "channel",
            Self::Block64 => "block64",
        }
    }
}

impl fmt::Display for Fp8Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Fp8Scale {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "tensor" => Ok(Self::Tensor),
            "channel" => Ok(Self::Channel),
            "block64" | "block" => Ok(Self::Block64),
            other => Err(format!(
                "unknown FP8 scale mode `{other}` (expected tensor, channel or block64)"
            )),
        }
    }
}

/// e4m3fn code of `x`: round to nearest, ties to even; magnitudes above 448 (and infinities) saturate to ±448;
/// NaN maps to a NaN code (callers reject NaN before encoding). Agrees with NVIDIA's `__NV_SATFINITE`
/// conversion (checked against the `float8` crate's port of it and an exhaustive nearest-value search).
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs().min(E4M3_MAX);
    let magnitude = if a < E4M3_MIN_NORMAL {
        // Subnormal codes are the multiples of 2^-9, and code 8 is the smallest normal 2^-6, so rounding
        // a · 2^9 (exact in f32) to an integer gives the code, including the round-up into the normals.
        (a * 512.0).round_ties_even() as u8
    } else {
        // Round f32's 23 mantissa bits to 3, ties to even; a carry moves into the exponent as it should, and
        // a <= 448 keeps the result finite. Then rebias the exponent from 127 to 7.
        let bits = a.to_bits();
        let rounded = (bits + 0x7_ffff + ((bits >> 20) & 1)) >> 20;
        (rounded - ((127 - 7) << 3)) as u8
    };
    sign | magnitude
}

/// Smallest normal e4m3fn magnitude, 2^-6.
const E4M3_MIN_NORMAL: f32 = 0.015625;

/// The value of an e4m3fn code (NaN for 0x7f / 0xff).
pub fn e4m3_decode(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

fn is_nan_code(code: u8) -> bool {
    code & 0x7f == 0x7f
}

/// A frozen weight `[out, in]` in FP8 e4m3fn with f32 scales: `w[o, i] ≈ decode(codes[o, i]) · scale(o, i)`.
#[derive(Clone, Debug)]
pub struct Fp8Weight {
    /// Raw e4m3fn codes, `U8` `[out, in]`.
    codes: Tensor,
    /// `F32`: `[1]` (tensor), `[out]` (channel) or `[out, in / 64]` (block64).
    scale: Tensor,
    mode: Fp8Scale,
    /// `F32` `[256]`: the value of every code, on the weight's device.
    table: Tensor,
    /// Products with this weight run on FP8 tensor cores, activations quantised per row
    /// ([`Fp8Weight::for_fp8_products`]).
    products: bool,
}

/// The mode actually used for a weight with `in_dim` inputs: block64 needs `in_dim` divisible by 64 and falls
/// back to per-channel otherwise, as musubi-tuner does.
pub fn effective_mode(mode: Fp8Scale, in_dim: usize) -> Fp8Scale {
    if mode == Fp8Scale::Block64 && in_dim % BLOCK_SIZE != 0 {
        Fp8Scale::Channel
    } else {
        mode
    }
}

/// Quantises a weight `[out, in]` (any float dtype, any device) to FP8 e4m3fn. Each group's scale is
/// `amax / 448`, so the group's largest magnitude maps to ±448; an all-zero group gets scale 1. Fails on NaN
/// or infinite weights, which FP8 cannot carry. The work runs on the CPU; the result lives on `weight`'s device.
pub fn quantize(weight: &Tensor, mode: Fp8Scale) -> Result<Fp8Weight> {
    let (out_dim, in_dim) = weight.dims2()?;
    let mode = effective_mode(mode, in_dim);
    let values = host_f32(weight)?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        candle_core::bail!(
            "cannot quantise to FP8: weight value at [{}, {}] is {}",
            i / in_dim.max(1),
            i % in_dim.max(1),
            values[i]
        );
    }
    let group_len = group_len(mode, out_dim, in_dim).max(1);
    let scales: Vec<f32> = values.par_chunks(group_len).map(group_scale).collect();
    let codes: Vec<u8> = values
        .par_iter()
        .enumerate()
        .map(|(i, &v)| e4m3_encode((v / scales[i / group_len]).clamp(-E4M3_MAX, E4M3_MAX)))
        .collect();
    let device = weight.device();
    let codes = Tensor::from_vec(codes, (out_dim, in_dim), device)?;
    let scale = Tensor::from_vec(scales, scale_dims(mode, out_dim, in_dim), device)?;
    Fp8Weight::new(codes, scale, mode)
}

/// The values of `weight` as f32 on the host; half-precision weights (what checkpoints hold) are widened on
/// every core, as a 14B model's linears are billions of values.
fn host_f32(weight: &Tensor) -> Result<Vec<f32>> {
    let flat = weight.to_device(&Device::Cpu)?.flatten_all()?;
    Ok(match flat.dtype() {
        DType::BF16 => flat
            .to_vec1::<half::bf16>()?
            .par_iter()
            .map(|v| v.to_f32())
            .collect(),
        DType::F16 => flat
            .to_vec1::<half::f16>()?
            .par_iter()
            .map(|v| v.to_f32())
            .collect(),
        _ => flat.to_dtype(DType::F32)?.to_vec1::<f32>()?,
    })
}

fn group_len(mode: Fp8Scale, out_dim: usize, in_dim: usize) -> usize {
    match mode {
        Fp8Scale::Tensor => out_dim * in_dim,
        Fp8Scale::Channel => in_dim,
        Fp8Scale::Block64 => BLOCK_SIZE,
    }
}

/// The shape of the scales of a weight `[out, in]` in `mode` (`[1]`, `[out]` or `[out, in / 64]`).
pub fn scale_dims(mode: Fp8Scale, out_dim: usize, in_dim: usize) -> Vec<usize> {
    match mode {
        Fp8Scale::Tensor => vec![1],
        Fp8Scale::Channel => vec![out_dim],
        Fp8Scale::Block64 => vec![out_dim, in_dim / BLOCK_SIZE],
    }
}

/// `amax / 448`, with 1 for an all-zero group (any scale reproduces zeros; 1 avoids dividing by zero). When the
/// quotient rounds down (notably among f32 subnormals, where few bits are left) the scale is nudged up until
/// `amax / scale <= 448`, so clamping never cuts the largest value.
fn group_scale(group: &[f32]) -> f32 {
    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        return 1.0;
    }
    let mut scale = (amax / E4M3_MAX).max(f32::from_bits(1));
    for _ in 0..4 {
        if amax / scale <= E4M3_MAX {
            break;
        }
        // The next f32 above a positive finite value.
        scale = f32::from_bits(scale.to_bits() + 1);
    }
    scale
}

impl Fp8Weight {
    fn new(codes: Tensor, scale: Tensor, mode: Fp8Scale) -> Result<Self> {
        let table: Vec<f32> = (0..=255u8).map(e4m3_decode).collect();
        let table = Tensor::from_vec(table, 256, codes.device())?;
        Ok(Self {
            codes,
            scale,
            mode,
            table,
            products: false,
        })
    }

    /// This weight with one scale per output channel, marked for FP8 tensor-core products (`model.fp8_matmul`:
    /// [`crate::linear::Linear`]'s forward then quantises its input per row instead of dequantising the weight,
    /// and its backward the output gradient, [`crate::linear::BaseWeight::input_grad`]).
    /// Per-tensor scales are repeated per channel (the same codes); block-64 weights are dequantised and quantised
    /// again per channel (a second rounding of each value, on the CPU), as FP8 products take one scale per row.
    pub fn for_fp8_products(&self) -> Result<Self> {
        let (out_dim, _) = self.dims();
        let mut channel = match self.mode {
            Fp8Scale::Channel => self.clone(),
            Fp8Scale::Tensor => Self::new(
                self.codes.clone(),
                self.scale.reshape(1)?.repeat(out_dim)?,
                Fp8Scale::Channel,
            )?,
            Fp8Scale::Block64 => {
                let device = self.device().clone();
                quantize(&self.dequantize(DType::F32)?, Fp8Scale::Channel)?.to_device(&device)?
            }
        };
        channel.products = true;
        Ok(channel)
    }

    /// Whether products with this weight run on FP8 tensor cores ([`Fp8Weight::for_fp8_products`]).
    pub fn fp8_products(&self) -> bool {
        self.products
    }

    /// A weight from checkpoint tensors: `codes` `[out, in]` as `F8E4M3` (or its raw bytes as `U8`) and the
    /// scale in any float dtype, in any of the layouts found in the wild: a scalar / `[1]` (ComfyUI
    /// `scale_weight`, musubi-tuner per-tensor), `[out]` or `[out, 1]` (per channel), `[out, in/64]` or
    /// `[out, in/64, 1]` (block of 64, musubi-tuner's layout). `None` means scale 1 (plain `fp8_e4m3fn` files).
    pub fn from_checkpoint(codes: &Tensor, scale: Option<&Tensor>) -> Result<Self> {
        let (out_dim, in_dim) = codes.dims2()?;
        let device = codes.device().clone();
        let codes = codes_as_bytes(codes)?;
        if let Some(i) = crate::bytes::with_tensor_bytes(&codes, first_nan_code)? {
            candle_core::bail!(
                "FP8 weight holds a NaN at [{}, {}]",
                i / in_dim.max(1),
                i % in_dim.max(1)
            );
        }
        let (mode, scale) = match scale {
            None => (Fp8Scale::Tensor, Tensor::ones(1, DType::F32, &device)?),
            Some(s) => {
                let mode = scale_layout(s.dims(), out_dim, in_dim)?;
                let s = s.to_dtype(DType::F32)?.to_device(&device)?;
                let s = s.reshape(scale_dims(mode, out_dim, in_dim))?;
                let finite = s.flatten_all()?.to_device(&Device::Cpu)?.to_vec1::<f32>()?;
                if finite.iter().any(|v| !v.is_finite()) {
                    candle_core::bail!("FP8 scale holds a NaN or infinite value");
                }
                (mode, s)
            }
        };
        Self::new(codes, scale, mode)
    }

    /// A weight from codes `U8` `[out, in]` and scales `F32` in `mode`'s canonical shape (`[1]`, `[out]` or
    /// `[out, in/64]`) on the same device. Checks dtypes and shapes only, reading no data: for parts that were
    /// validated when first loaded (e.g. views into a streamed block's buffer).
    pub fn from_raw(codes: Tensor, scale: Tensor, mode: Fp8Scale) -> Result<Self> {
        let (out_dim, in_dim) = codes.dims2()?;
        let want = scale_dims(effective_mode(mode, in_dim), out_dim, in_dim);
        if codes.dtype() != DType::U8 || scale.dtype() != DType::F32 {
            candle_core::bail!(
                "FP8 parts must be U8 codes and F32 scales, got {:?} and {:?}",
                codes.dtype(),
                scale.dtype()
            );
        }
        if effective_mode(mode, in_dim) != mode || scale.dims() != want.as_slice() {
            candle_core::bail!(
                "FP8 {mode} scales for a weight [{out_dim}, {in_dim}] must have shape {want:?}, got {:?}",
                scale.dims()
            );
        }
        if !codes.device().same_device(scale.device()) {
            candle_core::bail!("FP8 codes and scales are on different devices");
        }
        Self::new(codes, scale, mode)
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.codes.dims();
        (d[0], d[1])
    }

    /// How the scales are grouped.
    pub fn mode(&self) -> Fp8Scale {
        self.mode
    }

    /// The raw e4m3fn codes, `U8` `[out, in]` (for a kernel).
    pub fn codes(&self) -> &Tensor {
        &self.codes
    }

    /// The scales, `F32` `[1]`, `[out]` or `[out, in/64]` (for a kernel).
    pub fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// The device holding the codes and scales.
    pub fn device(&self) -> &Device {
        self.codes.device()
    }

    /// The codes and scales themselves, for block streaming to swap in same-shaped copies that live elsewhere
    /// (the decode table stays: it is the same for every weight on a device).
    pub fn tensors_mut(&mut self) -> [&mut Tensor; 2] {
        [&mut self.codes, &mut self.scale]
    }

    /// Bytes held: one per weight plus four per scale.
    pub fn storage_bytes(&self) -> usize {
        self.codes.elem_count() + 4 * self.scale.elem_count()
    }

    /// The same weight on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        let mut moved = Self::new(
            self.codes.to_device(device)?,
            self.scale.to_device(device)?,
            self.mode,
        )?;
        moved.products = self.products;
        Ok(moved)
    }

    /// The dense weight `[out, in]` in `dtype`: each code's value times its scale, computed in f32 and rounded
    /// once to `dtype`. The one place FP8 becomes dense: the CPU runs a direct loop, CUDA (feature `cuda`, output
    /// bf16 or f32) the fused kernel [`crate::cuda::dequantize_fp8_cuda`], other devices a table lookup with
    /// candle ops.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        match self.device() {
            Device::Cpu => self.dequantize_cpu(dtype),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) if matches!(dtype, DType::BF16 | DType::F32) => {
                crate::cuda::dequantize_fp8_cuda(&self.codes, &self.scale, dtype)
            }
            _ => self.dequantize_with_tensor_ops(dtype),
        }
    }

    fn dequantize_cpu(&self, dtype: DType) -> Result<Tensor> {
        let (out_dim, in_dim) = self.dims();
        let codes = self.codes.flatten_all()?.to_vec1::<u8>()?;
        let scales = self.scale.flatten_all()?.to_vec1::<f32>()?;
        let group = group_len(self.mode, out_dim, in_dim).max(1);
        let table: Vec<f32> = (0..=255u8).map(e4m3_decode).collect();
        let values: Vec<f32> = codes
            .par_iter()
            .enumerate()
            .map(|(i, &c)| table[c as usize] * scales[i / group])
            .collect();
        Tensor::from_vec(values, (out_dim, in_dim), &Device::Cpu)?.to_dtype(dtype)
    }

    /// Device-agnostic dequantisation: a 256-entry table indexed by the codes, then the scales broadcast.
    pub(crate) fn dequantize_with_tensor_ops(&self, dtype: DType) -> Result<Tensor> {
        let (out_dim, in_dim) = self.dims();
        let values = self.table.index_select(&self.codes.flatten_all()?, 0)?;
        let dense = match self.mode {
            Fp8Scale::Tensor => values
                .reshape((out_dim, in_dim))?
                .broadcast_mul(&self.scale.reshape((1, 1))?)?,
            Fp8Scale::Channel => values
                .reshape((out_dim, in_dim))?
                .broadcast_mul(&self.scale.reshape((out_dim, 1))?)?,
            Fp8Scale::Block64 => {
                let blocks = in_dim / BLOCK_SIZE;
                values
                    .reshape((out_dim, blocks, BLOCK_SIZE))?
                    .broadcast_mul(&self.scale.reshape((out_dim, blocks, 1))?)?
                    .reshape((out_dim, in_dim))?
            }
        };
        dense.to_dtype(dtype)
    }
}

/// Row-wise e4m3fn quantisation of activations `[rows, cols]` (any float dtype and device; computed on the CPU),
/// as FP8 tensor-core products take them: per row, scale `amax / 448` (at least `f32::MIN_POSITIVE`; 1 for an
/// all-zero row) and codes `e4m3(x / scale)`, saturating. Returns `U8` codes `[rows, cols]` and `F32` scales
/// `[rows]` on the CPU. The reference of the CUDA kernel (`crate::cuda::fp8_gemm::quantize_rows`).
pub fn quantize_rows_reference(xs: &Tensor) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = xs.dims2()?;
    let values = host_f32(xs)?;
    let mut codes = vec![0u8; rows * cols];
    let scales: Vec<f32> = codes
        .par_chunks_mut(cols.max(1))
        .zip(values.par_chunks(cols.max(1)))
        .map(|(out, row)| {
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut s = amax / E4M3_MAX;
            if s < f32::MIN_POSITIVE {
                s = if amax > 0.0 { f32::MIN_POSITIVE } else { 1.0 };
            }
            for (c, v) in out.iter_mut().zip(row) {
                *c = e4m3_encode(v / s);
            }
            s
        })
        .collect();
    Ok((
        Tensor::from_vec(codes, (rows, cols), &Device::Cpu)?,
        Tensor::from_vec(scales, rows, &Device::Cpu)?,
    ))
}

/// The scale mode implied by a checkpoint scale's shape for a weight `[out, in]`.
fn scale_layout(dims: &[usize], out_dim: usize, in_dim: usize) -> Result<Fp8Scale> {
    let numel: usize = dims.iter().product();
    let trailing_one = dims.len() > 1 && dims[dims.len() - 1] == 1;
    let core = if trailing_one {
        &dims[..dims.len() - 1]
    } else {
        dims
    };
    if numel == 1 {
        return Ok(Fp8Scale::Tensor);
    }
    if core == [out_dim] {
        return Ok(Fp8Scale::Channel);
    }
    if in_dim % BLOCK_SIZE == 0 && core == [out_dim, in_dim / BLOCK_SIZE] {
        return Ok(Fp8Scale::Block64);
    }
    candle_core::bail!(
        "FP8 scale shape {dims:?} does not fit weight [{out_dim}, {in_dim}] (expected a scalar, [{out_dim}], \
         [{out_dim}, 1] or [{out_dim}, {}] for blocks of {BLOCK_SIZE})",
        in_dim / BLOCK_SIZE
    )
}

/// FP8 codes given as `F8E4M3` or `U8` as a `U8` tensor of their shape on their device whose buffer holds them
/// from its start: `U8` codes that already do are kept as they are (a large weight is not copied again).
fn codes_as_bytes(codes: &Tensor) -> Result<Tensor> {
    let whole = codes.is_contiguous() && codes.layout().start_offset() == 0;
    if codes.dtype() == DType::U8 && whole {
        return Ok(codes.clone());
    }
    Tensor::from_vec(codes_to_bytes(codes)?, codes.shape(), codes.device())
}

/// Where the first NaN code of `codes` is, searched by several threads, a part each.
fn first_nan_code(codes: &[u8]) -> Option<usize> {
    const PART: usize = 1 << 20;
    let part = codes
        .par_chunks(PART)
        .position_first(|part| part.iter().fold(false, |nan, &c| nan | is_nan_code(c)))?;
    let start = part * PART;
    codes
        .get(start..)?
        .iter()
        .position(|&c| is_nan_code(c))
        .map(|i| start + i)
}

/// The bytes of FP8 codes given as `F8E4M3` or `U8`, read on the CPU.
fn codes_to_bytes(codes: &Tensor) -> Result<Vec<u8>> {
    let flat = codes.flatten_all()?.to_device(&Device::Cpu)?;
    match codes.dtype() {
        DType::U8 => flat.to_vec1::<u8>(),
        // Collected in place: the codes' own buffer (same size and alignment) becomes the bytes, so a model's
        // FP8 weights are not copied once more into freshly faulted-in memory on their way to the model.
        DType::F8E4M3 => Ok(flat
            .to_vec1::<F8E4M3>()?
            .into_iter()
            .map(|c| c.to_bits())
            .collect()),
        other => candle_core::bail!("FP8 weight has dtype {other:?}, expected F8E4M3"),
    }
}

#[cfg(test)]
pub(crate) mod tests;
