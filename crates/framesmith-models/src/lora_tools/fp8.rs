//! An FP8 base weight as a merge reads and writes it: the e4m3fn codes with the scale tensor exactly as the file
//! stores it (ComfyUI's `scale_weight` scalar, musubi-tuner's and Framesmith's per-row or per-64 scales, in f32,
//! bf16 or f16; or no scale at all), dequantised for the merge and quantised again in the same layout.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use framesmith_nn::fp8::{self, e4m3_encode, Fp8Scale, Fp8Weight, BLOCK_SIZE, E4M3_MAX};

/// An FP8 weight `[out, in]` and its stored scale.
pub(super) struct Fp8Parts {
    weight: Fp8Weight,
    /// The scale's safetensors dtype; `None` for a file without scales (scale 1).
    scale_dtype: Option<DType>,
}

impl Fp8Parts {
    /// Reads the codes (`[out, in]` bytes) and the stored scale (bytes, safetensors dtype, shape), if any.
    pub(super) fn read(
        codes: Vec<u8>,
        (out_dim, in_dim): (usize, usize),
        scale: Option<(Vec<u8>, &str, &[usize])>,
    ) -> Result<Self> {
        let codes = Tensor::from_vec(codes, (out_dim, in_dim), &Device::Cpu)?;
        let (scale, scale_dtype) = match scale {
            None => (None, None),
            Some((bytes, dtype, shape)) => {
                let dtype = match dtype {
                    "F32" => DType::F32,
                    "BF16" => DType::BF16,
                    "F16" => DType::F16,
                    other => {
                        bail!("FP8 scales stored as {other} are not supported (f32, bf16 or f16)")
                    }
                };
                let t = Tensor::from_raw_buffer(&bytes, dtype, shape, &Device::Cpu)?;
                (Some(t), Some(dtype))
            }
        };
        let weight = Fp8Weight::from_checkpoint(&codes, scale.as_ref())?;
        Ok(Self {
            weight,
            scale_dtype,
        })
    }

    /// The weight's values, f32 `[out, in]`.
    pub(super) fn dequantize(&self) -> Result<Tensor> {
        Ok(self.weight.dequantize(DType::F32)?)
    }
}

/// `merged` (f32 `[out, in]`) quantised as `parts` was: new scales (`amax / 448` per group of the same layout,
/// rounded up to the stored dtype) and codes, as the bytes to store. Without stored scales the codes take scale 1
/// as before, saturating at ±448.
pub(super) fn requantize(merged: &Tensor, parts: &Fp8Parts) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
    let (out_dim, in_dim) = merged.dims2()?;
    let values = merged.flatten_all()?.to_vec1::<f32>()?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        bail!(
            "the merged weight holds {} at element {i}, which FP8 cannot store",
            values[i]
        );
    }
    let Some(scale_dtype) = parts.scale_dtype else {
        return Ok((encode(&values, &[1.0], values.len().max(1)), None));
    };
    let mode = parts.weight.mode();
    let fresh = fp8::quantize(merged, mode)?;
    let scales = stored_scales(fresh.scale(), scale_dtype)?;
    let group = match mode {
        Fp8Scale::Tensor => (out_dim * in_dim).max(1),
        Fp8Scale::Channel => in_dim.max(1),
        Fp8Scale::Block64 => BLOCK_SIZE,
    };
    let codes = encode(&values, &scales, group);
    let scale =
        Tensor::from_vec(scales.clone(), scales.len(), &Device::Cpu)?.to_dtype(scale_dtype)?;
    Ok((codes, Some(framesmith_nn::bytes::tensor_bytes(&scale)?)))
}

/// The f32 scales as the stored dtype holds them, each rounded up where the dtype rounds it down (so that the
/// group's largest value still fits in ±448 after division).
fn stored_scales(scale: &Tensor, dtype: DType) -> Result<Vec<f32>> {
    let exact = scale.flatten_all()?.to_vec1::<f32>()?;
    Ok(exact
        .into_iter()
        .map(|s| match dtype {
            DType::BF16 => {
                let r = half::bf16::from_f32(s);
                let up = if r.to_f32() < s {
                    half::bf16::from_bits(r.to_bits() + 1)
                } else {
                    r
                };
                up.to_f32()
            }
            DType::F16 => {
                let r = half::f16::from_f32(s);
                let up = if r.to_f32() < s {
                    half::f16::from_bits(r.to_bits() + 1)
                } else {
                    r
                };
                up.to_f32()
            }
            _ => s,
        })
        .collect())
}

/// e4m3fn codes of `values / scales[i / group]`, saturating at ±448.
fn encode(values: &[f32], scales: &[f32], group: usize) -> Vec<u8> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let s = scales.get(i / group).copied().unwrap_or(1.0);
            e4m3_encode((v / s).clamp(-E4M3_MAX, E4M3_MAX))
        })
        .collect()
}
