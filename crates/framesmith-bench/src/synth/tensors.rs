//! Random safetensors files written tensor by tensor, values drawn only when the writer asks for a tensor's
//! bytes: the weights of every synthetic project (Wan and FLUX.1).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs;
use std::path::Path;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use safetensors::tensor::View;

use framesmith_nn::fp8::e4m3_encode;

/// Values drawn per seeded chunk: chunks are drawn in parallel, and the result does not depend on the threads.
const CHUNK_ELEMS: usize = 1 << 20;

/// One tensor of a random weights file: official name, shape, the statistics it is drawn with, and its FP8
/// scale when it is stored in FP8.
pub(crate) struct RandomWeight {
    pub name: String,
    pub shape: Vec<usize>,
    pub mean: f32,
    pub std: f32,
    pub fp8_scale: Option<f32>,
}

/// Writes `weights` to `path` (FP8 ones as e4m3 codes, the rest as `dense`), one tensor in memory at a time. With
/// `comfy_prefix`, in ComfyUI's scaled-FP8 layout: keys under the prefix, a `.scale_weight` beside each FP8
/// weight and the `scaled_fp8` marker. Returns the file size.
pub(crate) fn write_random_weights(
    path: &Path,
    weights: impl IntoIterator<Item = RandomWeight>,
    dense: safetensors::Dtype,
    comfy_prefix: Option<&str>,
    seed: u64,
) -> anyhow::Result<u64> {
    let mut views: Vec<(String, SynthTensor)> = Vec::new();
    for (i, w) in weights.into_iter().enumerate() {
        let key = match comfy_prefix {
            Some(prefix) => format!("{prefix}{}", w.name),
            None => w.name.clone(),
        };
        if let (Some(scale), Some(prefix)) = (w.fp8_scale, comfy_prefix) {
            let module = w.name.trim_end_matches(".weight");
            views.push((
                format!("{prefix}{module}.scale_weight"),
                SynthTensor::scale(scale),
            ));
        }
        let tensor = RandomTensor {
            shape: w.shape,
            dtype: if w.fp8_scale.is_some() {
                safetensors::Dtype::F8_E4M3
            } else {
                dense
            },
            mean: w.mean,
            std: w.std,
            seed: mix(seed, i as u64),
            fp8_scale: w.fp8_scale,
        };
        views.push((key, SynthTensor::Random(tensor)));
    }
    if comfy_prefix.is_some() {
        views.push(("scaled_fp8".into(), SynthTensor::scaled_fp8_marker()));
    }
    write_safetensors(path, views)?;
    Ok(fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len())
}

/// Mean and standard deviation of a random encoder tensor: norms one, biases zero, the token embedding unit
/// normal, weights `1/sqrt(fan_in)`.
pub(crate) fn encoder_init(name: &str, shape: &[usize]) -> (f32, f32) {
    if name.ends_with("gamma") || name.contains("norm") {
        (1.0, 0.0)
    } else if name.ends_with("bias") {
        (0.0, 0.0)
    } else if name == "shared.weight" {
        (0.0, 1.0)
    } else {
        let fan_in: usize = shape.iter().skip(1).product();
        (0.0, 1.0 / (fan_in.max(1) as f32).sqrt())
    }
}

/// Writes random `weights` (dense, under their own names) to `path` with `metadata` beside `format = pt`; returns
/// the file size.
pub(crate) fn write_random_weights_with_metadata(
    path: &Path,
    weights: impl IntoIterator<Item = RandomWeight>,
    dense: safetensors::Dtype,
    seed: u64,
    metadata: HashMap<String, String>,
) -> anyhow::Result<u64> {
    let views = weights
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let tensor = RandomTensor {
                shape: w.shape,
                dtype: dense,
                mean: w.mean,
                std: w.std,
                seed: mix(seed, i as u64),
                fp8_scale: None,
            };
            (w.name, SynthTensor::Random(tensor))
        })
        .collect();
    write_safetensors_with(path, views, metadata)?;
    Ok(fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len())
}

/// Writes `views` as a safetensors file, under another name first: an interrupted write never leaves a file that
/// looks complete.
pub(crate) fn write_safetensors(
    path: &Path,
    views: Vec<(String, SynthTensor)>,
) -> anyhow::Result<()> {
    write_safetensors_with(path, views, HashMap::new())
}

/// [`write_safetensors`] with `metadata` beside `format = pt`.
fn write_safetensors_with(
    path: &Path,
    views: Vec<(String, SynthTensor)>,
    mut metadata: HashMap<String, String>,
) -> anyhow::Result<()> {
    let partial = path.with_extension("safetensors.partial");
    metadata.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(metadata), &partial)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, path).with_context(|| format!("cannot rename to {}", path.display()))
}

/// The largest finite `float8_e4m3fn` magnitude.
pub(crate) const FP8_MAX: f32 = 448.0;

/// A tensor of the synthetic file: random values drawn when written, or a few given bytes.
pub(crate) enum SynthTensor {
    Random(RandomTensor),
    Bytes {
        dtype: safetensors::Dtype,
        shape: Vec<usize>,
        data: Vec<u8>,
    },
}

impl SynthTensor {
    /// A per-tensor FP8 scale: one f32.
    pub(crate) fn scale(scale: f32) -> Self {
        Self::Bytes {
            dtype: safetensors::Dtype::F32,
            shape: Vec::new(),
            data: scale.to_le_bytes().to_vec(),
        }
    }

    /// ComfyUI's `scaled_fp8` marker: an empty `float8_e4m3fn` tensor.
    pub(crate) fn scaled_fp8_marker() -> Self {
        Self::Bytes {
            dtype: safetensors::Dtype::F8_E4M3,
            shape: vec![0],
            data: Vec::new(),
        }
    }
}

impl View for SynthTensor {
    fn dtype(&self) -> safetensors::Dtype {
        match self {
            Self::Random(t) => t.dtype(),
            Self::Bytes { dtype, .. } => *dtype,
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            Self::Random(t) => t.shape(),
            Self::Bytes { shape, .. } => shape,
        }
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self {
            Self::Random(t) => t.data(),
            Self::Bytes { data, .. } => Cow::Borrowed(data),
        }
    }

    fn data_len(&self) -> usize {
        match self {
            Self::Random(t) => t.data_len(),
            Self::Bytes { data, .. } => data.len(),
        }
    }
}

/// A tensor whose values are drawn only when the writer asks for its bytes.
pub(crate) struct RandomTensor {
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: safetensors::Dtype,
    pub(crate) mean: f32,
    pub(crate) std: f32,
    pub(crate) seed: u64,
    /// For `F8_E4M3`: values are stored as `e4m3(value / scale)`.
    pub(crate) fp8_scale: Option<f32>,
}

impl View for RandomTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let size = self.dtype.bitsize() / 8;
        let mut bytes = vec![0u8; self.data_len()];
        bytes
            .par_chunks_mut(CHUNK_ELEMS * size)
            .enumerate()
            .for_each(|(i, chunk)| {
                let mut rng = StdRng::seed_from_u64(mix(self.seed, i as u64));
                for out in chunk.chunks_exact_mut(size) {
                    let z: f32 = StandardNormal.sample(&mut rng);
                    let value = self.mean + self.std * z;
                    match self.fp8_scale {
                        Some(scale) => out[0] = e4m3_encode(value / scale),
                        None => encode(value, self.dtype, out),
                    }
                }
            });
        Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Little-endian bytes of `value` in `dtype` (f32, f16 or bf16).
fn encode(value: f32, dtype: safetensors::Dtype, out: &mut [u8]) {
    match dtype {
        safetensors::Dtype::BF16 => out.copy_from_slice(&half::bf16::from_f32(value).to_le_bytes()),
        safetensors::Dtype::F16 => out.copy_from_slice(&half::f16::from_f32(value).to_le_bytes()),
        _ => out.copy_from_slice(&value.to_le_bytes()),
    }
}

/// A seed for stream `index` of `seed` (splitmix64), so neighbouring tensors and chunks do not share draws.
pub(crate) fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
